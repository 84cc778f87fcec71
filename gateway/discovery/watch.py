"""One label selector's pods, kept current: list, then watch from the list's resourceVersion.

The loop, as Kubernetes' own informers run it: list (in pages) into the cache, then watch from the list's
version; each event moves the cache and its version (bookmarks move the version alone, so a quiet selector
resumes from a recent version, not the list's). When the server ends a watch (timeoutSeconds) it is resumed
from the last version; a 410 (the version was compacted away) lists again at once; anything else (the
server unreachable, a dropped connection, 401/403) lists again after a growing, jittered wait, and the
cache is kept meanwhile: engines are not dropped because the API server is.

``live`` says whether the cache is trustworthy now: listed, and the last list or watch did not fail since.
Writers to the cluster's document act only while it is (reconcile.py).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import httpx2
import trio

from .config import DiscoveryConfig, Selector, selector_text
from .kube_api import OPENED, KubeApi, KubeApiError, ResourceGone
from .pods import PodCache

log = logging.getLogger("gateway.discovery")


class PodWatcher:
    def __init__(self, api: KubeApi, selector: Selector, config: DiscoveryConfig, namespace: str | None,
                 on_change: Callable[[], None], rng: random.Random | None = None) -> None:
        self.api = api
        self.selector = selector
        self.config = config
        self.namespace = namespace
        self.cache = PodCache(config.pod_keys_read())
        self.on_change = on_change
        self.rng = rng or random.Random()
        self.live = False
        self._backoff_s = config.backoff_first_s
        # Counted for /metrics: lists (relists after a 410 among them), watches begun, failures, events.
        self.lists = 0
        self.relists_gone = 0
        self.watches = 0
        self.failures = 0
        self.events = 0

    @property
    def where(self) -> str:
        return f"pods {selector_text(self.selector)!r} in " + (f"namespace {self.namespace}" if self.namespace
                                                              else "every namespace")

    async def run(self) -> None:
        self._backoff_s = self.config.backoff_first_s
        while True:
            # Listed (a continue token that expired between pages, 410, lists again at once), then watched from
            # the cache's version for as long as the server keeps it: a watch the server ends (its timeoutSeconds)
            # is resumed from the last version seen, which bookmarks keep recent. One that fails (the connection
            # dropped, the server refused it) lists again after the backoff, as client-go's reflector does: until
            # then the cache may miss events, and a node must not write from it.
            try:
                await self._list()
                while True:
                    await self._watch()
            except ResourceGone as e:
                self.relists_gone += 1
                log.info("%s: %s; listing again", self.where, e)
            except (KubeApiError, httpx2.HTTPError, OSError) as e:
                await self._failed(e)

    async def _failed(self, error: BaseException) -> None:
        self.failures += 1
        self._set_live(False)
        wait_s = self._backoff_s * (0.5 + self.rng.random())  # jitter: the nodes do not come back in step
        log.warning("%s: %s; trying again in %.1f s (the engines found so far stay)", self.where, _describe(error),
                    wait_s)
        await trio.sleep(wait_s)
        self._backoff_s = min(self._backoff_s * 2, self.config.backoff_max_s)

    async def _list(self) -> None:
        items, version, token = [], "", ""
        while True:
            page, version, token = await self.api.list_pods(self.namespace, self.selector,
                                                            self.config.list_page_size, token)
            items.extend(page)
            if not token:
                break
        self.lists += 1
        self._backoff_s = self.config.backoff_first_s
        changed = self.cache.replace(items, version)
        log.info("%s: listed %d at resourceVersion %s", self.where, len(self.cache.pods), version)
        self._set_live(True, changed)

    async def _watch(self) -> None:
        self.watches += 1
        async for kind, obj in self.api.watch_pods(self.namespace, self.selector, self.cache.resource_version,
                                                   self.config.watch_timeout_s):
            if kind == OPENED:  # the server took the watch (from a version this cache holds everything up to)
                self._backoff_s = self.config.backoff_first_s
                self._set_live(True)
                continue
            self.events += 1
            if self.cache.apply(kind, obj):
                self.on_change()
            self._set_live(True)

    def _set_live(self, live: bool, changed: bool = False) -> None:
        if live != self.live or changed:
            self.live = live
            self.on_change()


def _describe(error: BaseException) -> str:
    """What went wrong, in words: HTTP clients raise connection errors with no text of their own, the reason
    (a certificate refused, a connection reset) being in the exception they were raised from."""
    seen: BaseException | None = error
    while seen is not None:
        if str(seen):
            return f"{type(error).__name__}: {seen}" if seen is not error else str(seen)
        seen = seen.__cause__ or seen.__context__
    return type(error).__name__

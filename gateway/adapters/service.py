"""The node's LoRA adapters: the cluster's definitions, which worker holds which, and the loads and unloads.

    resolve(model)     the adapter a request's model names: its own name, or "base:adapter"
    candidates(...)    the workers a request for an adapter may go to (placement.py), for the router
    ready(worker, ..)  ``async with``: the adapter loaded on the worker (room made first) for one attempt, and held
                       (never unloaded while a request uses it)
    define / remove    an operator's change, replicated to every node (the cluster's document, kept on disk)
    load_everywhere    an adapter loaded now on every worker of its base that loads adapters

Which worker holds which adapter is the engine's own word: its answers to loads and unloads (each says every id it
holds after it), and ListLoadedLoRAAdapters, which the node that owns a worker's health checks asks every
``poll_interval_s`` and publishes in the cluster's document (``adapters_on:<worker id>``), where every other node
reads it. A node that loads an adapter knows at once; the others within a poll (until then they may load it again:
the engine answers that it holds it).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import trio

from ..base.errors import NoCapacity, NotKnown
from ..base.options import Option
from ..engine.errors import EngineCallError
from ..observe.metrics import counter, gauge
from .placement import candidates_for, eviction
from .spec import ADAPTERS_MAX, SETTING_PREFIX, AdapterInvalid, AdapterSpec, spec_of_setting

log = logging.getLogger("gateway.adapters")

HOLDINGS_PREFIX = "adapters_on:"  # a worker's adapters as its health owner last listed them


@dataclasses.dataclass(frozen=True)
class AdapterConfig:
    # Adapters a worker holds at once: SGLang's max_loras_per_batch default (its GPU slots).
    per_worker: int = 8
    # Loading reads the weights from disk: a large adapter on network storage takes seconds.
    load_timeout_s: float = 120.0
    # How often the owner of a worker's health checks lists its adapters (an engine restarted, an operator's
    # load outside the gateway).
    poll_interval_s: float = 10.0


OPTIONS = (
    Option("--max-adapters-per-worker", "adapters.per_worker", int, "LoRA adapters one worker holds at once (the "
           "one used longest ago is unloaded to load another)", "engines"),
    Option("--adapter-load-timeout-secs", "adapters.load_timeout_s", float, "how long loading an adapter on a "
           "worker may take", "engines"),
    Option("--adapter-poll-interval-secs", "adapters.poll_interval_s", float, "how often the node that checks a "
           "worker's health lists its adapters for the cluster", "engines"),
)


class AdapterUnavailable(NoCapacity):
    """No worker could load the adapter now (its engines refused it, or every slot is pinned or in use)."""


class AdapterService:
    def __init__(self, config: AdapterConfig, settings: Any, registry: Any, cluster: Any) -> None:
        self.config = config
        self._settings = settings
        self._registry = registry
        self._cluster = cluster
        self.specs: dict[str, AdapterSpec] = {}
        self._last_used: dict[tuple[str, str], float] = {}  # (worker id, adapter id) -> when last asked for
        self._in_use: collections.Counter[tuple[str, str]] = collections.Counter()
        self._locks: dict[str, trio.Lock] = collections.defaultdict(trio.Lock)  # one load or unload a worker
        self._published: dict[str, frozenset[str]] = {}
        self.counts: collections.Counter[str] = collections.Counter()  # loads, unloads, load failures
        self.refused_settings = 0
        settings.follow_settings(self._on_setting)

    # -- definitions ------------------------------------------------------------------------------------------

    def _on_setting(self, name: str, value: Any) -> None:
        if name.startswith(SETTING_PREFIX):
            adapter = name[len(SETTING_PREFIX):]
            if value is None:
                self.specs.pop(adapter, None)
                return
            try:
                self.specs[adapter] = spec_of_setting(adapter, value)
            except AdapterInvalid as e:
                self.refused_settings += 1
                log.warning("adapter setting refused: %s", e)
        elif name.startswith(HOLDINGS_PREFIX):
            worker = self._registry.get(name[len(HOLDINGS_PREFIX):])
            if worker is not None and isinstance(value, list) and all(isinstance(a, str) for a in value):
                worker.adapters = frozenset(value)

    def define(self, spec: AdapterSpec) -> AdapterSpec | None:
        """An operator's definition, on every node; the one it replaces (the same name), if any, to unload."""
        if spec.name not in self.specs and len(self.specs) >= ADAPTERS_MAX:
            raise AdapterInvalid(f"the cluster holds {ADAPTERS_MAX} adapters: remove one first")
        replaced = self.specs.get(spec.name)
        self.specs[spec.name] = spec
        self._settings.set_setting(SETTING_PREFIX + spec.name, spec.to_setting())
        log.info("adapter %s defined: base %s, path %s%s", spec.name, spec.base, spec.path,
                 " (pinned)" if spec.pinned else "")
        return replaced

    def remove(self, name: str) -> AdapterSpec:
        spec = self.specs.pop(name, None)
        if spec is None:
            raise NotKnown(f"no adapter {name!r}", code="adapter_not_found")
        self._settings.set_setting(SETTING_PREFIX + name, None)
        log.info("adapter %s removed", name)
        return spec

    def resolve(self, model: str) -> AdapterSpec | None:
        """The adapter ``model`` names: an adapter's own name, or "base:adapter" (as vLLM and SGLang users write it)."""
        spec = self.specs.get(model)
        if spec is not None:
            return spec
        base, colon, name = model.rpartition(":")
        if colon:
            spec = self.specs.get(name)
            if spec is not None and spec.base == base:
                return spec
        return None

    # -- routing ----------------------------------------------------------------------------------------------

    def candidates(self, workers: "Sequence[Any]", spec: AdapterSpec) -> "list[Any]":
        chosen = candidates_for(workers, spec.adapter_id)
        if not chosen and workers:
            raise AdapterUnavailable(f"no worker of model {spec.base!r} loads adapters (adapter {spec.name!r}): "
                                     "its engines' kind cannot take one", code="adapters_not_supported")
        return chosen

    @contextlib.asynccontextmanager
    async def ready(self, worker: Any, spec: AdapterSpec) -> AsyncIterator[None]:
        """The adapter loaded on ``worker`` and held there while the block runs (one attempt)."""
        key = (worker.id, spec.adapter_id)
        self._in_use[key] += 1
        try:
            self._last_used[key] = trio.current_time()
            if spec.adapter_id not in worker.adapters:
                await self._load(worker, spec)
            yield
        finally:
            self._in_use[key] -= 1
            if not self._in_use[key]:
                del self._in_use[key]

    async def _load(self, worker: Any, spec: AdapterSpec) -> None:
        async with self._locks[worker.id]:
            if spec.adapter_id in worker.adapters:
                return  # loaded meanwhile
            keep = {a for a in worker.adapters if (worker.id, a) in self._in_use or self._pinned(a)}
            victim = eviction(worker.adapters, self.config.per_worker, keep,
                              {a: t for (w, a), t in self._last_used.items() if w == worker.id})
            if victim is False:
                raise AdapterUnavailable(f"worker {worker.id} holds {len(worker.adapters)} adapters, each pinned or "
                                         f"in use: adapter {spec.name!r} waits for a slot", code="adapter_slots_full",
                                         retry_after_s=1)
            timeout_s = self.config.load_timeout_s
            try:
                if victim is not None:
                    worker.adapters = await worker.client.unload_adapter(self._name_of(victim), victim, timeout_s)
                    self.counts["unloads"] += 1
                    self._last_used.pop((worker.id, victim), None)
                    log.info("adapter %s unloaded from %s to make room", victim, worker.id)
                worker.adapters = await worker.client.load_adapter(spec.name, spec.path, spec.pinned,
                                                                   spec.adapter_id, timeout_s)
            except EngineCallError as e:
                self.counts["load_failures"] += 1
                log.warning("adapter %s could not be loaded on %s: %s", spec.name, worker.id, e)
                raise AdapterUnavailable(f"adapter {spec.name!r} could not be loaded on worker {worker.id} ({e.code}; "
                                         "the engine's reason is in the gateway's log)", code="adapter_load_failed",
                                         retry_after_s=5) from None
            self.counts["loads"] += 1
            log.info("adapter %s loaded on %s", spec.name, worker.id)

    def _pinned(self, adapter_id: str) -> bool:
        return any(s.pinned for s in self.specs.values() if s.adapter_id == adapter_id)

    def _name_of(self, adapter_id: str) -> str:
        return next((s.name for s in self.specs.values() if s.adapter_id == adapter_id), adapter_id)

    # -- an operator's loads and unloads ----------------------------------------------------------------------

    def workers_of(self, spec: AdapterSpec) -> "list[Any]":
        return [w for w in self._registry.all() if spec.base in w.models and not w.draining
                and getattr(w.client, "takes_adapters", False)]

    async def load_everywhere(self, spec: AdapterSpec) -> dict[str, str]:
        """The adapter loaded on every worker of its base that loads adapters: each worker's outcome."""
        outcomes: dict[str, str] = {}

        async def one(worker: Any) -> None:
            try:
                async with self.ready(worker, spec):
                    outcomes[worker.id] = "loaded"
            except AdapterUnavailable as e:
                outcomes[worker.id] = e.message

        async with trio.open_nursery() as nursery:
            for worker in self.workers_of(spec):
                nursery.start_soon(one, worker)
        return outcomes

    async def unload_everywhere(self, spec: AdapterSpec) -> dict[str, str]:
        """The adapter unloaded from every worker that holds it (a removed or redefined adapter)."""
        outcomes: dict[str, str] = {}

        async def one(worker: Any) -> None:
            async with self._locks[worker.id]:
                try:
                    worker.adapters = await worker.client.unload_adapter(spec.name, spec.adapter_id,
                                                                         self.config.load_timeout_s)
                    self.counts["unloads"] += 1
                    outcomes[worker.id] = "unloaded"
                except EngineCallError as e:
                    outcomes[worker.id] = f"not unloaded ({e.code})"

        async with trio.open_nursery() as nursery:
            for worker in self._registry.all():
                if spec.adapter_id in worker.adapters:
                    nursery.start_soon(one, worker)
        return outcomes

    def describe(self) -> list[dict[str, Any]]:
        workers = self._registry.all()
        return [{"name": s.name, "base": s.base, "path": s.path, "pinned": s.pinned, "id": s.adapter_id,
                 "loaded_on": sorted(w.id for w in workers if s.adapter_id in w.adapters)}
                for s in sorted(self.specs.values(), key=lambda s: s.name)]

    # -- the engines' word ------------------------------------------------------------------------------------

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """List the adapters of the workers this node checks, every poll interval, and publish what changed."""
        task_status.started()
        while True:
            await trio.sleep(self.config.poll_interval_s)
            if not self.specs:
                continue  # no adapter defined: nothing to route by (an engine's preloaded ones are not named here)
            for worker in self._registry.all():
                if getattr(worker.client, "takes_adapters", False) and worker.healthy and self._owns(worker):
                    await self._poll(worker)

    def _owns(self, worker: Any) -> bool:
        return self._cluster is None or self._cluster.owns(worker.id)

    async def _poll(self, worker: Any) -> None:
        try:
            loaded = await worker.client.list_adapters(self.config.load_timeout_s)
        except EngineCallError as e:
            log.debug("listing the adapters of %s failed: %s", worker.id, e)
            return
        worker.adapters = loaded
        if self._cluster is not None and self._published.get(worker.id) != loaded:
            self._published[worker.id] = loaded
            self._settings.set_setting(HOLDINGS_PREFIX + worker.id, sorted(loaded))

    def metric_families(self) -> Iterator[Any]:
        yield gauge("smg_adapters_defined", "LoRA adapters the cluster defines", [], [([], float(len(self.specs)))])
        yield gauge("smg_adapters_loaded", "LoRA adapters loaded per worker, as last known", ["worker"],
                    [([w.id], float(len(w.adapters))) for w in self._registry.all()
                     if getattr(w.client, "takes_adapters", False)])
        yield counter("smg_adapter_operations", "Adapter loads, unloads and failed loads by this node", ["kind"],
                      [([kind], float(self.counts[kind])) for kind in ("loads", "unloads", "load_failures")])

"""The response cache the cluster shares: each answer held by its key's owners on the ring, asked by any node.

``lookup`` asks the key's first owner (this node: no message), then the second if the first cannot answer within
``peer_timeout_s``: an owner that is gone costs one timeout and a miss, never an error. ``keep`` puts a new answer
on the key's owners (the first and ``replicas`` more, one per machine), in the background: the request it came
from has already been answered. A node whose ring changed asks the new owners; the answers the old ones held are
simply not found there until they are made again (a cache may forget).

Frames: ``b"C"`` then one byte for the method, then msgpack. ``G``: ``[key, partition]`` -> ``[]`` (a miss) or
``[content_type, body, streamed, usage, ttl_left_s]``; ``P``: ``[key, partition, content_type, body, streamed,
usage, ttl_s]`` -> ``b"k"``. A peer's frame is checked field by field and bounded by the store's own bounds.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import trio

from mesh import PeerUnreachable

from ..base import packing
from ..base.options import Option
from ..observe.metrics import counter, gauge
from .store import AnswerStore, Entry

log = logging.getLogger("gateway.cache")

CACHE_MARK = b"C"
METHOD_GET = b"G"
METHOD_PUT = b"P"
KEY_CHARS_MAX = 128
PARTITION_CHARS_MAX = 300
TTL_S_MAX = 30 * 86_400.0


class BadFrame(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    # Off unless asked: an answer served again is a choice the operator makes for its users.
    enabled: bool = False
    # How long an answer is served again (a route's cache_ttl_secs overrides it for its model).
    ttl_s: float = 3600.0
    # What one node holds, of every partition; and of one tenant (or key without a tenant): one tenant filling
    # the cache evicts its own oldest answers, not the others'.
    bytes_max: int = 256 * 1024 * 1024
    partition_bytes_max: int = 64 * 1024 * 1024
    # An answer larger than this is not kept (a long stream with logprobs): answered, never stored.
    entry_bytes_max: int = 4 * 1024 * 1024
    # Copies beyond the first owner, as for stored conversations: one node lost loses no answer.
    replicas: int = 1
    # An owner that does not answer a lookup within this is passed over (the next owner, else a miss).
    peer_timeout_s: float = 0.25
    # A hit costs nothing ("free"), or every token of the answer at the target's cached-input price ("cached").
    hit_price: str = "free"


class ResponseCache:
    def __init__(self, config: CacheConfig, cluster: Any = None, clock: Any = time.time) -> None:
        self.config = config
        self.cluster = cluster
        self.clock = clock  # wall time: TTLs travel between nodes as seconds left
        self.store = AnswerStore(config.bytes_max, config.partition_bytes_max)
        self.outcomes: dict[tuple[str, str, str], int] = {}  # (model, tenant, outcome) -> requests
        self.peer_failures = 0
        self.bad_frames = 0
        self._nursery: trio.Nursery | None = None
        if cluster is not None:
            cluster.serve_requests(CACHE_MARK, self.on_peer_request)

    def count(self, model: str, tenant: str | None, outcome: str) -> None:
        key = (model, tenant or "", outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    def _owners(self, key: str) -> list[str]:
        if self.cluster is None:
            return ["local"]
        owners = self.cluster.owners(key, 1 + self.config.replicas)
        return owners or [self.cluster.node_name]

    def _local(self, name: str) -> bool:
        return self.cluster is None or name == self.cluster.node_name

    async def lookup(self, key: str, partition: str) -> Entry | None:
        for owner in self._owners(key)[:2]:
            if self._local(owner):
                entry = self.store.get(key, partition, self.clock())
                if entry is not None:
                    return entry
                continue
            try:
                answer = await self.cluster.request_peer(owner, CACHE_MARK + METHOD_GET + packing.pack(
                    [key, partition]), self.config.peer_timeout_s)
                return self._entry_from(answer, partition)
            except PeerUnreachable:
                self.peer_failures += 1  # the next owner, else a miss
            except BadFrame as e:
                self.bad_frames += 1
                log.debug("an owner's cache answer dropped: %s", e)
                return None
        return None

    def _entry_from(self, answer: bytes, partition: str) -> Entry | None:
        value = packing.unpack(answer, BadFrame)
        if value == []:
            return None
        content_type, body, streamed, usage, ttl_left_s = _checked_entry(value)
        return Entry(partition, content_type, body, streamed, usage, self.clock() + ttl_left_s)

    def keep(self, key: str, entry: Entry) -> None:
        """Put ``entry`` on the key's owners, in the background."""
        if len(entry.body) > self.config.entry_bytes_max:
            self.store.stats.refused_large += 1
            return
        for owner in self._owners(key):
            if self._local(owner):
                self.store.put(key, entry, self.clock())
            elif self._nursery is not None:
                self._nursery.start_soon(self._put_on, owner, key, entry)

    async def _put_on(self, owner: str, key: str, entry: Entry) -> None:
        ttl_left = max(0.0, entry.expires_at_s - self.clock())
        frame = CACHE_MARK + METHOD_PUT + packing.pack([key, entry.partition, entry.content_type, entry.body,
                                                        entry.streamed, list(entry.usage), ttl_left])
        try:
            await self.cluster.request_peer(owner, frame, max(1.0, self.config.peer_timeout_s * 4))
        except PeerUnreachable:
            self.peer_failures += 1

    async def on_peer_request(self, payload: bytes) -> bytes:
        method, body = payload[:1], payload[1:]
        try:
            value = packing.unpack(body, BadFrame)
            if method == METHOD_GET:
                if not isinstance(value, list) or len(value) != 2:
                    raise BadFrame("a lookup is [key, partition]")
                key, partition = _checked_names(*value)
                entry = self.store.get(key, partition, self.clock())
                if entry is None:
                    return packing.pack([])
                return packing.pack([entry.content_type, entry.body, entry.streamed, list(entry.usage),
                                     max(0.0, entry.expires_at_s - self.clock())])
            if method == METHOD_PUT:
                if not isinstance(value, list) or len(value) != 7:
                    raise BadFrame("a put is [key, partition, content_type, body, streamed, usage, ttl_s]")
                key, partition = _checked_names(value[0], value[1])
                content_type, body_bytes, streamed, usage, ttl_s = _checked_entry(value[2:])
                if len(body_bytes) > self.config.entry_bytes_max:
                    raise BadFrame("an entry larger than this node keeps")
                self.store.put(key, Entry(partition, content_type, body_bytes, streamed, usage,
                                          self.clock() + min(ttl_s, self.config.ttl_s)), self.clock())
                return b"k"
            raise BadFrame(f"unknown method {method!r}")
        except BadFrame as e:
            self.bad_frames += 1
            log.debug("dropped a peer's cache frame: %s", e)
            return b""

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(60)
                self.store.drop_expired(self.clock())

    def metric_families(self) -> Iterator[Any]:
        yield counter("smg_cache_requests", "Cacheable requests by model, tenant and outcome (hit, miss, stored)",
                      ["model", "tenant", "outcome"], [(list(k), v) for k, v in self.outcomes.items()])
        stats = self.store.stats
        yield counter("smg_cache_store_events", "The response cache's store on this node", ["event"],
                      [(["stored"], stats.stored), (["evicted"], stats.evicted_bytes), (["expired"], stats.expired),
                       (["too_large"], stats.refused_large), (["kept_first"], stats.kept_first),
                       (["peer_failure"], self.peer_failures),
                       (["bad_frame"], self.bad_frames)])
        yield gauge("smg_cache_bytes", "Bytes of answers this node holds for the response cache", [],
                    [([], self.store.bytes)])
        yield gauge("smg_cache_entries", "Answers this node holds for the response cache", [], [([], len(self.store))])


def _checked_names(key: Any, partition: Any) -> tuple[str, str]:
    if not (isinstance(key, str) and 0 < len(key) <= KEY_CHARS_MAX and isinstance(partition, str)
            and 0 < len(partition) <= PARTITION_CHARS_MAX):
        raise BadFrame("a key and a partition are short strings")
    return key, partition


def _checked_entry(value: Any) -> tuple[bytes, bytes, bool, tuple[int, int, int, int], float]:
    if not isinstance(value, list) or len(value) != 5:
        raise BadFrame("an entry is [content_type, body, streamed, usage, ttl_s]")
    content_type, body, streamed, usage, ttl_s = value
    if not (isinstance(content_type, bytes) and len(content_type) <= 256 and isinstance(body, bytes)
            and isinstance(streamed, bool)):
        raise BadFrame("an entry's content type and body are bytes, streamed a boolean")
    if not (isinstance(usage, list) and len(usage) == 4 and all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2 ** 40 for n in usage)):
        raise BadFrame("an entry's usage is four counts")
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not 0 <= ttl_s <= TTL_S_MAX:
        raise BadFrame("an entry's TTL is seconds")
    return content_type, body, streamed, tuple(usage), float(ttl_s)  # type: ignore[return-value]


OPTIONS = (
    Option("--response-cache", "cache.enabled", "bool", "answer repeated deterministic requests (temperature 0 or "
           "a seed, or \"cache\": true) from a cache the cluster shares", "spend"),
    Option("--response-cache-ttl-secs", "cache.ttl_s", float, "how long an answer is served again", "spend"),
    Option("--response-cache-bytes", "cache.bytes_max", int, "bytes of answers one node holds", "spend"),
    Option("--response-cache-tenant-bytes", "cache.partition_bytes_max", int, "bytes of one tenant's answers one "
           "node holds", "spend"),
    Option("--response-cache-hit-price", "cache.hit_price", str, "what a hit costs: free, or cached (every token at "
           "the cached-input price)", "spend"),
)

"""The answers a node holds for the response cache: bounded in bytes per node and per tenant, each with a TTL.
No I/O, no clock of its own (``now_s`` is given).

The least recently used entry goes first when a bound is reached: the node's (``bytes_max``) over all entries,
a partition's (``partition_bytes_max``) over its own, so one tenant filling the cache evicts its own answers, not
the others'. An entry past its TTL is never served, and is dropped when met or when the bound needs room. A
key holds the first answer put for it until that answer expires.
"""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    partition: str  # the tenant (or key) it belongs to: only that partition's requests are answered with it
    content_type: bytes
    body: bytes  # the whole answer, or a stream's events as they were sent
    streamed: bool
    usage: tuple[int, int, int, int]  # prompt, completion, cached, reasoning: what the answer that made it used
    expires_at_s: float

    @property
    def size(self) -> int:
        return len(self.body) + len(self.content_type) + 128  # the key and the record's own overhead


@dataclasses.dataclass
class StoreStats:
    stored: int = 0
    evicted_bytes: int = 0  # entries dropped for room (the node's bound or the partition's)
    expired: int = 0
    refused_large: int = 0  # an entry larger than a bound allows
    kept_first: int = 0  # a put on a key whose live answer was kept instead


class AnswerStore:
    def __init__(self, bytes_max: int, partition_bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.partition_bytes_max = partition_bytes_max
        self._entries: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self.bytes = 0
        self._partition_bytes: dict[str, int] = {}
        self.stats = StoreStats()

    def __len__(self) -> int:
        return len(self._entries)

    def partition_bytes(self, partition: str) -> int:
        return self._partition_bytes.get(partition, 0)

    def get(self, key: str, partition: str, now_s: float) -> Entry | None:
        entry = self._entries.get(key)
        if entry is None or entry.partition != partition:  # a key is per partition already: this is a second lock
            return None
        if entry.expires_at_s <= now_s:
            self._remove(key, entry)
            self.stats.expired += 1
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: Entry, now_s: float) -> bool:
        size = entry.size
        if size > self.bytes_max or size > self.partition_bytes_max:
            self.stats.refused_large += 1
            return False
        known = self._entries.get(key)
        if known is not None:
            if known.expires_at_s > now_s:
                # The first answer kept stays: two nodes that missed at once both put theirs, and every node must
                # serve the same one for the TTL (a later put would replace the answer some clients already got).
                self.stats.kept_first += 1
                return False
            self._remove(key, known)
        self._make_room(entry.partition, size, now_s)
        self._entries[key] = entry
        self.bytes += size
        self._partition_bytes[entry.partition] = self._partition_bytes.get(entry.partition, 0) + size
        self.stats.stored += 1
        return True

    def _make_room(self, partition: str, size: int, now_s: float) -> None:
        if self.partition_bytes(partition) + size > self.partition_bytes_max:
            for key, entry in list(self._entries.items()):  # its own oldest first
                if entry.partition == partition:
                    self._evict(key, entry, now_s)
                    if self.partition_bytes(partition) + size <= self.partition_bytes_max:
                        break
        while self.bytes + size > self.bytes_max and self._entries:
            key, entry = next(iter(self._entries.items()))
            self._evict(key, entry, now_s)

    def _evict(self, key: str, entry: Entry, now_s: float) -> None:
        self._remove(key, entry)
        if entry.expires_at_s <= now_s:
            self.stats.expired += 1
        else:
            self.stats.evicted_bytes += 1

    def _remove(self, key: str, entry: Entry) -> None:
        del self._entries[key]
        self.bytes -= entry.size
        left = self._partition_bytes[entry.partition] - entry.size
        if left:
            self._partition_bytes[entry.partition] = left
        else:
            del self._partition_bytes[entry.partition]

    def drop_expired(self, now_s: float) -> int:
        expired = [(k, e) for k, e in self._entries.items() if e.expires_at_s <= now_s]
        for key, entry in expired:
            self._remove(key, entry)
        self.stats.expired += len(expired)
        return len(expired)

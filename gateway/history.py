"""Stored responses (the Responses API's ``store``): kept so that ``previous_response_id``, ``GET`` and
``input_items`` find them, scoped to whoever created them.

This is the node-local memory backend: an LRU bounded by count and by bytes (each entry's size is
its JSON's), with a retention time, read and written without I/O (the clock is passed in). A
response stored here is found on the node that answered it; the cluster-wide store (owners on the
hash ring, replicated to the next two) and the Postgres and Redis backends build on this interface.

Scoping: every entry records its owner (the tenant, else the key, else "anonymous" on an open data
plane); any other owner is told it does not exist, as for an id never stored.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import orjson


@dataclasses.dataclass(frozen=True)
class HistoryConfig:
    # smg's defaults for its memory backend's bounds are per process as well; these keep a node's
    # share of memory bounded whatever clients store.
    max_responses: int = 10_000
    max_bytes: int = 256 * 1024 * 1024
    retention_s: float = 7 * 24 * 3600.0  # a week: long enough for agent sessions, then gone


@dataclasses.dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    owner: str
    response: dict[str, Any]  # the response object, as GET returns it
    input_items: tuple[dict[str, Any], ...]  # the request's input items, with ids (input_items endpoint)
    conversation: tuple[dict[str, Any], ...]  # what a follow-up's model sees before its own input
    stored_at: float
    size_bytes: int


class ResponseStore:
    def __init__(self, config: HistoryConfig = HistoryConfig()) -> None:
        self.config = config
        self._entries: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, owner: str, response: dict[str, Any], input_items: "list[dict[str, Any]]",
            conversation: "list[dict[str, Any]]", now: float) -> StoredResponse:
        size = len(orjson.dumps([response, input_items, conversation]))
        entry = StoredResponse(response_id, owner, response, tuple(input_items), tuple(conversation), now, size)
        self._drop(response_id)
        self._entries[response_id] = entry
        self._bytes += size
        self._evict(now)
        return entry

    def get(self, response_id: str, owner: str, now: float) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:
            return None
        if now - entry.stored_at > self.config.retention_s:
            self._drop(response_id)
            return None
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str, owner: str, now: float) -> bool:
        if self.get(response_id, owner, now) is None:
            return False
        self._drop(response_id)
        return True

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.size_bytes

    def _evict(self, now: float) -> None:
        config = self.config
        while self._entries and (len(self._entries) > config.max_responses or self._bytes > config.max_bytes):
            self._drop(next(iter(self._entries)))
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if now - oldest.stored_at <= config.retention_s:
                break
            self._drop(oldest.id)

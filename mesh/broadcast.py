"""The broadcast queue: what to piggyback on the next packets. No I/O.

Each broadcast is sent ``limit`` times (``retransmit_mult * ceil(log10(n + 1))``,
computed by the caller as the cluster grows), least-sent first and newest
first among equals, as many as fit in the packet. A newer broadcast about the
same member replaces the older one: only the latest news about a member is
worth bytes.

Items are kept in one bucket per transmit count, each ordered oldest to newest,
so filling a packet looks at the few items it takes rather than sorting the
whole queue (a node merging a 1,000-member state queues ~1,000 items at once).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools


@dataclasses.dataclass
class _Item:
    key: str | None
    payload: bytes  # an encoded message
    transmits: int
    order: int  # higher = newer


class BroadcastQueue:
    def __init__(self) -> None:
        # transmits -> {order: item}, insertion order = age (oldest first)
        self._levels: dict[int, "collections.OrderedDict[int, _Item]"] = collections.defaultdict(
            collections.OrderedDict)
        self._by_key: dict[str, _Item] = {}
        self._order = itertools.count()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def _remove(self, item: _Item) -> None:
        level = self._levels[item.transmits]
        del level[item.order]
        if not level:
            del self._levels[item.transmits]
        if item.key is not None and self._by_key.get(item.key) is item:
            del self._by_key[item.key]
        self._count -= 1

    def queue(self, payload: bytes, key: str | None = None) -> None:
        if key is not None and key in self._by_key:
            self._remove(self._by_key[key])
        item = _Item(key, payload, 0, next(self._order))
        self._levels[0][item.order] = item
        if key is not None:
            self._by_key[key] = item
        self._count += 1

    def take(self, budget_bytes: int, limit: int, per_message_overhead: int = 0) -> list[bytes]:
        """Broadcasts that fit in ``budget_bytes``; each counts one more transmit."""
        if not self._count or budget_bytes <= 0:
            return []
        chosen: list[_Item] = []
        spent = 0
        # Stop scanning once the room left cannot hold even a small item (sampled from the
        # first few): a full packet then costs the items it takes, not the queue's length.
        smallest = min(len(i.payload) for i in itertools.islice(
            (i for level in self._levels.values() for i in level.values()), 64)) + per_message_overhead
        for transmits in sorted(self._levels):
            for item in reversed(self._levels[transmits].values()):  # newest first
                size = len(item.payload) + per_message_overhead
                if spent + size <= budget_bytes:
                    chosen.append(item)
                    spent += size
                if budget_bytes - spent < smallest:
                    break
            if budget_bytes - spent < smallest:
                break
        for item in chosen:
            self._remove(item)
            item.transmits += 1
            if item.transmits < limit:
                self._levels[item.transmits][item.order] = item
                if item.key is not None:
                    self._by_key[item.key] = item
                self._count += 1
        return [item.payload for item in chosen]

    def prune(self, keep_max: int) -> None:
        """Drop the most-sent (then oldest) items beyond keep_max: bounds memory when n is huge."""
        for transmits in sorted(self._levels, reverse=True):
            while self._count > keep_max and transmits in self._levels:
                self._remove(next(iter(self._levels[transmits].values())))
            if self._count <= keep_max:
                return

"""The broadcast queue: what to piggyback on the next packets. No I/O.

Each broadcast is sent ``limit`` times (``retransmit_mult * ceil(log10(n + 1))``,
computed by the caller as the cluster grows), least-sent first and newest
first among equals, as many as fit in the packet. A newer broadcast about the
same member replaces the older one: only the latest news about a member is
worth bytes.
"""

from __future__ import annotations

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
        self._items: list[_Item] = []
        self._by_key: dict[str, _Item] = {}
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._items)

    def queue(self, payload: bytes, key: str | None = None) -> None:
        if key is not None:
            old = self._by_key.pop(key, None)
            if old is not None:
                self._items.remove(old)
        item = _Item(key, payload, 0, next(self._order))
        self._items.append(item)
        if key is not None:
            self._by_key[key] = item

    def take(self, budget_bytes: int, limit: int, per_message_overhead: int = 0) -> list[bytes]:
        """Broadcasts that fit in ``budget_bytes``; each counts one more transmit."""
        if not self._items or budget_bytes <= 0:
            return []
        chosen: list[bytes] = []
        spent = 0
        for item in sorted(self._items, key=lambda i: (i.transmits, -i.order)):
            size = len(item.payload) + per_message_overhead
            if spent + size > budget_bytes:
                continue
            chosen.append(item.payload)
            spent += size
            item.transmits += 1
        self._items = [i for i in self._items if i.transmits < limit]
        self._by_key = {k: i for k, i in self._by_key.items() if i.transmits < limit}
        return chosen

    def prune(self, keep_max: int) -> None:
        """Drop the most-sent items beyond keep_max (bounds memory when n is huge)."""
        if len(self._items) <= keep_max:
            return
        self._items.sort(key=lambda i: (i.transmits, -i.order))
        for item in self._items[keep_max:]:
            if item.key is not None:
                self._by_key.pop(item.key, None)
        del self._items[keep_max:]

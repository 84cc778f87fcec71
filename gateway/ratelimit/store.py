"""The rate-limit states a node holds: keys it owns and copies of keys it replicates. No I/O.

Bounded: beyond ``keys_max`` entries the least recently used is forgotten.
An idle key (back to its full allowance) loses nothing when forgotten; a busy
one would restart from zero, so that is counted (``evicted_busy``) and shows
in the metrics as a sign that ``keys_max`` is too small.

``dirty`` marks entries to send at the next replication round: changed by a
decision, or (after a ring change) possibly held by the wrong nodes.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

from .algorithms import Decision, KeyState, Mode, Rate, decide, is_idle, merge_max


@dataclasses.dataclass
class Entry:
    rate: Rate
    state: KeyState
    dirty: bool = False


class KeyStore:
    def __init__(self, keys_max: int, on_first_entry: Callable[[], None] | None = None,
                 replicated: bool = True) -> None:
        self.keys_max = keys_max
        # A store whose keys are never sent to peers (a node's own shares, a node without a
        # cluster) marks nothing dirty: a mark nobody takes would keep forget_idle from
        # dropping the key.
        self.replicated = replicated
        # Called when an empty store gets an entry: the limiter's background loop sleeps
        # while every store is empty and is woken by it.
        self.on_first_entry = on_first_entry
        self._entries: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self.evicted_idle = 0
        self.evicted_busy = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def keys(self) -> list[str]:
        return list(self._entries)

    def _entry(self, key: str, rate: Rate, now: float) -> Entry:
        entry = self._entries.get(key)
        if entry is None:
            if not self._entries and self.on_first_entry is not None:
                self.on_first_entry()
            entry = self._entries[key] = Entry(rate, KeyState(tat_s=now))
            self._bound(now)
        else:
            self._entries.move_to_end(key)
            if entry.rate is not rate and entry.rate != rate:
                if entry.rate.algorithm is not rate.algorithm:
                    entry.state = KeyState(tat_s=now)  # the other algorithm's state means nothing here
                entry.rate = rate  # a changed limit keeps the count so far
        return entry

    def decide(self, key: str, rate: Rate, now: float, hits: float, mode: Mode) -> Decision:
        entry = self._entry(key, rate, now)
        decision = decide(rate, entry.state, now, hits, mode)
        if mode is not Mode.PEEK and self.replicated:
            entry.dirty = True
        return decision

    def absorb(self, key: str, rate: Rate, state: KeyState, now: float, authoritative: bool) -> None:
        """A peer's state of ``key``: taken as is from its owner, else merged as a max."""
        entry = self._entry(key, rate, now)
        if authoritative or entry.rate.algorithm is not rate.algorithm:
            entry.rate, entry.state = rate, state
        else:
            merge_max(rate, entry.state, state, now)

    def take_dirty(self) -> list[tuple[str, Entry]]:
        out = []
        for key, entry in self._entries.items():
            if entry.dirty:
                entry.dirty = False
                out.append((key, entry))
        return out

    def dirty_count(self) -> int:
        """Keys changed since their last replication (a scan: for /metrics, not the request path)."""
        return sum(1 for entry in self._entries.values() if entry.dirty)

    def mark_all_dirty(self) -> None:
        for entry in self._entries.values():
            entry.dirty = True

    def forget_idle(self, now: float) -> int:
        idle = [k for k, e in self._entries.items() if not e.dirty and is_idle(e.rate, e.state, now)]
        for key in idle:
            del self._entries[key]
        self.evicted_idle += len(idle)
        return len(idle)

    def _bound(self, now: float) -> None:
        while len(self._entries) > self.keys_max:
            key, entry = self._entries.popitem(last=False)
            if is_idle(entry.rate, entry.state, now):
                self.evicted_idle += 1
            else:
                self.evicted_busy += 1

"""Consistent-hash ring over the alive members: who owns a key. Immutable snapshots, swapped whole.

Each member gets ``vnodes`` points on a 64-bit circle (blake2b of
"name#i"); a key is owned by the member of the first point at or after the
key's hash, and ``owners(key, r)`` walks on to the next distinct members for
replicas. Adding or removing one of n members moves about 1/n of the keys.

A ring is never modified: ``HashRing.build(names)`` makes a new one, and the
holder swaps its reference in one assignment on every membership change, so
a reader never sees half a ring (gubernator's ``SetPeers``).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable, Iterator

VNODES_DEFAULT = 128  # ~10 % spread in load between members at n = 3..50 (see the golden test)


def hash64(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "big")


# Keys whose owner a ring remembers (``owner``): a rate-limit key or a conversation is asked for again and
# again, and hashing it (blake2b of its text) was the larger part of the lookup. A ring never changes, so
# what it remembers stays true for its life; past the bound it starts over.
OWNER_CACHE_KEYS_MAX = 8192


class HashRing:
    __slots__ = ("members", "vnodes", "_points", "_owners", "_owner_of")

    def __init__(self, members: "tuple[str, ...]", vnodes: int, points: "list[int]", owners: "list[str]") -> None:
        self.members = members
        self.vnodes = vnodes
        self._points = points
        self._owners = owners
        self._owner_of: dict[str, str] = {}

    @classmethod
    def build(cls, names: Iterable[str], vnodes: int = VNODES_DEFAULT) -> "HashRing":
        members = tuple(sorted(set(names)))
        ring = sorted((hash64(f"{name}#{i}"), name) for name in members for i in range(vnodes))
        return cls(members, vnodes, [p for p, _ in ring], [n for _, n in ring])

    def __len__(self) -> int:
        return len(self.members)

    def owners(self, key: str, r: int = 1) -> list[str]:
        """Up to r distinct members responsible for key, primary first."""
        if not self._points:
            return []
        r = min(r, len(self.members))
        start = bisect.bisect_left(self._points, hash64(key))
        out: list[str] = []
        n = len(self._points)
        for step in range(n):
            name = self._owners[(start + step) % n]
            if name not in out:
                out.append(name)
                if len(out) == r:
                    break
        return out

    def walk(self, key: str) -> Iterator[str]:
        """Every member once, in ring order from the key's point: ``owners`` taken lazily."""
        if not self._points:
            return
        start = bisect.bisect_left(self._points, hash64(key))
        seen: set[str] = set()
        n = len(self._points)
        for step in range(n):
            name = self._owners[(start + step) % n]
            if name not in seen:
                seen.add(name)
                yield name
                if len(seen) == len(self.members):
                    return

    def placement(self, key: str, count: int, machine_of: "Callable[[str], str]", owners_only: bool = True
                  ) -> list[str]:
        """The key's owners: ``count`` members in ring order from its point, each on a machine of its own
        (``machine_of``) while there are machines without a copy; only when there are fewer machines than
        ``count`` do the last places go to further processes of machines that have one (a process that
        restarts alone still finds a copy). Without ``owners_only``, the whole walk (where to look when the
        owners are down): every member on a machine not seen yet, in ring order, then the others."""
        owners: list[str] = []
        others: list[str] = []
        machines: set[str] = set()
        for member in self.walk(key):
            machine = machine_of(member)
            if machine in machines:
                others.append(member)
                continue
            machines.add(machine)
            owners.append(member)
            if owners_only and len(owners) == count:
                return owners
        return owners + (others[:max(0, count - len(owners))] if owners_only else others)

    def owner(self, key: str) -> str | None:
        """The key's primary: ``owners(key, 1)[0]``, remembered (``OWNER_CACHE_KEYS_MAX``)."""
        owner = self._owner_of.get(key)
        if owner is not None:
            return owner
        points = self._points
        if not points:
            return None
        index = bisect.bisect_left(points, hash64(key))
        owner = self._owners[index if index < len(points) else 0]
        if len(self._owner_of) >= OWNER_CACHE_KEYS_MAX:
            self._owner_of.clear()
        self._owner_of[key] = owner
        return owner

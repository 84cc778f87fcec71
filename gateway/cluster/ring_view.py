"""Who owns what: the consistent-hash ring of the members this node believes alive, and the member counts.

One placement rule for every key the cluster shares (``HashRing.placement``, through
``ClusterState.owners``): its owners are the first members in ring order from the key's point, one per
machine (a member's ``node`` tag: the processes of ``--workers N`` run on one machine and die together, so
two copies there are one copy). History shards, rate-limit keys and KV-event followers all place by it.

Pure: ``update`` takes the membership as the mesh agent reports it. Suspected members stay on the
ring: a suspicion is often refuted, and moving every key it owns back and forth would restart
health checks and KV streams for nothing. A ring is an immutable snapshot (``mesh/ring.py``),
swapped whole; ``changed`` is set, and replaced, on every change, for the tasks that wait on one.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from mesh.members import MemberSnapshot, MemberStatus
from mesh.ring import HashRing


class RingView:
    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self.ring = HashRing.build([node_name])
        self.changed = trio.Event()
        self._member_counts = (1, 1)

    def update(self, members: Iterable[MemberSnapshot]) -> bool:
        """Rebuild from the membership; True when the ring's members changed."""
        members = list(members)
        statuses = [m.status for m in members]
        visible = sum(1 for s in statuses if s is MemberStatus.ALIVE)
        known = sum(1 for s in statuses if s is not MemberStatus.LEFT)
        self._member_counts = (max(1, visible), max(1, known))
        alive = [m.name for m in members if m.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT)]
        ring = HashRing.build(alive or [self.node_name])
        if ring.members == self.ring.members:
            return False
        self.ring = ring
        self.changed.set()
        self.changed = trio.Event()
        return True

    def owns(self, key: str) -> bool:
        return self.ring.owner(key) in (None, self.node_name)

    def owners(self, key: str, count: int) -> list[str]:
        return self.ring.owners(key, count)

    def member_counts(self) -> tuple[int, int]:
        """(visible, known): alive members, and those plus the suspected and failed ones (not left).

        A suspected or failed member may be partitioned away rather than crashed, still serving
        clients: rate limits share their allowance by ``known`` until it is reaped, and count
        only alive members as ``visible`` so a side cut off shrinks its share at the first
        suspicion instead of after the suspicion timeout. Kept up to date on every membership
        change: rate-limit decisions read it per request."""
        return self._member_counts


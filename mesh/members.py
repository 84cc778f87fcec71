"""The member table and its state machine. No I/O, no clock: ``now`` is passed in.

Rules (after SWIM and memberlist's state.go); every input either changes one
member as stated or is ignored with the reason returned, leaving the table
unchanged:

  alive(inc, node, addr, tags)
    unknown node                       -> add it, ALIVE
    inc <= known incarnation           -> ignore: old news ("stale")
      (except: a member we hold as DEAD/LEFT needs a strictly higher incarnation
       to come back, which is the same rule)
    known ALIVE/SUSPECT at another addr -> ignore: two processes claim one name ("addr_conflict")
    otherwise                          -> ALIVE with inc, addr, tags
  suspect(inc, node, from)
    unknown node                       -> ignore ("unknown")
    inc < known incarnation            -> ignore ("stale")
    node is DEAD or LEFT               -> ignore: death is final for an incarnation ("final")
    node is SUSPECT (same inc)         -> a confirmation from `from` ("confirmation")
    node is us                         -> refute: the caller raises our incarnation ("about_self")
    otherwise                          -> SUSPECT with inc
  dead(inc, node, from)
    unknown node                       -> ignore ("unknown")
    inc < known incarnation            -> ignore ("stale")
    node is LEFT                       -> ignore ("final")
    node is DEAD, from == node         -> LEFT: an operator's force-leave of a failed member (below)
    node is DEAD otherwise             -> ignore ("final")
    node is us                         -> refute unless we are leaving ("about_self")
    from == node                       -> LEFT: it said goodbye; a leave is not a failure
    otherwise                          -> DEAD

  A failed (DEAD) member is kept much longer than a LEFT one (``MeshConfig.dead_reap_s``): it may be
  cut off rather than gone, still serving on its side. ``force-leave`` tells the cluster it is gone for
  good: the member is marked LEFT under its own name at the incarnation it died with, as if it had
  said goodbye. Were it alive after all, it hears of its leave and refutes with a higher incarnation,
  as it does a suspicion.

Theory: incarnation numbers are only ever raised by the member itself (to
refute a suspicion, to change its tags, to rejoin), so "newer" is well
defined per member, and any two nodes that saw the same messages, in any
order, end in the same state.
"""

from __future__ import annotations

import dataclasses
import enum

from .wire import Alive, Dead, MemberState, Suspect


class MemberStatus(enum.IntEnum):
    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


@dataclasses.dataclass
class Member:
    name: str
    addr: str
    incarnation: int
    status: MemberStatus
    tags: tuple[tuple[str, str], ...]
    changed_at: float

    def snapshot(self) -> "MemberSnapshot":
        return MemberSnapshot(self.name, self.addr, self.incarnation, self.status, dict(self.tags), self.changed_at)

    def as_state(self) -> MemberState:
        return MemberState(self.name, self.addr, self.incarnation, int(self.status), self.tags)


@dataclasses.dataclass(frozen=True)
class MemberSnapshot:
    """A read-only copy handed to other subsystems and the CLI."""

    name: str
    addr: str
    incarnation: int
    status: MemberStatus
    tags: dict[str, str]
    changed_at: float


@dataclasses.dataclass(frozen=True)
class Verdict:
    changed: bool
    reason: str  # "added", "alive", "suspect", "dead", "left", or why it was ignored
    previous: MemberStatus | None = None


_IGNORED = {reason: Verdict(False, reason) for reason in
            ("stale", "unknown", "final", "addr_conflict", "confirmation", "about_self", "table_full")}


class MemberTable:
    def __init__(self, local_name: str, members_max: int) -> None:
        self.local_name = local_name
        self.members_max = members_max
        self.members: dict[str, Member] = {}

    def get(self, name: str) -> Member | None:
        return self.members.get(name)

    def count(self, *statuses: MemberStatus) -> int:
        return sum(1 for m in self.members.values() if m.status in statuses)

    def live_count(self) -> int:
        """Members that count for the formulas (alive or suspect), us included."""
        return self.count(MemberStatus.ALIVE, MemberStatus.SUSPECT)

    def apply_alive(self, msg: Alive, now: float) -> Verdict:
        member = self.members.get(msg.node)
        if member is None:
            if len(self.members) >= self.members_max:
                return _IGNORED["table_full"]
            self.members[msg.node] = Member(msg.node, msg.addr, msg.incarnation, MemberStatus.ALIVE, msg.tags, now)
            return Verdict(True, "added", None)
        if msg.incarnation <= member.incarnation:
            return _IGNORED["stale"]
        if member.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT) and member.addr != msg.addr:
            return _IGNORED["addr_conflict"]
        previous = member.status
        member.incarnation, member.addr, member.tags = msg.incarnation, msg.addr, msg.tags
        if previous is not MemberStatus.ALIVE:
            member.status, member.changed_at = MemberStatus.ALIVE, now
        return Verdict(True, "alive", previous)

    def _accusable(self, msg: "Suspect | Dead") -> "Member | Verdict":
        """The member a suspicion or death is about, or why the message is ignored (rules shared by both)."""
        member = self.members.get(msg.node)
        if member is None:
            return _IGNORED["unknown"]
        if msg.incarnation < member.incarnation:
            return _IGNORED["stale"]
        if member.status is MemberStatus.LEFT or (
                member.status is MemberStatus.DEAD and not (isinstance(msg, Dead) and msg.source == msg.node)):
            return _IGNORED["final"]
        if msg.node == self.local_name:
            return _IGNORED["about_self"]
        return member

    def apply_suspect(self, msg: Suspect, now: float) -> Verdict:
        member = self._accusable(msg)
        if isinstance(member, Verdict):
            return member
        if member.status is MemberStatus.SUSPECT and msg.incarnation == member.incarnation:
            return _IGNORED["confirmation"]
        previous = member.status
        member.incarnation, member.status, member.changed_at = msg.incarnation, MemberStatus.SUSPECT, now
        return Verdict(True, "suspect", previous)

    def apply_dead(self, msg: Dead, now: float) -> Verdict:
        member = self._accusable(msg)
        if isinstance(member, Verdict):
            return member
        previous = member.status
        member.incarnation = msg.incarnation
        member.status = MemberStatus.LEFT if msg.source == msg.node else MemberStatus.DEAD
        member.changed_at = now
        return Verdict(True, "left" if member.status is MemberStatus.LEFT else "dead", previous)

    def reap(self, now: float, left_reap_s: float, dead_reap_s: float) -> list[Member]:
        """Forgets the members that left ``left_reap_s`` ago and those that failed ``dead_reap_s`` ago."""
        reap_after_s = {MemberStatus.LEFT: left_reap_s, MemberStatus.DEAD: dead_reap_s}
        gone = [m for m in self.members.values()
                if m.status in reap_after_s and now - m.changed_at >= reap_after_s[m.status]
                and m.name != self.local_name]
        for m in gone:
            del self.members[m.name]
        return gone

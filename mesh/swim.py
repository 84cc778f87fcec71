"""SWIM membership with Lifeguard, as a protocol object without I/O.

``Swim.handle(event, now) -> list[action]`` is the whole interface: the driver
(``mesh.agent``) turns ``SendPacket`` and ``PushPullWith`` into datagrams and
TCP exchanges, feeds received packets back as ``PacketIn``, and calls
``handle(Tick(), now)`` at ``next_deadline()``. The same object therefore runs
over real sockets and over the simulated network of the tests.

Theory of operation, one probe period (``probe_interval_s`` x Lifeguard's
awareness multiplier):

1. Probe the next member in a shuffled round-robin order with a PING. If it
   is suspected, the packet first carries the SUSPECT message about it, so a
   live member learns of the suspicion at once and can refute (Lifeguard's
   buddy system).
2. No ACK within ``probe_timeout_s`` (x awareness): ask ``indirect_checks``
   other members to ping it for us (INDIRECT_PING); they answer with its ACK,
   or with a NACK if they heard nothing, so we can tell "it is down" from
   "I am the slow one".
   At the same time the driver checks whether anything listens at its address
   (``CheckListener``); a refusal (``ListenerRefused``: its process is gone, the
   host is up) makes us suspect it at once, for ``no_listener_suspicion_s``.
3. Still no ACK at the end of the period: suspect it (broadcast SUSPECT). It
   is declared DEAD when its suspicion times out; the timeout starts long and
   shrinks as other members independently confirm the suspicion. A member that
   hears of a suspicion probes the suspect next (at once when no probe of its
   own runs), so confirmations, or acks that withhold them, come within a
   period. A member that refuted a suspicion lately gets the longest ones while that
   is remembered (``refuted_memory_s``): it is slow, not gone. And a member that
   lately had to refute a suspicion of itself, and whose probes still fail, holds
   its own suspicions of others as long: it is the slow one, and what it sees of
   their refutations comes late. Both lapse (a crash right after a lossy spell, when
   most members refuted, is not held for the longest timeout everywhere).

Lifeguard's awareness (0 .. awareness_max - 1) rises when this node fails a
probe without the nacks it expected, or has to refute a suspicion about
itself, and falls with each successful probe; it stretches our own probe
period and timeout, so a node starved of CPU stops accusing healthy members.

Every membership change is queued as a broadcast and piggybacked on probes,
acks and gossip packets (``gossip_nodes`` random members every
``gossip_interval_s``), each sent ``retransmit_mult * ceil(log10(n + 1))``
times. A periodic push-pull (full state over TCP with one random member)
repairs whatever gossip lost, and is how a joining node learns everything.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import random
from collections.abc import Callable

from .broadcast import BroadcastQueue
from .config import MeshConfig
from .crypto import SEAL_OVERHEAD_BYTES
from .members import MemberSnapshot, MemberStatus, MemberTable, Verdict
from .wire import (
    INCARNATION_MAX,
    PACKET_OVERHEAD_BYTES,
    Ack,
    Alive,
    Dead,
    IndirectPing,
    MemberState,
    Message,
    Nack,
    Ping,
    PushPull,
    Suspect,
    User,
    encode_message,
)

# The share of the probe timeout after which an indirect prober gives up and nacks.
NACK_AFTER_TIMEOUT_SHARE = 0.8
BROADCASTS_KEPT_MAX = 4096
USER_MESSAGE_OVERHEAD_BYTES = 8  # array header, type, bin header


# -- events ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Tick:
    """Timers may be due: call at next_deadline() (calling early is harmless)."""


@dataclasses.dataclass(frozen=True)
class PacketIn:
    from_addr: str
    messages: "list[Message]"


@dataclasses.dataclass(frozen=True)
class RemoteState:
    """A peer's full state, from a push-pull in either direction."""

    state: PushPull


@dataclasses.dataclass(frozen=True)
class Leave:
    """Announce a graceful leave; the driver keeps gossiping briefly, then stops."""


@dataclasses.dataclass(frozen=True)
class ForceLeave:
    """An operator says a failed member is gone for good: it is marked left, cluster-wide (Serf's force-leave).
    Only a member held DEAD moves; the driver checks and says why first (``MeshAgent.force_leave``)."""

    name: str


@dataclasses.dataclass(frozen=True)
class SetTags:
    tags: "dict[str, str]"


@dataclasses.dataclass(frozen=True)
class QueueUser:
    """Broadcast another subsystem's payload to the cluster through the gossip queue."""

    payload: bytes
    key: str | None = None


@dataclasses.dataclass(frozen=True)
class ListenerRefused:
    """The driver's answer to a ``CheckListener``: a connection to the member's address was refused."""

    name: str
    incarnation: int


Event = Tick | PacketIn | RemoteState | Leave | ForceLeave | SetTags | QueueUser | ListenerRefused


# -- actions --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SendPacket:
    addr: str
    messages: "tuple[bytes, ...]"  # encoded messages; the driver frames and seals them


@dataclasses.dataclass(frozen=True)
class PushPullWith:
    addr: str


@dataclasses.dataclass(frozen=True)
class CheckListener:
    """Ask the kernel, within ``timeout_s``, whether anything listens at ``addr`` (the member ``name`` at
    ``incarnation`` failed a direct probe); answer with ``ListenerRefused`` only if the connection is refused."""

    name: str
    incarnation: int
    addr: str
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class MemberChanged:
    member: MemberSnapshot
    previous: MemberStatus | None


@dataclasses.dataclass(frozen=True)
class MemberReaped:
    name: str


@dataclasses.dataclass(frozen=True)
class DeliverUser:
    payload: bytes


Action = SendPacket | PushPullWith | CheckListener | MemberChanged | MemberReaped | DeliverUser


# -- internal timers ------------------------------------------------------


@dataclasses.dataclass
class _Probe:
    seq: int
    target: str
    addr: str
    direct_deadline: float
    end_deadline: float
    indirect_sent: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclasses.dataclass
class _Relay:
    requester_addr: str
    requester_seq: int
    nack_at: float | None
    expires_at: float


@dataclasses.dataclass
class _Suspicion:
    incarnation: int
    started_at: float
    deadline: float
    confirmations: set[str]  # members that suspect it, the first accuser included


class Swim:
    def __init__(self, config: MeshConfig, name: str, addr: str, tags: "dict[str, str]", rng: random.Random,
                 now: float, user_broadcasts: Callable[[int], "list[bytes]"] | None = None) -> None:
        """``user_broadcasts(budget_bytes)``: other subsystems' payloads to piggyback, each
        costing ``len(payload) + USER_MESSAGE_OVERHEAD_BYTES`` of the budget."""
        self.config = config
        self.name = name
        self.addr = addr
        self.rng = rng
        self.table = MemberTable(name, config.members_max)
        self.incarnation = 1
        self.tags = tuple(sorted(tags.items()))
        self.awareness = 0
        self.leaving = False
        self._user_broadcasts = user_broadcasts
        self._queue = BroadcastQueue()
        self._seq = itertools.count(1)
        self._probe_order: list[str] = []
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._suspicions: dict[str, _Suspicion] = {}
        self._refuted_at: dict[str, float] = {}  # member -> when it last refuted a suspicion we held
        self._self_refuted_at: float | None = None  # when we last had to refute a suspicion of us
        # member -> (incarnation, when) a connection to its address was refused: its process is gone.
        self._no_listener: dict[str, tuple[int, float]] = {}
        # Start timers at random offsets so that nodes started together do not probe in lockstep.
        self._next_probe_at = now + rng.random() * config.probe_interval_s
        self._next_gossip_at = now + rng.random() * config.gossip_interval_s
        self._next_push_pull_at = now + config.push_pull_interval_s * (0.5 + rng.random())
        self._next_reap_at = now + config.left_reap_s / 4
        self._next_reconnect_at = now + config.reconnect_interval_s * (0.5 + rng.random())
        self.stats: collections.Counter[str] = collections.Counter()
        self.table.apply_alive(Alive(self.incarnation, name, addr, self.tags), now)
        self._queue_message(Alive(self.incarnation, name, addr, self.tags), name)

    # -- public queries -------------------------------------------------

    def members(self) -> list[MemberSnapshot]:
        return [m.snapshot() for m in self.table.members.values()]

    def local_state(self) -> tuple[MemberState, ...]:
        return tuple(m.as_state() for m in self.table.members.values())

    def broadcasts_pending(self) -> int:
        return len(self._queue)

    def next_deadline(self) -> float:
        deadlines = [self._next_push_pull_at, self._next_reap_at, self._next_reconnect_at]
        # A gossip round with nothing to send sends nothing: with the queue empty (and no subsystem asked
        # each round) the driver does not wake for it. The rounds keep their times (``_skip_quiet_rounds``):
        # a message queued meanwhile goes at the next one, as if every round had been woken for.
        if self._gossip_due():
            deadlines.append(self._next_gossip_at)
        if not self.leaving:
            deadlines.append(self._next_probe_at)
        if self._probe is not None:
            deadlines.append(self._probe.end_deadline if self._probe.indirect_sent else self._probe.direct_deadline)
        deadlines.extend(r.nack_at if r.nack_at is not None else r.expires_at for r in self._relays.values())
        deadlines.extend(s.deadline for s in self._suspicions.values())
        return min(deadlines)

    def _multiplier(self) -> int:
        return self.awareness + 1 if self.config.lifeguard else 1

    def _n(self) -> int:
        return max(1, self.table.live_count())

    # -- dispatch -------------------------------------------------------

    def _gossip_due(self) -> bool:
        return bool(len(self._queue)) or self._user_broadcasts is not None

    def _skip_quiet_rounds(self, now: float) -> None:
        """Move the next gossip round past the rounds that went by with nothing to send, on their schedule
        (each ``gossip_interval_s`` after the last): the same times as a driver woken for each of them."""
        interval = self.config.gossip_interval_s
        at = self._next_gossip_at
        rounds_behind = (now - at) / interval
        if rounds_behind > 64:  # a long quiet spell: jump, then step the last few
            at += (int(rounds_behind) - 1) * interval
        while at < now:
            at += interval
        self._next_gossip_at = at

    def handle(self, event: Event, now: float) -> list[Action]:
        out: list[Action] = []
        if now > self._next_gossip_at and not self._gossip_due():
            self._skip_quiet_rounds(now)
        if isinstance(event, Tick):
            self._tick(now, out)
        elif isinstance(event, PacketIn):
            for message in event.messages:
                self._receive(message, event.from_addr, now, out)
        elif isinstance(event, RemoteState):
            self._merge(event.state, now, out)
        elif isinstance(event, Leave):
            self._leave(now, out)
        elif isinstance(event, ForceLeave):
            self._force_leave(event.name, now, out)
        elif isinstance(event, SetTags):
            self._set_tags(event.tags, now, out)
        elif isinstance(event, ListenerRefused):
            self._listener_refused(event.name, event.incarnation, now, out)
        elif isinstance(event, QueueUser):
            self._queue.queue(encode_message(User(event.payload)), None if event.key is None else "u:" + event.key)
        return out

    # -- timers ---------------------------------------------------------

    def _tick(self, now: float, out: list[Action]) -> None:
        probe = self._probe
        if probe is not None and not probe.indirect_sent and now >= probe.direct_deadline:
            self._send_indirect(probe, now, out)
        if probe is not None and probe.indirect_sent and now >= probe.end_deadline:
            self._probe = None
            self._probe_failed(probe, now, out)
        if not self.leaving and self._probe is None and now >= self._next_probe_at:
            self._start_probe(now, out)
        for seq, relay in list(self._relays.items()):
            if relay.nack_at is not None and now >= relay.nack_at:
                relay.nack_at = None
                out.append(self._packet(relay.requester_addr, [encode_message(Nack(relay.requester_seq, self.name))]))
            if now >= relay.expires_at:
                del self._relays[seq]
        for name, suspicion in list(self._suspicions.items()):
            if now >= suspicion.deadline:
                # The timeout may have grown since it was set (we refuted a suspicion of us meanwhile).
                suspicion.deadline = suspicion.started_at + self._suspicion_timeout_s(name, suspicion, now)
                if now < suspicion.deadline:
                    continue
                del self._suspicions[name]
                member = self.table.get(name)
                if member is not None and member.status is MemberStatus.SUSPECT \
                        and member.incarnation == suspicion.incarnation:
                    self._apply(Dead(suspicion.incarnation, name, self.name), now, out)
        if now >= self._next_gossip_at:
            self._next_gossip_at = now + self.config.gossip_interval_s
            self._gossip(now, out)
        if now >= self._next_push_pull_at:
            self._next_push_pull_at = now + self.config.push_pull_interval_for(self._n())
            peers = [m for m in self.table.members.values() if m.status is MemberStatus.ALIVE and m.name != self.name]
            if peers and not self.leaving:
                out.append(PushPullWith(self.rng.choice(peers).addr))
        if now >= self._next_reconnect_at:
            self._next_reconnect_at = now + self.config.reconnect_interval_s
            dead = [m for m in self.table.members.values() if m.status is MemberStatus.DEAD]
            if dead and not self.leaving:
                self.stats["reconnect_attempts"] += 1
                out.append(PushPullWith(self.rng.choice(dead).addr))
        if now >= self._next_reap_at:
            self._next_reap_at = now + self.config.left_reap_s / 4
            for member in self.table.reap(now, self.config.left_reap_s, self.config.dead_reap_s):
                self._probe_order = [n for n in self._probe_order if n != member.name]
                self._refuted_at.pop(member.name, None)
                self._no_listener.pop(member.name, None)
                out.append(MemberReaped(member.name))

    def _next_target(self):
        for _ in range(2):
            while self._probe_order:
                member = self.table.get(self._probe_order.pop())
                if member is not None and member.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT) \
                        and member.name != self.name:
                    return member
            # A pass is over: a new shuffled order of everyone we may probe.
            self._probe_order = [m.name for m in self.table.members.values()
                                 if m.name != self.name and m.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT)]
            self.rng.shuffle(self._probe_order)
        return None

    def _start_probe(self, now: float, out: list[Action]) -> None:
        mult = self._multiplier()
        self._next_probe_at = now + self.config.probe_interval_s * mult
        target = self._next_target()
        if target is None:
            return
        seq = next(self._seq)
        self._probe = _Probe(seq, target.name, target.addr,
                             direct_deadline=now + self.config.probe_timeout_s * mult,
                             end_deadline=now + self.config.probe_interval_s * mult)
        self.stats["probes"] += 1
        first = []
        if target.status is MemberStatus.SUSPECT:  # buddy system: tell it first, so it can refute
            first.append(encode_message(Suspect(target.incarnation, target.name, self.name)))
        first.append(encode_message(Ping(seq, target.name, self.name, self.addr)))
        out.append(self._packet(target.addr, first))

    def _send_indirect(self, probe: _Probe, now: float, out: list[Action]) -> None:
        probe.indirect_sent = True
        helpers = [m for m in self.table.members.values()
                   if m.status is MemberStatus.ALIVE and m.name not in (self.name, probe.target)]
        helpers = self.rng.sample(helpers, min(self.config.indirect_checks, len(helpers)))
        want_nack = self.config.lifeguard
        probe.expected_nacks = len(helpers) if want_nack else 0
        for helper in helpers:
            self.stats["indirect_probes"] += 1
            out.append(self._packet(helper.addr, [encode_message(IndirectPing(
                probe.seq, probe.target, probe.addr, self.name, self.addr, want_nack))]))
        target = self.table.get(probe.target)
        if self.config.no_listener_suspicion_s is not None and target is not None:
            self.stats["listener_checks"] += 1
            # (a loop that ran late reaches here past the deadline: the check then gets no time, never a negative one)
            out.append(CheckListener(target.name, target.incarnation, probe.addr, max(0.0, probe.end_deadline - now)))

    def _probe_failed(self, probe: _Probe, now: float, out: list[Action]) -> None:
        self.stats["probe_failures"] += 1
        if self.config.lifeguard:
            # Missing nacks mean our own messages are not getting through: we may be the problem.
            missing = probe.expected_nacks - probe.nacks if probe.expected_nacks else 1
            self._adjust_awareness(max(0, missing))
        member = self.table.get(probe.target)
        if member is not None and member.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT):
            # Already suspected by someone else: our failed probe is an independent confirmation.
            if member.status is MemberStatus.ALIVE:
                self.stats["suspicions_raised"] += 1
            self._apply(Suspect(member.incarnation, member.name, self.name), now, out)

    def _probe_succeeded(self, now: float) -> None:
        self.stats["probe_acks"] += 1
        self._no_listener.pop(self._probe.target, None)  # it answered: whatever refused us is over
        self._probe = None
        self._adjust_awareness(-1, now)

    def _adjust_awareness(self, delta: int, now: float | None = None) -> None:
        if not self.config.lifeguard:
            return
        was = self.awareness
        self.awareness = min(self.config.awareness_max - 1, max(0, self.awareness + delta))
        if was and not self.awareness and now is not None and self._self_refuted_at is not None:
            # Well again: suspicions held for our own slowness run their own timeouts from now on.
            for name, suspicion in self._suspicions.items():
                suspicion.deadline = suspicion.started_at + self._suspicion_timeout_s(name, suspicion, now)

    def _gossip(self, now: float, out: list[Action]) -> None:
        if not len(self._queue) and self._user_broadcasts is None:
            return
        candidates = [m for m in self.table.members.values() if m.name != self.name and (
            m.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT)
            or now - m.changed_at < self.config.gossip_to_the_dead_s)]
        for member in self.rng.sample(candidates, min(self.config.gossip_nodes, len(candidates))):
            packet = self._packet(member.addr, [])
            if packet.messages:
                out.append(packet)

    # -- receiving ------------------------------------------------------

    def _receive(self, message: Message, from_addr: str, now: float, out: list[Action]) -> None:
        if isinstance(message, Ping):
            if message.target != self.name:
                self.stats["pings_for_someone_else"] += 1  # a restarted node at a reused address
                return
            out.append(self._packet(message.source_addr, [encode_message(Ack(message.seq, self.name))]))
        elif isinstance(message, IndirectPing):
            seq = next(self._seq)
            nack_at = now + self.config.probe_timeout_s * NACK_AFTER_TIMEOUT_SHARE if message.want_nack else None
            self._relays[seq] = _Relay(message.requester_addr, message.seq, nack_at,
                                       now + self.config.probe_interval_s * self._multiplier())
            out.append(self._packet(message.target_addr,
                                    [encode_message(Ping(seq, message.target, self.name, self.addr))]))
        elif isinstance(message, Ack):
            if self._probe is not None and message.seq == self._probe.seq:
                self._probe_succeeded(now)
            elif message.seq in self._relays:
                relay = self._relays.pop(message.seq)
                out.append(self._packet(relay.requester_addr, [encode_message(Ack(relay.requester_seq, self.name))]))
        elif isinstance(message, Nack):
            if self._probe is not None and message.seq == self._probe.seq:
                self._probe.nacks += 1
        elif isinstance(message, (Alive, Suspect, Dead)):
            self._apply(message, now, out)
        elif isinstance(message, User):
            out.append(DeliverUser(message.payload))

    def _apply(self, message: "Alive | Suspect | Dead", now: float, out: list[Action]) -> None:
        """Apply a membership message (ours or a peer's); broadcast it if it changed anything."""
        if message.node == self.name:
            self._about_self(message, now, out)
            return
        if isinstance(message, Alive):
            verdict = self.table.apply_alive(message, now)
        elif isinstance(message, Suspect):
            verdict = self.table.apply_suspect(message, now)
            if verdict.reason == "confirmation":
                self._confirm(message, now, out)
                return
        else:
            verdict = self.table.apply_dead(message, now)
        if not verdict.changed:
            self.stats[f"ignored_{verdict.reason}"] += 1
            return
        self._after_change(message, verdict, now, out)

    def _after_change(self, message: "Alive | Suspect | Dead", verdict: Verdict, now: float,
                      out: list[Action]) -> None:
        member = self.table.get(message.node)
        self._queue_message(message, message.node)
        if isinstance(message, Suspect):
            suspicion = _Suspicion(member.incarnation, now, 0.0, {message.source})
            self._suspicions[member.name] = suspicion
            suspicion.deadline = now + self._suspicion_timeout_s(member.name, suspicion, now)
            if message.source != self.name:
                self._probe_soon(member.name, now)
        else:
            suspicion = self._suspicions.pop(member.name, None)
            self._no_listener.pop(member.name, None)  # a new incarnation, or the end of this one
            if isinstance(message, Alive) and (suspicion is not None or verdict.previous is MemberStatus.DEAD):
                self.stats["suspicions_refuted"] += 1
                self._refuted_at[member.name] = now
        if verdict.previous is not member.status:
            out.append(MemberChanged(member.snapshot(), verdict.previous))

    def _confirm(self, message: Suspect, now: float, out: list[Action]) -> None:
        """Another member independently suspects the same member: shorten the timeout (Lifeguard)."""
        suspicion = self._suspicions.get(message.node)
        if suspicion is None or message.source in suspicion.confirmations:
            return  # the accuser itself, or a confirmation already counted
        suspicion.confirmations.add(message.source)
        suspicion.deadline = suspicion.started_at + self._suspicion_timeout_s(message.node, suspicion, now)
        self._queue_message(message, message.node)  # pass the confirmation on

    def _listener_refused(self, name: str, incarnation: int, now: float, out: list[Action]) -> None:
        member = self.table.get(name)
        if member is None or member.incarnation != incarnation \
                or member.status not in (MemberStatus.ALIVE, MemberStatus.SUSPECT):
            return  # refuted, restarted or judged meanwhile: the refusal was about a life that is over
        self.stats["listeners_refused"] += 1
        self._no_listener[name] = (incarnation, now)
        suspicion = self._suspicions.get(name)
        if suspicion is not None and suspicion.incarnation == incarnation:
            suspicion.deadline = suspicion.started_at + self._suspicion_timeout_s(name, suspicion, now)
        elif member.status is MemberStatus.ALIVE:
            # It failed our direct probe and nothing listens where it lived: suspect it now rather than at the
            # end of the probe period (the probe runs on, and its nacks still tell us about ourselves).
            self.stats["suspicions_raised"] += 1
            self._apply(Suspect(incarnation, name, self.name), now, out)

    def _suspicion_timeout_s(self, name: str, suspicion: _Suspicion, now: float) -> float:
        config, n = self.config, self._n()
        timeout = config.suspicion_timeout_s(n, len(suspicion.confirmations) - 1)
        refused = self._no_listener.get(name)
        if refused is not None and refused[0] == suspicion.incarnation:
            # Nothing listens where it lived: its process is gone. A slow member's kernel accepts, so neither
            # its slowness nor ours is a reason to wait longer than it takes an Alive in flight to arrive.
            return min(timeout, max(0.0, refused[1] - suspicion.started_at) + config.no_listener_suspicion_s)
        if not config.lifeguard:
            return timeout
        # The longest timeout, as for an unconfirmed suspicion, while either side was slow lately:
        # - the suspect refuted a suspicion: confirmations say only that it is slow again, and it has that
        #   long to answer;
        # - we had to refute one of us and our awareness says we are still unwell: we are the slow one (or
        #   our network is), and what we see of the suspect's refutation comes late; the others' verdict,
        #   when right, reaches us by gossip at once.
        # Held only while that memory lasts (re-checked when it lapses, or when we are well again): a
        # lossy half-minute has most members refute, and a crash right after it waited the longest
        # timeout on every survivor (25.6 s p50 after 30 s of 20 % loss).
        held_until = self._slowness_held_until(name, now)
        if held_until is None:
            return timeout
        return max(timeout, min(config.suspicion_max_s(n), held_until - suspicion.started_at))

    def _slowness_held_until(self, name: str, now: float) -> float | None:
        """When the memory of a slowness that lengthens our suspicion of ``name`` lapses; None: there is none."""
        memory_s, until = self.config.refuted_memory_s, None
        refuted_at = self._refuted_at.get(name)
        if refuted_at is not None and now - refuted_at < memory_s:
            until = refuted_at + memory_s
        refuted_at = self._self_refuted_at
        if self.awareness > 0 and refuted_at is not None and now - refuted_at < memory_s:
            until = max(until or 0.0, refuted_at + memory_s)
        return until

    def _probe_soon(self, name: str, now: float) -> None:
        """Someone else suspects ``name``: probe it next, at once if no probe of ours runs, so our
        verdict (a confirmation, or its ack and so no confirmation) comes within a probe period rather
        than when our round-robin order reaches it."""
        if self.leaving or (self._probe is not None and self._probe.target == name):
            return
        self._probe_order = [n for n in self._probe_order if n != name] + [name]
        if self._probe is None:
            self._next_probe_at = min(self._next_probe_at, now)

    def _about_self(self, message: "Alive | Suspect | Dead", now: float, out: list[Action]) -> None:
        if isinstance(message, Alive):
            if message.incarnation < self.incarnation or (
                    message.incarnation == self.incarnation and message.addr == self.addr
                    and message.tags == self.tags):
                return  # our own news coming back
        elif message.incarnation < self.incarnation:
            return  # about an incarnation we already left behind
        if self.leaving:
            return  # we are going: a dead or left verdict about us is right
        # Someone believes something else about us: refute with a higher incarnation.
        self.stats["refutations"] += 1
        if isinstance(message, Suspect) and message.source != self.name:
            # A member suspected us: we answer late. (A peer's state merged at a join says "suspect" in
            # our own name, and a Dead about us is mostly a restarted process hearing of its previous
            # life: neither says anything of our speed.)
            self._self_refuted_at = now
        self._adjust_awareness(1)
        self._raise_incarnation(message.incarnation)
        me = self.table.get(self.name)
        me.incarnation, me.status, me.addr, me.tags = self.incarnation, MemberStatus.ALIVE, self.addr, self.tags
        self._queue_message(Alive(self.incarnation, self.name, self.addr, self.tags), self.name)

    def _raise_incarnation(self, at_least: int) -> None:
        """Past ``at_least``, but never past what the wire carries. At the bound (reachable only by
        2^32 refutations, or by a key holder's forged claim) the node can no longer refute: its
        peers may declare it dead, which a restart with a new name repairs; it never crashes."""
        if at_least >= INCARNATION_MAX:
            self.stats["incarnation_exhausted"] += 1
        self.incarnation = min(INCARNATION_MAX, max(self.incarnation, at_least) + 1)

    # -- push-pull ------------------------------------------------------

    def _merge(self, state: PushPull, now: float, out: list[Action]) -> None:
        # Learn who exists first, then what is said about them (memberlist's mergeState).
        for m in state.members:
            status = MemberStatus(m.state)
            if status in (MemberStatus.ALIVE, MemberStatus.SUSPECT):
                self._apply(Alive(m.incarnation, m.name, m.addr, m.tags), now, out)
        for m in state.members:
            status = MemberStatus(m.state)
            if status is MemberStatus.SUSPECT:
                self._apply(Suspect(m.incarnation, m.name, self.name), now, out)
            elif status is MemberStatus.DEAD:
                # A peer's "dead" is only a suspicion here: let our own timers decide.
                self._apply(Suspect(m.incarnation, m.name, self.name), now, out)
            elif status is MemberStatus.LEFT:
                self._apply(Dead(m.incarnation, m.name, m.name), now, out)

    # -- local changes --------------------------------------------------

    def _leave(self, now: float, out: list[Action]) -> None:
        if self.leaving:
            return
        self.leaving = True
        self._raise_incarnation(self.incarnation)
        me = self.table.get(self.name)
        me.incarnation, me.status, me.changed_at = self.incarnation, MemberStatus.LEFT, now
        self._queue_message(Dead(self.incarnation, self.name, self.name), self.name)
        self._next_gossip_at = now  # spread it now

    def _force_leave(self, name: str, now: float, out: list[Action]) -> None:
        """A leave in the failed member's own name at the incarnation it died with: every member applies and
        passes it on as it would the member's own goodbye (members.py), push-pull carries it to those gossip
        missed. A member alive after all refutes it with a higher incarnation, as it does a suspicion."""
        member = self.table.get(name)
        if member is None or member.status is not MemberStatus.DEAD:
            return
        self.stats["forced_leaves"] += 1
        self._apply(Dead(member.incarnation, name, name), now, out)

    def _set_tags(self, tags: "dict[str, str]", now: float, out: list[Action]) -> None:
        self.tags = tuple(sorted(tags.items()))
        self._raise_incarnation(self.incarnation)
        me = self.table.get(self.name)
        me.incarnation, me.tags = self.incarnation, self.tags
        self._queue_message(Alive(self.incarnation, self.name, self.addr, self.tags), self.name)
        out.append(MemberChanged(me.snapshot(), me.status))

    # -- packets --------------------------------------------------------

    def _queue_message(self, message: Message, key: str) -> None:
        self._queue.queue(encode_message(message), key)
        self._queue.prune(BROADCASTS_KEPT_MAX)

    def _packet(self, addr: str, first: "list[bytes]") -> SendPacket:
        budget = (self.config.udp_packet_bytes_max - PACKET_OVERHEAD_BYTES - SEAL_OVERHEAD_BYTES
                  - sum(len(m) for m in first))
        limit = self.config.retransmit_limit(self._n())
        messages = first + self._queue.take(budget, limit)
        if self._user_broadcasts is not None:
            left = budget - sum(len(m) for m in messages[len(first):])
            messages += [encode_message(User(p)) for p in self._user_broadcasts(left)]
        return SendPacket(addr, tuple(messages))

"""The mesh agent: drives the sans-I/O ``Swim`` core over a ``Transport``, with encryption.

The only place where membership touches sockets and clocks. Three loops in one
nursery: received packets (open, decode, hand to the core), timers (tick the
core at its next deadline, or earlier when something changed), and the
push-pull stream server. Actions the core returns are executed at once: packets
framed, sealed and sent; push-pulls started as tasks; membership changes passed
to listeners.

Other subsystems plug in through ``StateHooks`` (memberlist's Delegate): their
full state rides on push-pull, their broadcasts on gossip packets. Membership
itself knows nothing about what they carry.

Dropped packets are counted by reason: ``decrypt`` (no installed key opens it:
a node without our key cannot join; named per host in the log, and past a bound
what the host sends from addresses that never opened is dropped unread, ``muted``:
``mesh.auth_failures``), ``replay`` and ``stale`` (a captured
packet played again: ``mesh.crypto``), ``bad_version``, ``malformed``,
``bad_incarnation``, ... and ``handler_error``: a packet whose handling raised
(a bug of ours or of a subsystem) is dropped and logged; nothing a peer sends
can end the agent or the process.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import Protocol

import trio

from .auth_failures import AuthFailures
from .config import MeshConfig
from .crypto import SEAL_VERSION, Keyring, KeyringError, Sealer, fingerprint_of
from .keyring_rotation import (KEYRING_STREAM_MARK, PHASES, KeyringRequestError, RotationReport, decode_answer,
                               decode_request, encode_answer, encode_request)
from .members import MemberSnapshot, MemberStatus
from .swim import (
    Action,
    CheckListener,
    DeliverUser,
    ForceLeave,
    Leave,
    ListenerRefused,
    MemberChanged,
    MemberReaped,
    PacketIn,
    PushPullWith,
    QueueUser,
    RemoteState,
    SendPacket,
    SetTags,
    Swim,
    Tick,
)
from .transport import StreamClosed, Transport, TransportError
from .wire import PROTOCOL_VERSION, PushPull, decode_packet, decode_push_pull, encode_packet, encode_push_pull

log = logging.getLogger("mesh.agent")

UDP_LABEL = b"smg-node/gossip"
TCP_LABEL = b"smg-node/push-pull"
HELLO_LABEL = b"smg-node/stream-hello"
PUSH_PULL_TIMEOUT_S = 10.0
# Traffic of another version (a rolling upgrade half done) is said once a minute per host, for at most this many
# hosts before the memory starts over (a forger's sources must not grow it).
VERSION_NOTE_INTERVAL_S = 60.0
VERSION_NOTE_HOSTS_MAX = 1024
# A member asked one phase of a rotation answers within this or is named in the report (three phases fit in the
# CLI's wait).
ROTATION_PHASE_TIMEOUT_S = 5.0
# Packets already arrived that a due timer reads first (_read_arrived): more than a busy member receives in a
# second at 5 members (~2 packets a second each way idle, a few dozen under churn), few enough that a flood
# cannot hold the timers off.
PACKETS_READ_BEFORE_TIMERS_MAX = 256
# A peer failing authentication is logged at most this often (with a count): a node with another key retries,
# and an attacker can send any number of packets.


class StateHooks(Protocol):
    """A subsystem riding on the mesh. It may also have ``broadcasts(budget_bytes) -> list[bytes]``:
    payloads of its own to piggyback on every gossip round (``Swim``'s ``user_broadcasts``). One that
    queues its updates with ``MeshAgent.broadcast`` instead leaves it out, and an idle mesh then wakes
    for probes only, not every gossip interval to ask it."""

    def local_state(self, join: bool) -> bytes: ...
    def merge_remote_state(self, data: bytes, join: bool) -> None: ...
    def notify(self, payload: bytes) -> None: ...
    async def on_request(self, payload: bytes) -> bytes: ...


# A stream's plaintext starts with this byte when it carries another subsystem's
# request (MeshAgent.request) rather than push-pull state (a msgpack array, 0x9x).
USER_STREAM_MARK = b"U"


@dataclasses.dataclass
class AgentStats:
    packets_sent: int = 0
    packets_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    send_failures: int = 0
    push_pulls: int = 0
    push_pull_failures: int = 0
    dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class JoinError(Exception):
    """No seed could be reached."""


class ForceLeaveError(Exception):
    """A force-leave names no member, or a member that is not held failed (``missing``: unknown here)."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


class PeerUnreachable(Exception):
    """A member could not be asked: unknown (never seen, or forgotten), unreachable, too slow, or its answer
    could not be read. The one error every subsystem's request to a peer ends in."""


class MeshAgent:
    def __init__(self, config: MeshConfig, name: str, transport: Transport, keyring: Keyring | None = None,
                 tags: "dict[str, str] | None" = None, hooks: StateHooks | None = None,
                 rng: random.Random | None = None, wall_clock: Callable[[], float] = time.time) -> None:
        """``wall_clock``: seconds shared by all members (replay protection compares frame times
        across nodes); the simulations pass trio's virtual clock."""
        self.config = config
        self.name = name
        self.transport = transport
        self.keyring = keyring or Keyring([])
        self.sealer = Sealer(self.keyring)
        self._wall_clock = wall_clock
        self.hooks = hooks
        self.rng = rng or random.Random()
        self.swim = Swim(config, name, transport.addr, tags or {}, self.rng, trio.current_time(),
                         getattr(hooks, "broadcasts", None))
        self.stats = AgentStats()
        self.listeners: list[Callable[[MemberSnapshot, MemberStatus | None], None]] = []
        self.reap_listeners: list[Callable[[str], None]] = []  # a dead or left member was forgotten
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.stopped = trio.Event()
        self.auth_failures = AuthFailures()
        self._versions_said: dict[str, float] = {}  # host -> when another version's traffic from it was said

    # -- public API ---------------------------------------------------------

    def members(self) -> list[MemberSnapshot]:
        return self.swim.members()

    def member(self, name: str) -> MemberSnapshot | None:
        """The member called ``name`` as this node knows it now (any status), or None."""
        known = self.swim.table.get(name)
        return known.snapshot() if known is not None else None

    def counts_by_status(self) -> "dict[MemberStatus, int]":
        """How many members this node knows in each state (itself included)."""
        return {status: self.swim.table.count(status) for status in MemberStatus}

    @property
    def awareness(self) -> int:
        """Lifeguard's local health score: 0 is healthy; it stretches this node's probe interval and timeout."""
        return self.swim.awareness

    @property
    def protocol_stats(self) -> "dict[str, int]":
        """The membership protocol's counters (probes, suspicions, refutations)."""
        return self.swim.stats

    def alive_members(self) -> list[MemberSnapshot]:
        return [m for m in self.swim.members() if m.status is MemberStatus.ALIVE]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.transport.serve_streams, self._answer_stream, self._check_hello)
                nursery.start_soon(self._receive_loop)
                nursery.start_soon(self._timer_loop)
                task_status.started()
        finally:
            self.stopped.set()

    def stop(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def join(self, seeds: "list[str]") -> int:
        """Push-pull with each seed; returns how many answered. Raises JoinError if none did: saying so when every
        seed closed the connection at our sealed hello, which is what a seed holding another key does."""
        answered = refused = tried = 0
        for seed in seeds:
            if seed == self.transport.addr:
                continue
            tried += 1
            try:
                await self._push_pull(seed, join=True)
                answered += 1
            except StreamClosed as e:
                refused += 1
                log.info("seed %s closed the connection at our hello: %s", seed, e)
            except TransportError as e:
                log.info("seed %s did not answer: %s", seed, e)
        if not answered and tried:
            if refused == tried and self.keyring.enabled:
                raise JoinError(f"the seeds ({', '.join(seeds)}) closed the connection at our sealed hello: their "
                                "gossip key is not ours. Give every node the same --encrypt key, or the same admin "
                                "token when the key is derived from it")
            raise JoinError(f"no seed answered: {', '.join(seeds)}")
        return answered

    async def leave(self, propagate_s: float | None = None) -> None:
        """Announce the leave, give gossip time to carry it, then stop."""
        log.info("member %s leaving the cluster (asked by an operator, or a signal): telling %d members",
                    self.name, max(0, len(self.swim.table.members) - 1))
        self._handle(Leave())
        limit = propagate_s if propagate_s is not None else 3 * self.config.gossip_interval_s * max(
            1, self.config.retransmit_limit(len(self.swim.table.members)))
        with trio.move_on_after(limit):
            while self.swim.broadcasts_pending():
                await trio.sleep(self.config.gossip_interval_s)
        log.info("member %s left the cluster", self.name)
        self.stop()

    def force_leave(self, name: str) -> list[str]:
        """Marks a failed member left, cluster-wide: an operator says it is gone for good, so the others stop
        counting it as possibly cut off (rate-limit shares, history writes: ``MeshConfig.dead_reap_s``). ``name``
        is a member, or a node whose members (the processes of ``--workers N``, its ``node`` tag) are all failed.
        Returns the members marked left. Raises ForceLeaveError when none is known by that name or one of them is
        not failed: a live member would refute at once, and a suspected one may be only slow."""
        if name == self.name:
            raise ForceLeaveError(f"{name} is this node: it leaves with smg-node leave")
        members = [m for m in self.members() if m.name != self.name and (
            m.name == name or m.tags.get("node") == name) and m.status is not MemberStatus.LEFT]
        if not members:
            raise ForceLeaveError(f"no member {name} (failed or alive) is known here", missing=True)
        not_failed = [m for m in members if m.status is not MemberStatus.DEAD]
        if not_failed:
            raise ForceLeaveError(", ".join(f"{m.name} is {m.status.name.lower()}" for m in not_failed) +
                                  ": only a failed member can be forced to leave (a live one leaves itself: "
                                  "smg-node leave on its machine)")
        for member in members:
            self._handle(ForceLeave(member.name))
            log.warning("member %s forced to leave (operator): no longer counted as possibly cut off", member.name)
        return [m.name for m in members]

    @property
    def leaving(self) -> bool:
        """True once this member announced its leave (it gossips no more than the announcement)."""
        return self.swim.leaving

    @property
    def tags(self) -> "dict[str, str]":
        """This member's own tags, as it gossips them."""
        return dict(self.swim.tags)

    def set_tags(self, tags: "dict[str, str]") -> None:
        self._handle(SetTags(dict(tags)))

    def broadcast(self, payload: bytes, key: str | None = None) -> None:
        self._handle(QueueUser(payload, key))

    def sync_with_all(self) -> None:
        """Push-pull with every alive member now: a state change too big for gossip reaches all at once."""
        if self._nursery is None:
            return
        for member in self.alive_members():
            if member.name != self.name:
                self._nursery.start_soon(self._push_pull_quietly, member.addr)

    # -- loops --------------------------------------------------------------

    async def _receive_loop(self) -> None:
        while True:
            self._on_packet(*await self.transport.receive_packet())

    def _on_packet(self, from_addr: str, sealed: bytes) -> None:
        self.stats.packets_received += 1
        self.stats.bytes_received += len(sealed)
        host = from_addr.rpartition(":")[0]
        now = trio.current_time()
        if self.auth_failures.muted(host, from_addr, now) and not self._member_address(from_addr):
            self.stats.dropped["muted"] += 1
            return
        data, reason = self.sealer.open(sealed, UDP_LABEL, self._wall_clock())
        if data is None:
            self.stats.dropped[reason] += 1
            if reason == "seal_version":
                self._note_other_version(host, now, f"a packet sealed in format {sealed[0]}")
            if reason in ("decrypt", "seal_version"):  # either way it did not open: counted towards the mute
                self._note_failed_authentication(host, now, "packet")
            return
        self.auth_failures.succeeded(host, from_addr, now)
        messages, reason = decode_packet(data, self.config.udp_packet_bytes_max + 64)
        if reason is not None:
            self.stats.dropped[reason] += 1
            if reason == "bad_version":
                self._note_other_version(host, now, "a packet of another mesh protocol version")
            return
        self._handle_safely(PacketIn(from_addr, messages))

    def _read_arrived(self) -> None:
        """Handle the packets that have arrived but wait to be read, before a timer judges anything: when the
        loop was held up (a busy process), the timers and the packets become runnable together and trio may
        run the timers first. An ack or a refutation already here would then count as missing: a probe
        failed, a suspicion expired, a healthy member declared dead (a 10-minute run of the chaos harness's
        lossy-network scenario saw one). Bounded: a flood must not hold the timers off."""
        for _ in range(PACKETS_READ_BEFORE_TIMERS_MAX):
            packet = self.transport.receive_packet_nowait()
            if packet is None:
                return
            self._on_packet(*packet)

    async def _timer_loop(self) -> None:
        while True:
            self._wake = trio.Event()
            with trio.move_on_at(self.swim.next_deadline()):
                await self._wake.wait()
            if trio.current_time() >= self.swim.next_deadline():
                self._read_arrived()
            if not self._handle_safely(Tick()):
                await trio.sleep(self.config.gossip_interval_s)  # a failing tick must not spin the loop

    def _handle(self, event) -> None:
        actions = self.swim.handle(event, trio.current_time())
        for action in actions:
            self._execute(action)
        self._wake.set()  # deadlines may have moved

    def _handle_safely(self, event) -> bool:
        """``_handle`` for what comes from the network and the timers: a failure is a dropped,
        counted and logged event, never the end of the agent. False when it failed."""
        try:
            self._handle(event)
            return True
        except Exception:
            self.stats.dropped["handler_error"] += 1
            log.exception("dropped a %s whose handling failed", type(event).__name__)
            return False

    def _execute(self, action: Action) -> None:
        if isinstance(action, SendPacket):
            data = self.sealer.seal(encode_packet(list(action.messages)), UDP_LABEL, self._wall_clock())
            if self.transport.send_packet_nowait(action.addr, data):
                self.stats.packets_sent += 1
                self.stats.bytes_sent += len(data)
            else:
                self.stats.send_failures += 1
        elif isinstance(action, PushPullWith):
            if self._nursery is not None:
                self._nursery.start_soon(self._push_pull_quietly, action.addr)
        elif isinstance(action, CheckListener):
            if self._nursery is not None:
                self._nursery.start_soon(self._check_listener, action)
        elif isinstance(action, MemberChanged):
            if action.member.name != self.name:
                log.info("member %s: %s -> %s", action.member.name,
                         action.previous.name.lower() if action.previous is not None else "new",
                         action.member.status.name.lower())
            for listener in self.listeners:
                listener(action.member, action.previous)
        elif isinstance(action, MemberReaped):
            log.debug("member %s reaped", action.name)
            for reap_listener in self.reap_listeners:
                reap_listener(action.name)
        elif isinstance(action, DeliverUser):
            if self.hooks is not None:
                try:
                    self.hooks.notify(action.payload)
                except Exception:  # a subsystem's failure on one broadcast drops that broadcast only
                    self.stats.dropped["handler_error"] += 1
                    log.exception("a subsystem failed on a broadcast")

    async def _check_listener(self, check: CheckListener) -> None:
        try:
            refused = await self.transport.connection_refused(check.addr, check.timeout_s)
        except Exception:  # a member's odd address must not end the agent: the check is only a hint
            self.stats.dropped["handler_error"] += 1
            log.exception("checking whether anything listens at %s failed", check.addr)
            return
        if refused:
            log.info("member %s: nothing listens at %s (its process is gone)", check.name, check.addr)
            self._handle_safely(ListenerRefused(check.name, check.incarnation))

    # -- push-pull ----------------------------------------------------------

    def _state_bytes(self, join: bool) -> bytes:
        user = self.hooks.local_state(join) if self.hooks is not None else b""
        return self.sealer.seal(encode_push_pull(PushPull(join, self.swim.local_state(), user)), TCP_LABEL,
                                self._wall_clock())

    def _merge_bytes(self, sealed: bytes) -> PushPull | None:
        data, reason = self.sealer.open(sealed, TCP_LABEL, self._wall_clock())
        if data is None:
            self.stats.dropped[reason] += 1
            return None
        return self._merge_opened(data)

    def _merge_opened(self, data: bytes) -> PushPull | None:
        state, reason = decode_push_pull(data, self.config.tcp_state_bytes_max)
        if state is None:
            self.stats.dropped[reason] += 1
            return None
        if not self._handle_safely(RemoteState(state)):
            return None
        if self.hooks is not None and state.user_state:
            try:
                self.hooks.merge_remote_state(state.user_state, state.join)
            except Exception:
                self.stats.dropped["handler_error"] += 1
                log.exception("a subsystem failed to merge a peer's state")
        return state

    def _make_hello(self) -> bytes:
        """The first frame of every stream connection we open: proof that we hold a key."""
        return self.sealer.seal(b"", HELLO_LABEL, self._wall_clock())

    def _member_address(self, addr: str) -> bool:
        """``addr`` is a member's (asked only of a muted host's packets: a member that just joined and has not
        sent a packet yet is not muted with the guesser beside it)."""
        return any(member.addr == addr for member in self.swim.members())

    def _check_hello(self, hello: bytes, host: str = "") -> bool:
        now = trio.current_time()
        if self.auth_failures.muted(host, "", now):
            self.stats.dropped["hello_muted"] += 1
            log.debug("refused a stream hello from %s: the host is muted", host)
            return False
        data, reason = self.sealer.open(hello, HELLO_LABEL, self._wall_clock())
        if data is None:
            self.stats.dropped[f"hello_{reason}"] += 1
            log.debug("refused a stream hello from %s: %s", host or "an unknown host", reason)
            if reason == "seal_version":
                self._note_other_version(host, now, f"a stream hello sealed in format {hello[0]}")
            if reason in ("decrypt", "seal_version"):  # either way it did not open: counted towards the mute
                self._note_failed_authentication(host, now, "hello")
            return False
        self.auth_failures.succeeded(host, "", now)
        return True

    def _note_other_version(self, host: str, now: float, what: str) -> None:
        """Traffic in a format of another smg-node version (during a rolling upgrade, a node left behind or ahead):
        dropped, and said in one line per host a minute, so that a half-done upgrade is seen where people look."""
        said = self._versions_said.get(host)
        if said is not None and now - said < VERSION_NOTE_INTERVAL_S:
            return
        if len(self._versions_said) >= VERSION_NOTE_HOSTS_MAX:
            self._versions_said.clear()
        self._versions_said[host] = now
        log.warning("%s from %s: this node speaks mesh protocol %d, sealed format %d, and drops it. A node of "
                    "another smg-node version: upgrade node by node to one version (docs/cluster.md, upgrades)",
                    what, host or "an unknown host", PROTOCOL_VERSION, SEAL_VERSION)

    def _note_failed_authentication(self, host: str, now: float, what: str) -> None:
        """A peer's hello or packet did not open with our keys: said in the log per host, at most once a window
        (an attacker's flood must not flood the log), and the host muted when it sends nothing else."""
        line = self.auth_failures.failed(host or "an unknown host", now, what)
        if line is not None:
            log.warning("%s", line)

    async def _push_pull(self, addr: str, join: bool) -> None:
        self.stats.push_pulls += 1
        try:
            answer = await self.transport.exchange(addr, self._state_bytes(join), PUSH_PULL_TIMEOUT_S,
                                                   self._make_hello)
        except TransportError:
            self.stats.push_pull_failures += 1
            raise
        if self._merge_bytes(answer) is None:
            self.stats.push_pull_failures += 1
            raise TransportError(f"{addr} answered with a state we cannot read (wrong key or version?)")

    async def _push_pull_quietly(self, addr: str) -> None:
        with contextlib.suppress(TransportError):
            await self._push_pull(addr, join=False)

    async def request(self, addr: str, payload: bytes, timeout_s: float = PUSH_PULL_TIMEOUT_S) -> bytes:
        """Another subsystem's request to a peer over the (sealed) stream transport; its answer.

        Raises TransportError when the peer cannot be reached or answers with nothing we can open.
        """
        request = self.sealer.seal(USER_STREAM_MARK + payload, TCP_LABEL, self._wall_clock())
        answer = await self.transport.exchange(addr, request, timeout_s, self._make_hello)
        data, reason = self.sealer.open(answer, TCP_LABEL, self._wall_clock())
        if data is None or not data.startswith(USER_STREAM_MARK):
            raise TransportError(f"{addr} gave no readable answer")
        return data[1:]

    def _keyring_op(self, data: bytes) -> bytes:
        """A rotation's phase asked by a member, done here: its answer (our fingerprints, or why not)."""
        try:
            op, key = decode_request(data)
            {"install": self.keyring.install, "use": self.keyring.use, "remove": self.keyring.remove}[op](key)
        except (KeyringRequestError, KeyringError, ValueError) as e:
            self.stats.dropped["bad_keyring_request"] += 1
            return encode_answer(None, str(e))
        log.info("gossip keyring: %s asked by a member (primary now %s)", op, self.keyring.fingerprints()[0])
        return encode_answer(self.keyring.fingerprints())

    async def rotate_keyring(self, new_key: str, timeout_s: float = ROTATION_PHASE_TIMEOUT_S) -> RotationReport:
        """Make ``new_key`` every alive member's gossip key and remove the old one everywhere, in the three phases
        of keyring_rotation.py; the report says how far it went. Raises KeyringError before anything changes when
        the key cannot be used (not a key, encryption off, already the primary)."""
        if not self.keyring.enabled:
            raise KeyringError("gossip encryption is off here (--encrypt, or a key derived from the admin token): "
                               "there is no key to rotate")
        new_fingerprint, old_fingerprint = fingerprint_of(new_key), self.keyring.fingerprints()[0]
        if new_fingerprint == old_fingerprint:
            raise KeyringError("that key is the primary already")
        old_key = self.keyring.primary_text()
        report = RotationReport(new_fingerprint, old_fingerprint)
        peers = [m for m in self.members() if m.name != self.name and m.status is MemberStatus.ALIVE]
        report.not_asked = sorted(m.name for m in self.members() if m.name != self.name
                                  and m.status in (MemberStatus.SUSPECT, MemberStatus.DEAD))
        local = {"install": self.keyring.install, "use": self.keyring.use, "remove": self.keyring.remove}
        for phase in PHASES:
            key = old_key if phase == "remove" else new_key
            outcomes: dict[str, str] = {}

            async def ask(member: MemberSnapshot) -> None:
                try:
                    answer = await self.transport.exchange(member.addr, self.sealer.seal(
                        encode_request(phase, key), TCP_LABEL, self._wall_clock()), timeout_s, self._make_hello)
                    data, _ = self.sealer.open(answer, TCP_LABEL, self._wall_clock())
                    _, error = decode_answer(data) if data is not None else (None, "an answer we cannot open")
                except TransportError as e:
                    error = f"not reached: {e}"
                outcomes[member.name] = error or "ok"

            async with trio.open_nursery() as nursery:
                for member in peers:
                    nursery.start_soon(ask, member)
            local[phase](key)
            outcomes[self.name] = "ok"
            report.members = dict(sorted(outcomes.items()))
            log.info("gossip keyring rotation: %s done by %d of %d members", phase,
                     sum(1 for v in outcomes.values() if v == "ok"), len(outcomes))
            if any(v != "ok" for v in outcomes.values()):
                break
            report.phases_done.append(phase)
        return report

    async def _answer_stream(self, request: bytes) -> bytes:
        data, reason = self.sealer.open(request, TCP_LABEL, self._wall_clock())
        if data is None:
            self.stats.dropped[reason] += 1
            return b""
        if data.startswith(KEYRING_STREAM_MARK):  # a member's rotation (keyring_rotation.py): sealed, so a member's
            return self.sealer.seal(self._keyring_op(data), TCP_LABEL, self._wall_clock())
        if data.startswith(USER_STREAM_MARK):
            if self.hooks is None:
                return b""
            try:
                answer = await self.hooks.on_request(data[1:])
            except Exception:  # a peer's bad request must not take the stream server down
                self.stats.dropped["bad_request"] += 1
                log.exception("a subsystem failed on a peer's request")
                return b""
            return self.sealer.seal(USER_STREAM_MARK + answer, TCP_LABEL, self._wall_clock())
        state = self._merge_opened(data)
        if state is None:
            return b""  # the peer cannot open an empty answer: its join fails, as it should
        return self._state_bytes(state.join)

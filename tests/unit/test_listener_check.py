"""A member whose address refuses connections has no process left: the core's rules for that evidence
(mesh/swim.py ``CheckListener`` / ``ListenerRefused``), driven by hand with time passed in."""

import random

import pytest

from mesh.config import MeshConfig
from mesh.members import MemberStatus
from mesh.swim import CheckListener, ListenerRefused, PacketIn, SendPacket, Swim, Tick
from mesh.wire import Ack, Alive, Ping, Suspect, decode_packet, encode_packet

X_ADDR, Y_ADDR = "10.0.0.2:7946", "10.0.0.3:7946"


class Driver:
    """``me`` with members x and y. y answers every ping at once; x answers only while ``x_up``."""

    def __init__(self, **config) -> None:
        self.swim = Swim(MeshConfig.lan(**config), "me", "10.0.0.1:7946", {}, random.Random(1), 0.0)
        self.now = 0.0
        self.x_up = True
        self.checks: list[CheckListener] = []
        self.last_ping_to_x: int | None = None
        self.dead_at: float | None = None
        self.alive("x", 1, X_ADDR)
        self.alive("y", 1, Y_ADDR)

    def alive(self, name: str, incarnation: int, addr: str) -> None:
        self.handle(PacketIn(addr, [Alive(incarnation, name, addr, ())]))

    def handle(self, event) -> None:
        for action in self.swim.handle(event, self.now):
            if isinstance(action, CheckListener):
                self.checks.append(action)
            elif isinstance(action, SendPacket):
                messages, _ = decode_packet(encode_packet(list(action.messages)), 1 << 20)
                for m in messages:
                    if isinstance(m, Ping) and m.target == "x":
                        self.last_ping_to_x = m.seq
                    if isinstance(m, Ping) and (m.target == "y" or (m.target == "x" and self.x_up)):
                        self.swim.handle(PacketIn(action.addr, [Ack(m.seq, m.target)]), self.now)
        x = self.swim.table.get("x")
        if x is not None and x.status is MemberStatus.DEAD and self.dead_at is None:
            self.dead_at = self.now

    def run_until(self, end: float, stop=lambda: False) -> None:
        while not stop():
            at = self.swim.next_deadline()
            if at > end:
                self.now = end
                return
            self.now = max(self.now, at)
            self.handle(Tick())

    def status(self, name: str) -> MemberStatus:
        return self.swim.table.get(name).status

    def x_incarnation(self) -> int:
        return self.swim.table.get("x").incarnation


def crash_x_and_wait_for_a_check(d: Driver) -> CheckListener:
    d.x_up = False
    d.run_until(d.now + 60, stop=lambda: bool(d.checks))
    assert d.checks, "no direct probe of x failed in a minute"
    return d.checks[-1]


def test_a_failed_direct_probe_asks_whether_anything_listens_within_the_probe_period():
    d = Driver()
    d.run_until(10)
    assert not d.checks  # nothing failed, nothing checked
    check = crash_x_and_wait_for_a_check(d)
    assert (check.name, check.incarnation, check.addr) == ("x", 1, X_ADDR)
    assert 0 < check.timeout_s <= MeshConfig.lan().probe_interval_s - MeshConfig.lan().probe_timeout_s + 1e-9


def test_a_refused_connection_ends_the_suspicion_half_a_second_after_it():
    d = Driver()
    d.run_until(10)
    check = crash_x_and_wait_for_a_check(d)
    refused_at = d.now
    d.handle(ListenerRefused("x", check.incarnation))
    assert d.status("x") is MemberStatus.SUSPECT  # at once, not at the end of the probe period
    d.run_until(d.now + 30, stop=lambda: d.dead_at is not None)
    # 0.5 s, where 3 members' unconfirmed suspicion runs 24 s.
    assert d.dead_at - refused_at == pytest.approx(MeshConfig.lan().no_listener_suspicion_s), d.dead_at - refused_at
    assert d.swim.stats["listeners_refused"] == 1


def test_without_a_refusal_the_same_crash_waits_the_suspicion_timeout():
    d = Driver()
    d.run_until(10)
    crash_x_and_wait_for_a_check(d)
    started = d.now
    d.run_until(d.now + 60, stop=lambda: d.dead_at is not None)
    assert d.dead_at - started >= MeshConfig.lan().suspicion_min_s(3)


def test_a_refusal_about_a_life_already_refuted_is_ignored():
    """The refusal came back after the member restarted and refuted at a higher incarnation: about the old
    process, it says nothing of the new one."""
    d = Driver()
    d.run_until(10)
    check = crash_x_and_wait_for_a_check(d)
    d.alive("x", 2, X_ADDR)  # the new process's Alive overtakes our check's answer
    d.handle(ListenerRefused("x", check.incarnation))
    assert d.swim.stats["listeners_refused"] == 0
    d.handle(PacketIn(Y_ADDR, [Suspect(2, "x", "y")]))  # the new life is suspected in turn
    suspected_at = d.now
    d.run_until(d.now + 60, stop=lambda: d.dead_at is not None)
    assert d.dead_at - suspected_at >= MeshConfig.lan().suspicion_min_s(3)


def test_an_ack_after_a_refusal_clears_it():
    """The member answered after all (its port was closed a moment, or the refusal came from elsewhere): the
    suspicion the refusal raised goes back to the usual timeout, time for it to refute."""
    d = Driver()
    d.run_until(10)
    check = crash_x_and_wait_for_a_check(d)
    d.handle(ListenerRefused("x", check.incarnation))
    assert d.status("x") is MemberStatus.SUSPECT  # at once, not at the end of the probe period
    d.handle(PacketIn(X_ADDR, [Ack(d.last_ping_to_x, "x")]))  # late, within the probe period
    d.run_until(d.now + 3)
    assert d.dead_at is None and d.status("x") is MemberStatus.SUSPECT
    d.alive("x", check.incarnation + 1, X_ADDR)  # it heard of the suspicion and refutes
    assert d.status("x") is MemberStatus.ALIVE


def test_a_refusal_overrides_the_longest_timeout_of_a_member_that_was_slow():
    """A member that refuted a suspicion lately gets the longest timeout (it is slow, not gone); if its
    process then crashes, nothing listens and there is nothing left to wait for."""
    d = Driver()
    d.run_until(10)
    d.handle(PacketIn(Y_ADDR, [Suspect(1, "x", "y")]))
    d.alive("x", 2, X_ADDR)  # refuted: remembered as slow for refuted_memory_s
    assert d.swim.stats["suspicions_refuted"] == 1
    check = crash_x_and_wait_for_a_check(d)
    refused_at = d.now
    d.handle(ListenerRefused("x", check.incarnation))
    d.run_until(d.now + 60, stop=lambda: d.dead_at is not None)
    assert d.dead_at - refused_at == pytest.approx(MeshConfig.lan().no_listener_suspicion_s)


def test_no_check_when_switched_off():
    d = Driver(no_listener_suspicion_s=None)
    d.run_until(10)
    d.x_up = False
    d.run_until(40, stop=lambda: d.dead_at is not None)
    assert not d.checks and d.dead_at is not None


def test_a_loop_that_runs_late_asks_with_no_time_left_never_a_negative_one():
    """Under load the agent's timer fires past the probe's end: the check then has 0 s, and the driver's
    ``trio.move_on_after`` must not be handed a negative timeout (it raised, logged as a handler error)."""
    d = Driver()
    d.run_until(10)
    d.x_up = False
    for _ in range(200):
        if d.checks:
            break
        d.now = d.swim.next_deadline() + 5.0  # every timer handled five seconds late
        d.handle(Tick())
    assert d.checks and all(check.timeout_s >= 0 for check in d.checks), d.checks

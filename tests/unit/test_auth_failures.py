"""Frames that fail authentication, by host (mesh/auth_failures.py): one test per rule."""

from __future__ import annotations

from mesh.auth_failures import AuthFailures

HOST, MEMBER, GUESSER = "10.0.0.9", "10.0.0.9:7946", "10.0.0.9:40001"


def guesses(failures: AuthFailures, count: int, now: float) -> list[str]:
    return [line for line in (failures.failed(HOST, now, "packet") for _ in range(count)) if line]


def test_the_first_failure_of_a_window_is_said_once_naming_the_host():
    failures = AuthFailures(window_s=60, mute_after=64)
    lines = guesses(failures, 10, 0.0)
    assert len(lines) == 1 and "a packet from 10.0.0.9 failed authentication" in lines[0]
    assert guesses(failures, 10, 30.0) == []
    assert len(guesses(failures, 1, 61.0)) == 1  # a new window says it again


def test_a_host_past_the_bound_is_muted_for_a_window_and_said_so():
    failures = AuthFailures(window_s=60, mute_after=64)
    lines = guesses(failures, 64, 5.0)
    assert len(lines) == 2 and "64 packets or stream hellos from 10.0.0.9" in lines[1]
    assert failures.muted(HOST, GUESSER, 6.0) and failures.muted(HOST, "", 6.0)
    assert not failures.muted(HOST, GUESSER, 65.0)  # the window is over
    assert not failures.muted("10.0.0.10", "10.0.0.10:1", 6.0)  # another host is not


def test_an_address_that_opened_keeps_opening_while_its_host_is_muted():
    # Members on the guesser's host (one machine), or a member whose address the guesser spoofs.
    failures = AuthFailures(window_s=60, mute_after=64)
    failures.succeeded(HOST, MEMBER, 1.0)
    guesses(failures, 100, 2.0)
    assert not failures.muted(HOST, MEMBER, 3.0) and failures.muted(HOST, GUESSER, 3.0)
    assert not failures.muted(HOST, "", 3.0)  # a hello: some address of the host opened lately
    assert failures.muted(HOST, MEMBER, 61.5)  # a member silent for a whole window is not known any more


def test_what_is_held_is_bounded():
    failures = AuthFailures(hosts_max=8, addresses_max=4)
    for i in range(100):
        failures.failed(f"10.1.0.{i}", 0.0, "packet")
        failures.succeeded(HOST, f"{HOST}:{i}", 0.0)
    assert len(failures._hosts) == 8 and len(failures._hosts[HOST].good) == 4

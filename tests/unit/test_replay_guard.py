"""Replay protection of sealed mesh packets and frames (mesh/crypto.py): one rule per test, time passed in."""

from __future__ import annotations

import random

from mesh.crypto import REPLAY_COUNTERS_WINDOW, REPLAY_WINDOW_S, Keyring, ReplayGuard, Sealer, generate_key

KEY = generate_key()
S1, S2 = b"sender-1", b"sender-2"


def test_a_new_counter_is_accepted_once():
    guard = ReplayGuard()
    assert guard.check(S1, b"l", 1, 100.0, 100.0) is None
    assert guard.check(S1, b"l", 1, 100.0, 100.5) == "replay"


def test_counters_may_arrive_out_of_order_but_never_twice():
    guard = ReplayGuard()
    seed = random.randrange(2 ** 32)
    rng = random.Random(seed)
    counters = list(range(1, 2000))
    rng.shuffle(counters)
    for c in counters:
        assert guard.check(S1, b"l", c, 10.0, 10.0) is None, f"seed {seed}"
    for c in rng.sample(counters, 200):
        assert guard.check(S1, b"l", c, 10.0, 10.0) == "replay", f"seed {seed}"


def test_a_counter_older_than_the_window_is_refused():
    guard = ReplayGuard()
    assert guard.check(S1, b"l", REPLAY_COUNTERS_WINDOW + 10, 0.0, 0.0) is None
    assert guard.check(S1, b"l", 5, 0.0, 0.0) == "replay_too_old"


def test_senders_and_labels_count_apart():
    guard = ReplayGuard()
    assert guard.check(S1, b"gossip", 1, 0.0, 0.0) is None
    assert guard.check(S2, b"gossip", 1, 0.0, 0.0) is None
    assert guard.check(S1, b"stream", 1, 0.0, 0.0) is None


def test_a_frame_outside_the_time_window_is_stale_either_way():
    guard = ReplayGuard()
    assert guard.check(S1, b"l", 1, 0.0, REPLAY_WINDOW_S + 1) == "stale"
    assert guard.check(S1, b"l", 2, REPLAY_WINDOW_S + 1, 0.0) == "stale"
    assert len(guard) == 0  # nothing remembered for refused frames


def test_forgetting_a_silent_sender_cannot_reopen_a_replay():
    guard = ReplayGuard(window_s=10.0)
    assert guard.check(S1, b"l", 7, 0.0, 0.0) is None
    assert guard.check(S2, b"l", 1, 25.0, 25.0) is None  # sweeps S1 (silent for > 2 windows)
    assert len(guard) == 1
    assert guard.check(S1, b"l", 7, 0.0, 25.0) == "stale"  # its frame is now too old anyway


def test_a_full_table_refuses_new_senders_until_old_ones_expire():
    guard = ReplayGuard(window_s=10.0, senders_max=2)
    assert guard.check(S1, b"l", 1, 0.0, 0.0) is None
    assert guard.check(S2, b"l", 1, 0.0, 0.0) is None
    assert guard.check(b"sender-3", b"l", 1, 0.0, 0.0) == "replay_table_full"
    assert guard.check(b"sender-3", b"l", 1, 30.0, 30.0) is None


def test_sealer_round_trip_and_replay_of_a_recorded_frame():
    a, b = Sealer(Keyring([KEY])), Sealer(Keyring([KEY]))
    frame = a.seal(b"rate-limit hits", b"smg-node/push-pull", 1000.0)
    assert b.open(frame, b"smg-node/push-pull", 1000.1) == (b"rate-limit hits", None)
    for _ in range(10):  # the attack: the same recorded frame sent ten times
        assert b.open(frame, b"smg-node/push-pull", 1000.2) == (None, "replay")
    assert b.open(frame, b"smg-node/gossip", 1000.2) == (None, "decrypt")  # nor into another protocol


def test_sealer_refuses_a_capture_replayed_after_the_window():
    a, b = Sealer(Keyring([KEY])), Sealer(Keyring([KEY]))
    frame = a.seal(b"x", b"l", 0.0)
    assert b.open(frame, b"l", REPLAY_WINDOW_S + 5) == (None, "stale")


def test_sealer_without_keys_passes_payloads_through():
    plain = Sealer(Keyring([]))
    assert plain.seal(b"x", b"l", 0.0) == b"x" and plain.open(b"x", b"l", 0.0) == (b"x", None)


def test_a_restarted_sender_starts_its_counter_again():
    b = Sealer(Keyring([KEY]))
    first = Sealer(Keyring([KEY]))
    assert b.open(first.seal(b"1", b"l", 5.0), b"l", 5.0)[0] == b"1"
    restarted = Sealer(Keyring([KEY]))  # a new process: a new sender id, counter from 1
    assert b.open(restarted.seal(b"2", b"l", 6.0), b"l", 6.0)[0] == b"2"

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


def test_a_sealed_frame_carries_33_bytes_more_than_its_payload():
    from mesh.crypto import SEAL_OVERHEAD_BYTES
    frame = Sealer(Keyring([KEY])).seal(b"p" * 40, b"l", 10.0)
    assert len(frame) == 40 + SEAL_OVERHEAD_BYTES == 73  # version 1, nonce 12, tag 16, time 4


def test_rewriting_a_captured_frames_sender_or_counter_fails_its_tag():
    """The attack: replay a recorded frame under a counter (or sender) the receiver has not seen.
    Sender and counter are the nonce, which GCM authenticates: the frame no longer opens."""
    a, b = Sealer(Keyring([KEY])), Sealer(Keyring([KEY]))
    frame = a.seal(b"dead n1", b"l", 50.0)
    assert b.open(frame, b"l", 50.0) == (b"dead n1", None)
    fresh_counter = frame[:9] + (2 ** 31).to_bytes(4, "big") + frame[13:]
    other_sender = frame[:1] + b"intruder" + frame[9:]
    assert b.open(fresh_counter, b"l", 50.0) == (None, "decrypt")
    assert b.open(other_sender, b"l", 50.0) == (None, "decrypt")
    older_version = bytes([2]) + frame[1:]
    assert b.open(older_version, b"l", 50.0) == (None, "seal_version")  # refused, and named as another version


def test_nonces_never_repeat_even_when_the_counter_would_wrap():
    from mesh.crypto import COUNTER_MAX
    a, b = Sealer(Keyring([KEY])), Sealer(Keyring([KEY]))
    nonces = {a.seal(b"x", b"l", 1.0)[1:13] for _ in range(1000)}
    assert len(nonces) == 1000
    first_sender = a.sender
    a._counter = COUNTER_MAX - 1
    last = a.seal(b"last", b"l", 1.0)
    wrapped = a.seal(b"after", b"l", 1.0)
    assert last[1:9] == first_sender and last[9:13] == COUNTER_MAX.to_bytes(4, "big")
    assert wrapped[1:9] == a.sender != first_sender and wrapped[9:13] == (1).to_bytes(4, "big")
    assert b.open(last, b"l", 1.0)[0] == b"last" and b.open(wrapped, b"l", 1.0)[0] == b"after"


def test_a_key_holders_frame_with_extreme_values_is_refused_or_taken_never_raises():
    """Sealed format v3 decodes a 4-byte counter from the nonce and 4 bytes of time from the plaintext: a key
    holder may put anything in them, or send a plaintext too short to hold the time. Seeded, printed on failure."""
    seed = random.randrange(2 ** 32)
    rng = random.Random(seed)
    ring = Keyring([KEY])
    receiver = Sealer(Keyring([KEY]))
    extremes = [0, 1, 2 ** 31, 2 ** 32 - 1]
    outcomes = set()
    for _ in range(400):
        sender = rng.choice([b"\x00" * 8, b"\xff" * 8, rng.randbytes(8)])
        counter = rng.choice(extremes + [rng.randrange(2 ** 32)])
        plain = rng.choice([b"", b"\x00", b"\xff\xff\xff", (rng.choice(extremes)).to_bytes(4, "big") + rng.randbytes(3),
                            int(1000.0).to_bytes(4, "big") + b"payload"])
        frame = ring.seal(plain, b"l", sender + counter.to_bytes(4, "big"))
        payload, reason = receiver.open(frame, b"l", 1000.0)
        assert (payload is None) != (reason is None), f"seed {seed}"
        outcomes.add(reason)
        for cut in (0, 1, 13, len(frame) - 1):  # and every truncation of it
            assert receiver.open(frame[:cut], b"l", 1000.0) == (None, "decrypt"), f"seed {seed}"
    assert {"malformed", "stale"} <= outcomes, f"seed {seed}"

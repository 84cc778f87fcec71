"""The gossip wire format never raises on garbage; the keyring rotates without downtime."""

import random

import msgpack
import pytest

from mesh.broadcast import BroadcastQueue
from mesh.crypto import Keyring, KeyringError, fingerprint_of, generate_key
from mesh.wire import (
    Ack,
    Alive,
    Dead,
    IndirectPing,
    MemberState,
    Nack,
    Ping,
    PushPull,
    Suspect,
    User,
    decode_packet,
    decode_push_pull,
    encode_message,
    encode_packet,
    encode_push_pull,
)

MESSAGES = [Ping(1, "b", "a", "a:1"), IndirectPing(2, "c", "c:1", "a", "a:1", True), Ack(3, "b"), Nack(4, "b"),
            Suspect(5, "c", "a"), Alive(6, "d", "d:1", (("role", "gw"), ("zone", "a"))), Dead(7, "e", "e"),
            User(b"\x00\xff payload")]


def test_every_message_round_trips_in_a_compound_packet():
    data = encode_packet([encode_message(m) for m in MESSAGES])
    assert decode_packet(data, 10_000) == (MESSAGES, None)


def test_push_pull_round_trips():
    pp = PushPull(True, (MemberState("a", "a:1", 3, 1, (("k", "v"),)),), b"user")
    assert decode_push_pull(encode_push_pull(pp), 10_000) == (pp, None)


@pytest.mark.parametrize("data, reason", [
    (b"", "malformed"),
    (b"\xc1", "malformed"),
    (msgpack.packb([99, []]), "bad_version"),
    (msgpack.packb([1, [[42, 1]]]), "unknown_message_type"),
    (msgpack.packb([1, [[0, "x", "b", "a", "a:1"]]]), "bad_int"),
    (msgpack.packb([1, [[0, 1, "b"]]]), "bad_field_count"),
    (msgpack.packb([1, [[4, 1, "", "a"]]]), "bad_name"),
    (msgpack.packb([1, [[5, 1, "d", "d:1", {"k": 1}]]]), "bad_tags"),
    (b"x" * 3000, "too_large"),
])
def test_bad_packets_are_dropped_with_a_reason(data, reason):
    assert decode_packet(data, 2000) == ([], reason)


@pytest.mark.parametrize("seed", range(20))
def test_random_garbage_and_mutations_never_raise(seed):
    rng = random.Random(seed)
    good = encode_packet([encode_message(m) for m in MESSAGES])
    for _ in range(200):
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        else:
            data = bytearray(good)
            for _ in range(rng.randint(1, 5)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        messages, reason = decode_packet(data, 2000)
        assert (messages == []) == (reason is not None), f"seed={seed}"
        decode_push_pull(data, 2000)


def test_seal_and_open():
    ring = Keyring([generate_key()])
    sealed = ring.seal(b"secret", b"label")
    assert b"secret" not in sealed and ring.open(sealed, b"label") == b"secret"
    assert ring.open(sealed, b"other-label") is None
    assert ring.open(sealed[:-1] + bytes([sealed[-1] ^ 1]), b"label") is None


def test_rotation_without_downtime():
    old, new = generate_key(), generate_key()
    a, b = Keyring([old]), Keyring([old])
    for ring in (a, b):
        ring.install(new)  # step 1: everyone accepts the new key
    a.use(new)  # step 2: one by one, send with it
    assert b.open(a.seal(b"x", b"l"), b"l") == b"x" and a.open(b.seal(b"y", b"l"), b"l") == b"y"
    b.use(new)
    for ring in (a, b):
        ring.remove(old)  # step 3: retire the old key
    assert a.open(b.seal(b"z", b"l"), b"l") == b"z" and a.fingerprints() == [fingerprint_of(new)]
    assert Keyring([old]).open(a.seal(b"z", b"l"), b"l") is None


def test_keyring_refuses_bad_keys_and_removing_the_primary():
    with pytest.raises(KeyringError):
        Keyring(["not base64!"])
    with pytest.raises(KeyringError):
        Keyring(["AAAA"])
    k = generate_key()
    with pytest.raises(KeyringError):
        Keyring([k]).remove(k)
    with pytest.raises(KeyringError):
        Keyring([k]).use(generate_key())


def test_broadcast_queue_newest_and_least_sent_first_and_replaced_by_key():
    q = BroadcastQueue()
    q.queue(b"a1", key="a")
    q.queue(b"b1", key="b")
    q.queue(b"a2", key="a")  # replaces a1
    assert q.take(100, limit=2) == [b"a2", b"b1"]
    q.queue(b"c1", key="c")
    assert q.take(100, limit=2)[0] == b"c1"  # never sent beats sent once
    assert len(q) == 1 and q.take(100, limit=2) == [b"c1"] and len(q) == 0


def test_broadcast_queue_respects_the_budget():
    q = BroadcastQueue()
    for i in range(10):
        q.queue(bytes(100), key=str(i))
    assert len(q.take(350, limit=3)) == 3

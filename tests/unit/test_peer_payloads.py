"""Every decoder of a peer's payload, fed random and extreme values: the node stays up and its state valid.

For each payload a member can send (the worker document's updates, history frames, KV batches, rate-limit
protobufs, cluster settings, gossip packets), valid frames made by our own encoders are mutated one field at
a time with values at the edges (2^64 - 1, -1, NaN, huge strings, wrong types; ``tests/peer_values.py``),
or as bytes. After each one, whatever the decoder answered: nothing raised but the decoder's own refusal,
and the state it guards still encodes, accepts an ordinary write, and holds only numbers in range. Issue
33's crash (an epoch of 2^64 - 1 adopted, then + 1 at the next compaction) is the kind of case this finds.
Seeded: a failure names the seed and the case number; the same seed replays it.
"""

from __future__ import annotations

import json
import math
import random

import msgpack
import orjson
import pycrdt
import pytest
import trio

from gateway.auth.key_store import KeyStore, KeyStoreError, StoredKey
from gateway.cluster.kv_sharing import KvSharing
from gateway.cluster.peer_requests import PeerRequests
from gateway.history import HistoryConfig, MemoryHistory, StoredResponse
from gateway.history.shards import VERSION_MAX
from gateway.history.wire import change_to_wire, pack, unpack
from gateway.ratelimit import Algorithm, LimitSet, Mode, Rate, RateLimitConfig, RateLimiter
from gateway.ratelimit.algorithms import KeyState
from gateway.ratelimit.limits import LimitConfigError, parse_limit_set
from gateway.api.ratelimits import rate_limit_headers
from gateway.ratelimit.limiter import KeyOutcome, Verdict
from gateway.ratelimit.peer import (METHOD_DECIDE, METHOD_REPLICATE, ItemError, decision_from_pb, rate_to_pb,
                                    state_to_pb)
from gateway.routing.kv_index import KvIndex
from mesh.ring import HashRing
from mesh.wire import decode_packet, decode_push_pull, encode_message, encode_packet, encode_push_pull
from mesh.worker_doc import EPOCH_MAX, STAMP_AHEAD_MAX_S, DocError, WorkerDoc
from proto import ratelimit_pb2 as pb
from tests.support.peer_values import extreme, mutate, mutate_bytes

SEEDS = range(4)
CASES = 150
NOW_S = 1_790_000_000.0
UINT64_MAX = 2 ** 64 - 1


def _where(seed: int, case: int) -> str:
    return f"seed={seed} case={case} (tests/unit/test_peer_payloads.py; the same seed replays it)"


# -- the worker document ----------------------------------------------------------------------------------

def _raw_update(entries: dict, epoch: int) -> bytes:
    doc = pycrdt.Doc()
    with doc.transaction():
        for (map_name, key), raw in entries.items():
            doc.get(map_name, type=pycrdt.Map)[key] = raw
    return msgpack.packb([epoch, doc.get_update()])


def _doc_payload(rng: random.Random, peer: WorkerDoc) -> bytes:
    move = rng.random()
    if move < 0.3:  # a real update or state with the epoch or the update bytes changed
        epoch, update = msgpack.unpackb(peer.state() if rng.random() < 0.5 else peer.register("w9", {"url": "u"}))
        fields = mutate(rng, [epoch, update])
        if rng.random() < 0.4 and isinstance(fields, list) and len(fields) == 2 and isinstance(fields[1], bytes):
            fields[1] = mutate_bytes(rng, fields[1])
        try:
            return msgpack.packb(fields)
        except (OverflowError, TypeError, ValueError):
            return msgpack.packb([rng.choice((0, 1, EPOCH_MAX, EPOCH_MAX + 1)), update])
    # A crafted document: an entry as a key holder could write it, one field extreme.
    entry = mutate(rng, {"url": "grpc://10.0.0.1:1", "model": "m", "removed": False, "t": int(NOW_S * 1000),
                         "by": "evil"})
    try:
        raw = json.dumps(entry)  # NaN, infinities and ints past 64 bits included, as a crafted text would
    except (TypeError, ValueError):
        raw = str(entry)
    key = rng.choice(("w1", "x" * 300, "", "api_key:abc", "rate_limits"))
    map_name = rng.choice(("workers", "health", "settings"))
    return _raw_update({(map_name, key): raw}, rng.choice((0, 0, 1, EPOCH_MAX, EPOCH_MAX + 1, UINT64_MAX)))


def _check_doc(doc: WorkerDoc, where: str) -> None:
    assert 0 <= doc.epoch <= EPOCH_MAX, where
    epoch, _ = msgpack.unpackb(doc.state())
    assert epoch == doc.epoch, where
    for name in ("workers", "health", "settings"):
        for _, value in doc._items(name):
            assert isinstance(value["t"], int) and 0 <= value["t"] <= (NOW_S + STAMP_AHEAD_MAX_S) * 1000, where
    # An ordinary write and a compaction still encode (the crash of issue 33 was here).
    assert msgpack.unpackb(doc.register("w-ok", {"url": "grpc://ok:1"}))[0] == doc.epoch, where
    doc.compact_bytes = 1
    compacted = doc.maybe_compact()
    assert compacted is None or msgpack.unpackb(compacted)[0] == doc.epoch, where
    doc.compact_bytes = 64 * 1024


@pytest.mark.parametrize("seed", SEEDS)
def test_worker_document_updates(seed):
    rng = random.Random(seed)
    peer = WorkerDoc("peer", clock=lambda: NOW_S)
    peer.register("w1", {"url": "grpc://a:1"})
    peer.set_setting("rate_limits", {"limits": []})
    doc = WorkerDoc("me", clock=lambda: NOW_S)
    doc.merge(peer.state())
    for case in range(CASES):
        where = _where(seed, case)
        before = doc.state()
        try:
            doc.merge(_doc_payload(rng, peer))
        except DocError:
            assert doc.state() == before, f"a refused update changed the document: {where}"
        _check_doc(doc, where)


# -- stored history -------------------------------------------------------------------------------------

def _history_frames(history: MemoryHistory) -> list:
    shard = history.shards.peek("resp_a")
    change = change_to_wire(shard.whole())
    return [
        ["rep", [change]],
        ["rep", [[*change[:3], change[3] + 1, change[4], change[3], None, [["i", b"{}"]], [], False]]],
        ["op", "put_response", "resp_b", "tenant:x", [b'{"response": {}, "input_items": [], "history": []}']],
        ["op", "update_conversation", "conv_a", "tenant:x", [b'{"k": "v"}']],
        ["op", "add_items", "conv_a", "tenant:x", [[["item_1", b'{"id": "item_1"}']]]],
        ["op", "list_items", "conv_a", "tenant:x", ["", 20, False]],
        ["fetch", "resp_a"],
        ["sync", "peer", "", 1024],
    ]


def _check_history(history: MemoryHistory, where: str) -> None:
    shards = history.shards
    total = 0
    for shard_id in shards.ids():
        shard = shards.peek(shard_id)
        assert 0 < shard.version <= VERSION_MAX and math.isfinite(shard.written_at_s), where
        assert shard.written_at_s <= NOW_S + 600, where
        unpack(pack(change_to_wire(shard.whole())))  # every shard still encodes to send on
        total += shard.size_bytes
    assert total == shards.bytes >= 0, where


@pytest.mark.parametrize("seed", SEEDS)
async def test_history_frames(seed):
    rng = random.Random(seed)
    history = MemoryHistory(HistoryConfig(), wall_clock=lambda: NOW_S)
    await history.put_response(StoredResponse("resp_a", "tenant:x", {"id": "resp_a"}, (), ()))
    await history.create_conversation({"id": "conv_a", "metadata": {}}, "tenant:x", [{"id": "item_0"}])
    for case in range(CASES):
        where = _where(seed, case)
        frame = mutate(rng, rng.choice(_history_frames(history)))
        try:
            payload = pack(frame)
        except (OverflowError, TypeError, ValueError):
            payload = mutate_bytes(rng, pack(_history_frames(history)[0]))
        answer = unpack(await history._serve(payload))  # never raises; always a readable answer
        assert isinstance(answer, list) and answer, where
        _check_history(history, where)
        # The store still takes an ordinary write and reads it back.
        await history.put_response(StoredResponse("resp_ok", "tenant:y", {"n": case}, (), ()))
        assert (await history.get_response("resp_ok", "tenant:y")).response == {"n": case}, where


# -- the KV index shared between nodes -------------------------------------------------------------------

class _KvCluster:
    node_name = "me"
    ring = HashRing.build(["me", "peer"])
    agent = None
    doc = None

    def __init__(self) -> None:
        self.peer_requests = PeerRequests()

    def serve_requests(self, mark, handler):
        self.peer_requests.register(mark, handler)

    def owners(self, key, count, ring=None):  # every member a machine of its own
        return (ring or self.ring).placement(key, count, lambda member: member)


def _kv_message(rng: random.Random) -> list:
    snapshot = ["e", 1, True, 16, [[2], [0, [[5, 9], [6, 10]]]]]
    batch = ["e", 2, False, 16, [[0, [[7, 11]]], [1, [9]]]]
    return mutate(rng, rng.choice((["kv_batches", "peer", [snapshot, batch]], ["kv_replay", "e", 0])))


@pytest.mark.parametrize("seed", SEEDS)
async def test_kv_batches(seed):
    rng = random.Random(seed)
    index = KvIndex()
    sharing = KvSharing(_KvCluster(), index, followers=2)
    for case in range(CASES):
        where = _where(seed, case)
        try:
            payload = msgpack.packb(_kv_message(rng))
        except (OverflowError, TypeError, ValueError):
            payload = mutate_bytes(rng, msgpack.packb(["kv_replay", "e", 0]))
        msgpack.unpackb(await sharing.on_frame(payload))
        for engine_id in index.engines():
            # What this node would send on (a replay, a snapshot) still encodes, and the next number too.
            msgpack.packb([index.export_ops(engine_id), index.next_sequence(engine_id) + 1])
            msgpack.packb(sharing._replay_items(engine_id, 0))
        assert len(index.engines()) <= 4096, where


# -- rate limits: decisions and replicated states --------------------------------------------------------

RATE = Rate(Algorithm.TOKEN_BUCKET, 10, 1.0, 10)
LIMIT = parse_limit_set({"limits": [{"name": "l", "scope": "api_key", "unit": "requests", "limit": 10,
                                     "window_s": 1}]}).limits[0]


def _set(message, rng: random.Random) -> None:
    """One field of a protobuf message (or of a nested one) set to an extreme value it can hold."""
    fields = message.DESCRIPTOR.fields
    field = rng.choice(fields)
    if field.is_repeated:
        return
    if field.message_type is not None:
        _set(getattr(message, field.name), rng)
        return
    for _ in range(20):
        value = extreme(rng)
        try:
            setattr(message, field.name, value)
            return
        except (TypeError, ValueError, OverflowError):
            continue


def _limiter_frame(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        item = pb.DecideItem(key="k:*", spec=rate_to_pb(RATE), hits=1, mode=Mode.DECIDE)
        _set(item, rng)
        body = METHOD_DECIDE + pb.DecideRequest(sender="peer", items=[item]).SerializeToString()
    else:
        state = state_to_pb("k:*", RATE, KeyState(tat_s=NOW_S, window_index=3, current=1.0, previous=2.0))
        _set(state, rng)
        body = METHOD_REPLICATE + pb.ReplicateRequest(sender=rng.choice(("peer", "me")),
                                                      states=[state]).SerializeToString()
    return mutate_bytes(rng, body) if rng.random() < 0.2 else body


@pytest.mark.parametrize("seed", SEEDS)
async def test_rate_limit_requests(seed):
    rng = random.Random(seed)
    limiter = RateLimiter(RateLimitConfig(), LimitSet(), node_name="me", clock=lambda: NOW_S)
    for case in range(CASES):
        where = _where(seed, case)
        answer = await limiter.on_peer_request(_limiter_frame(rng))
        assert isinstance(answer, bytes), where
        for key in limiter.store.keys():
            entry = limiter.store.get(key)
            state_to_pb(key, entry.rate, entry.state).SerializeToString()  # still sends on
            assert 0 <= entry.state.tat_s <= 2 ** 40 and 0 <= entry.state.window_index <= 2 ** 53, where
            decision = limiter.store.decide(key, entry.rate, NOW_S, 1, Mode.PEEK)
            assert all(math.isfinite(v) for v in (decision.limit, decision.remaining, decision.reset_after_s)), where
        # The owner's answer, as the asking node reads it: refused per item, or numbers its headers can show.
        result = pb.DecideResult(outcome=pb.OUTCOME_ALLOWED, limit=10, remaining=3, reset_after_s=1.0)
        _set(result, rng)
        try:
            decision = decision_from_pb(result)
        except ItemError:
            continue
        rate_limit_headers(Verdict(True, [KeyOutcome(LIMIT, "k", 1.0, decision, "forwarded")]))


# -- cluster settings: rate limits and API keys ----------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_settings_values(seed):
    rng = random.Random(seed)
    limits = {"limits": [{"name": "per-key", "scope": "api_key", "unit": "requests", "limit": 10, "window_s": 60}]}
    record = {"id": "ab12", "name": "k", "role": "user", "sha256": "0" * 64, "created_at": NOW_S, "tenant": "t",
              "models": ["m"], "expires_at": None, "revoked": False}
    store = KeyStore()
    for case in range(CASES):
        where = _where(seed, case)
        try:
            parse_limit_set(mutate(rng, limits))
        except LimitConfigError:
            pass
        crafted = mutate(rng, record)
        if rng.random() < 0.2:  # right lengths, wrong contents: what a length check alone lets through
            crafted = {**record, rng.choice(("sha256", "id")): rng.choice(("z" * 64, "Z" * 16, "0" * 65, "é" * 64))}
        try:
            key = StoredKey.from_record(crafted)
        except KeyStoreError:
            continue
        store.apply(key)  # an accepted record is one the store can hold and show
        orjson.dumps(key.to_record())
        assert len(key.sha256) == 64 and key.id, where


# -- gossip packets and push-pull states ------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_gossip_packets_decode_to_values_that_encode_again(seed):
    from mesh.wire import Alive, MemberState, Ping, PushPull, Suspect
    rng = random.Random(seed)
    packet = msgpack.unpackb(encode_packet([encode_message(m) for m in (
        Ping(1, "b", "a", "a:1"), Suspect(5, "c", "a"), Alive(6, "d", "d:1", (("node", "n"),)))]))
    state = msgpack.unpackb(encode_push_pull(PushPull(True, (MemberState("a", "a:1", 3, 1, (("k", "v"),)),), b"u")))
    for case in range(CASES):
        where = _where(seed, case)
        for valid, decode in ((packet, decode_packet), (state, decode_push_pull)):
            try:
                data = msgpack.packb(mutate(rng, valid))
            except (OverflowError, TypeError, ValueError):
                continue
            decoded, reason = decode(data, 65_536)
            if reason is not None:
                continue
            if decode is decode_packet:
                for message in decoded:
                    encode_message(message)  # arithmetic on these (a refutation's + 1) stays encodable
                    if hasattr(message, "incarnation"):
                        assert message.incarnation < 2 ** 32, where
            else:
                encode_push_pull(decoded)


async def test_a_whole_node_survives_the_issue_33_frame_through_its_cluster_state(autojump_clock):
    """The attack as it was run: a gossip update at epoch 2^64 - 1, then an ordinary admin write."""
    from gateway.cluster import ClusterState
    cluster = ClusterState("me")
    evil = msgpack.packb([UINT64_MAX, pycrdt.Doc().get_update()])
    cluster.notify(evil)
    cluster.merge_remote_state(evil, join=False)
    assert cluster.dropped_updates == 2 and cluster.doc.epoch == 0
    cluster.doc.compact_bytes = 1
    cluster.register("w1", {"url": "grpc://10.0.0.1:1", "model": "m"})  # the write that ended every node
    assert cluster.doc.epoch == 1 and set(cluster.doc.workers()) == {"w1"}
    await trio.lowlevel.checkpoint()


# -- the spend ledger's rows and the response cache's answers ------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
async def test_spend_ledger_frames(seed):
    from gateway.base import packing
    from gateway.spend.exchange import METHOD_PULL, METHOD_PUSH, SpendExchange
    from gateway.spend.ledger import VALUE_FIELDS, SpendLedger, report

    rng = random.Random(seed)
    ledger = SpendLedger("me")
    exchange = SpendExchange(ledger, None, clock=lambda: NOW_S)
    row = ["2026-09-20", "key:a", "t", "m", "pool:m", 1, 10, 0, 5, 0, 0.5]
    for case in range(CASES):
        where = _where(seed, case)
        if rng.random() < 0.5:
            payload = METHOD_PUSH + packing.pack(mutate(rng, ["peer", [row, row]]))
        else:
            payload = METHOD_PULL + packing.pack(mutate(rng, 0))
        if rng.random() < 0.2:
            payload = mutate_bytes(rng, payload)
        await exchange.on_peer_request(payload)  # never raises: a refusal is an empty answer, counted
        for origin, table in ledger.origins.items():
            assert isinstance(origin, str) and 0 < len(origin) <= 256, where
            for values in table.values():
                assert len(values) == len(VALUE_FIELDS), where
                assert all(math.isfinite(v) and 0 <= v <= 1e18 for v in values), where
        report(ledger, ("day", "key", "tenant", "model", "target"))  # still reads
        ledger.add(NOW_S, "key:b", None, "m", "pool:m", 1, 1, 0, 1, 0, 0.1)  # still counts


@pytest.mark.parametrize("seed", SEEDS)
async def test_response_cache_frames(seed):
    from gateway.base import packing
    from gateway.cache import CacheConfig, Entry, ResponseCache

    rng = random.Random(seed)
    cache = ResponseCache(CacheConfig(enabled=True), clock=lambda: NOW_S)
    put = ["k", "tenant:a", b"application/json", b"{}", False, [10, 5, 0, 0], 60.0]
    for case in range(CASES):
        where = _where(seed, case)
        payload = (b"P" + packing.pack(mutate(rng, put)) if rng.random() < 0.6
                   else b"G" + packing.pack(mutate(rng, ["k", "tenant:a"])))
        if rng.random() < 0.2:
            payload = mutate_bytes(rng, payload)
        await cache.on_peer_request(payload)  # never raises
        store = cache.store
        assert 0 <= store.bytes <= cache.config.bytes_max, where
        for key in list(store._entries):
            entry = store._entries[key]
            assert isinstance(entry.body, bytes) and math.isfinite(entry.expires_at_s), where
            assert entry.expires_at_s <= NOW_S + cache.config.ttl_s, where
        assert cache.store.put(f"ok{case}", Entry("tenant:b", b"t", b"x", False, (1, 1, 0, 0), NOW_S + 1), NOW_S), where

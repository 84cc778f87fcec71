"""The memory backend's parts without I/O: versioned shards and their bounds (gateway/history/shards.py),
the operations scoped to an owner (ops.py), the peer frames and their checks (wire.py), and the
lone-node store (memory.py without a mesh)."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from mesh.ring import HashRing

from gateway.history import HistoryConfig, MemoryHistory, RecordTooLarge, StorageQuotaExceeded, StoredResponse
from gateway.history.memory import HAVE_BATCH_MAX
from gateway.history.ops import HistoryOps
from gateway.history.shards import REPLICA_QUOTA_SLACK, MemoryShards
from gateway.history.wire import BadFrame, change_from_wire, change_to_wire, operation_from_wire, pack, unpack


def ops(**config) -> HistoryOps:
    return HistoryOps(MemoryShards(HistoryConfig(**config)))


def put(o: HistoryOps, rid: str, owner="a", now=0.0, size=10):
    return o.put_response(rid, owner, b'{"pad":"' + b"x" * size + b'"}', now)


def test_owner_scoping_and_delete():
    o = ops()
    put(o, "r1")
    assert o.get_response("r1", "a", 1.0) is not None
    assert o.get_response("r1", "b", 1.0) is None and o.delete_response("r1", "b", 1.0) == (False, None)
    deleted, change = o.delete_response("r1", "a", 1.0)
    assert deleted and change.deleted and o.get_response("r1", "a", 1.0) is None
    assert o.get_conversation("r1", "a", 1.0) is None  # kinds do not mix


ONE_TENANT = {"tenant_max_bytes": 10 ** 9, "tenant_max_responses": 10 ** 6, "tenant_max_conversations": 10 ** 6,
              "tenant_max_items": 10 ** 6}  # the node's own bounds alone


def test_bounded_by_count_items_and_bytes_least_recently_used_first():
    o = ops(max_responses=3, **ONE_TENANT)
    for i in range(3):
        put(o, f"r{i}")
    o.get_response("r0", "a", 1.0)  # used: r1 is now the least recent
    put(o, "r3")
    assert [r for r in ("r0", "r1", "r2", "r3") if o.get_response(r, "a", 2.0)] == ["r0", "r2", "r3"]
    by_bytes = ops(max_bytes=2000, **ONE_TENANT)  # a 300-byte response is counted ~700 bytes
    for i in range(10):
        put(by_bytes, f"b{i}", size=300)
    assert len(by_bytes.shards) == 2 and by_bytes.get_response("b9", "a", 1.0) is not None
    by_items = ops(max_items=10, **ONE_TENANT)
    for i in range(3):
        by_items.create_conversation(f"c{i}", "a", b"{}", [(f"i{j}", b"{}") for j in range(3)], 0.0)
    assert [c for c in ("c0", "c1", "c2") if by_items.get_conversation(c, "a", 1.0)] == ["c1", "c2"]


def test_a_write_past_its_owners_quota_is_refused_before_anything_changes():
    o = ops(max_responses=8, max_items=40)  # a tenant may hold a quarter: 2 responses, 2 conversations, 10 items
    put(o, "r1")
    put(o, "r2")
    with pytest.raises(StorageQuotaExceeded, match="2 stored responses"):
        put(o, "r3")
    put(o, "r2", size=20)  # a new version of one it holds is no new record
    put(o, "x1", owner="b")  # another tenant is not held back by this one
    o.create_conversation("c1", "a", b"{}", [(f"i{j}", b"{}") for j in range(6)], 0.0)
    with pytest.raises(StorageQuotaExceeded, match="10 conversation items"):
        o.add_items("c1", "a", [(f"j{j}", b"{}") for j in range(5)], 1.0)
    o.create_conversation("c2", "a", b"{}", [], 0.0)
    with pytest.raises(StorageQuotaExceeded, match="2 conversations"):
        o.create_conversation("c3", "a", b"{}", [], 0.0)
    by_bytes = ops(max_bytes=4000)  # a quarter: 1,000 bytes
    put(by_bytes, "small", size=100)
    with pytest.raises(StorageQuotaExceeded, match="1000 bytes"):
        put(by_bytes, "big", size=500)
    assert by_bytes.shards.refused_quota == 1 and len(by_bytes.shards) == 1
    with pytest.raises(RecordTooLarge):
        ops(record_bytes_max=500).put_response("r", "a", b"x" * 600, 0.0)


def test_one_tenant_cannot_evict_another_tenants_data():
    # Issue 33: a tenant created conversations until another tenant's response and conversation were gone.
    o = ops(max_bytes=200_000)
    put(o, "victim-response", owner="tenant:b", size=2000)
    o.create_conversation("victim-conversation", "tenant:b", b"{}", [("i", b"x" * 2000)], 0.0)
    refused = 0
    for n in range(100):
        try:
            o.create_conversation(f"flood{n}", "tenant:a", b"{}", [("i", b"x" * 9000)], float(n))
        except StorageQuotaExceeded:
            refused += 1
    assert refused > 90 and o.shards.usage("tenant:a").bytes <= 50_000
    assert o.get_response("victim-response", "tenant:b", 200.0) is not None
    assert o.get_conversation("victim-conversation", "tenant:b", 200.0) is not None


def test_a_replica_keeps_what_primaries_acknowledged_a_little_past_the_owners_quota():
    """Found by a 10-minute chaos run: one tenant near its quota, a node away for three minutes; the other
    nodes' counts of the tenant ran ahead of the primaries' (stand-in copies, a larger share of the ring),
    every holder of the oldest responses evicted them at the bound itself, and 110 acknowledged responses
    were gone. A replica now keeps an owner's shards up to REPLICA_QUOTA_SLACK times its bounds."""
    quota = 8
    primaries = [ops(max_responses=4 * quota) for _ in range(3)]  # a quarter of the node: 8 responses
    replica = ops(max_responses=4 * quota)
    acknowledged = []
    for n in range(int(quota * 1.25)):  # the replica holds 1.25x what each primary admitted against
        primary = primaries[n % 3]
        _, change = put(primary, f"r{n}", owner="tenant:a", now=float(n))
        replica.shards.apply(change, float(n))
        acknowledged.append(f"r{n}")
    assert all(replica.get_response(rid, "tenant:a", 20.0) is not None for rid in acknowledged)
    assert replica.shards.evicted_over_quota == 0
    for n in range(len(acknowledged), 3 * quota):  # far past it: the owner's own oldest go, and only so far
        _, change = put(primaries[n % 3], f"r{n}", owner="tenant:a", now=float(n))
        replica.shards.apply(change, float(n))
    assert replica.shards.usage("tenant:a").responses == int(quota * REPLICA_QUOTA_SLACK)
    assert replica.get_response("r0", "tenant:a", 40.0) is None and replica.shards.evicted_over_quota > 0


def test_node_pressure_evicts_the_heaviest_owner_first_and_a_replica_over_quota_its_own():
    # Replicas take what primaries admitted: the node's bound can still be passed, and then the owner holding
    # the most pays, least recently used first.
    primary_a, primary_b, replica = ops(max_bytes=10 ** 9), ops(max_bytes=10 ** 9), ops(max_bytes=8_000)
    for n in range(6):
        _, change = primary_a.put_response(f"a{n}", "tenant:a", b"x" * 700, float(n))
        replica.shards.apply(change, float(n))
    _, change = primary_b.put_response("b0", "tenant:b", b"x" * 700, 10.0)
    replica.shards.apply(change, 10.0)
    assert replica.get_response("b0", "tenant:b", 11.0) is not None  # b holds one: never the one to go
    # A quarter of the node, with the replicas' slack: a's own went.
    assert replica.shards.usage("tenant:a").bytes <= 2_000 * REPLICA_QUOTA_SLACK
    assert replica.shards.evicted_over_quota >= 1
    many = ops(max_bytes=6_000, **ONE_TENANT)
    for owner, count in (("heavy", 4), ("light", 2)):
        for n in range(count):
            _, change = ops(**ONE_TENANT).put_response(f"{owner}{n}", owner, b"x" * 500, float(n))
            many.shards.apply(change, float(n))
    _, change = ops(**ONE_TENANT).put_response("new", "light", b"x" * 500, 9.0)
    many.shards.apply(change, 9.0)
    assert many.shards.usage("light").responses == 3 and many.shards.usage("heavy").responses < 4


def test_retention_counts_from_the_last_write():
    o = ops(retention_s=60.0)
    put(o, "old", now=0.0)
    o.create_conversation("c", "a", b'{"id":"c"}', [], 0.0)
    o.add_items("c", "a", [("i1", b"{}")], 50.0)
    assert o.get_response("old", "a", 59.0) is not None
    assert o.get_response("old", "a", 61.0) is None and o.get_conversation("c", "a", 100.0) is not None
    put(o, "later", now=200.0)  # a write drops what expired
    assert len(o.shards) == 1


def test_conversation_items_in_order_pages_and_bound():
    o = ops(record_bytes_max=2000)
    o.create_conversation("c", "a", b'{"id":"c","metadata":{}}', [("i0", b'"0"')], 0.0)
    assert o.add_items("c", "a", [(f"i{n}", f'"{n}"'.encode()) for n in range(1, 6)], 1.0)[0]
    assert o.add_items("nope", "a", [("x", b"1")], 1.0) == (False, None)
    assert o.list_items("c", "a", "", 2, False, 2.0) == ([b'"0"', b'"1"'], True)
    assert o.list_items("c", "a", "i1", 10, False, 2.0) == ([b'"2"', b'"3"', b'"4"', b'"5"'], False)
    assert o.list_items("c", "a", "", 2, True, 2.0) == ([b'"5"', b'"4"'], True)
    assert o.list_items("c", "b", "", 2, True, 2.0) is None
    assert o.get_item("c", "a", "i3", 2.0) == (True, b'"3"') and o.get_item("c", "a", "zz", 2.0) == (True, None)
    (head, deleted), change = o.delete_item("c", "a", "i3", 3.0)
    assert deleted and change.removed == ("i3",) and o.get_item("c", "a", "i3", 3.0) == (True, None)
    head, change = o.update_conversation("c", "a", b'{"k":"v"}', 4.0)
    assert b'"k":"v"' in head and change.head == head and change.base_version > 0
    with pytest.raises(RecordTooLarge):
        o.add_items("c", "a", [("big", b"x" * 3000)], 5.0)


def test_replicas_apply_deltas_in_order_whole_shards_and_deletions_by_version():
    primary, replica = ops(), ops()
    _, created = primary.create_conversation("c", "a", b'{"id":"c"}', [], 1.0)
    _, first = primary.add_items("c", "a", [("i1", b"1")], 2.0)
    _, second = primary.add_items("c", "a", [("i2", b"2")], 3.0)
    assert not replica.shards.apply(second, 3.0)  # a delta on a version it lacks: ask for the whole
    assert replica.shards.apply(created, 3.0) and replica.shards.apply(first, 3.0)
    assert replica.shards.apply(second, 3.0) and replica.shards.apply(first, 3.0)  # a late duplicate: ignored
    assert replica.all_items("c", "a", 4.0) == [b"1", b"2"]
    _, gone = primary.delete_conversation("c", "a", 5.0)
    assert replica.shards.apply(gone, 5.0) and replica.get_conversation("c", "a", 5.0) is None
    assert replica.shards.apply(created, 6.0) and replica.get_conversation("c", "a", 6.0) is None  # no revival
    later = ops()
    later.shards.apply(gone, 5.0)
    assert later.shards.tombstone_version("c") == gone.version


def test_changes_and_operations_round_trip_and_bad_frames_are_refused():
    o = ops()
    _, change = o.create_conversation("c", "a", b"{}", [("i1", b"1")], 1.0)
    assert change_from_wire(unpack(pack(change_to_wire(change)))) == change
    assert operation_from_wire(["op", "list_items", "c", "a", ["", 5, True]]) == ("list_items", "c", "a", ["", 5, True])
    wire = change_to_wire(change)
    bad = [
        ["op", "exec", "c", "a", []],  # not an operation
        ["op", "list_items", "c", "a", ["", True, True]],  # a bool is not a limit
        ["op", "add_items", "c", "a", [[["i", "not bytes"]]]],
        ["op", "get_response", "x" * 200, "a", []],  # id too long
        ["op", "get_response", "c", "", []],
    ]
    for frame in bad:
        with pytest.raises(BadFrame):
            operation_from_wire(frame)
    for broken in ([*wire[:3], -1, *wire[4:]], [wire[0], "z", *wire[2:]], wire[:9], [*wire[:6], None, *wire[7:]]):
        with pytest.raises(BadFrame):
            change_from_wire(broken)
    with pytest.raises(BadFrame):
        unpack(b"\xc1")


async def test_a_lone_node_stores_responses_and_conversations():
    history = MemoryHistory(HistoryConfig())
    record = StoredResponse("resp_1", "a", {"id": "resp_1"}, ({"id": "i", "type": "message"},), ())
    await history.put_response(record)
    assert await history.get_response("resp_1", "a") == record
    assert await history.get_response("resp_1", "b") is None
    await history.create_conversation({"id": "conv_1", "metadata": {}}, "a", [{"id": "i1", "n": 1}])
    assert await history.add_items("conv_1", "a", [{"id": "i2", "n": 2}])
    page = await history.list_items("conv_1", "a", None, 1, False)
    assert page.items == [{"id": "i1", "n": 1}] and page.has_more
    assert (await history.update_conversation("conv_1", "a", {"k": "v"}))["metadata"] == {"k": "v"}
    assert await history.delete_item("conv_1", "a", "i1") == ({"id": "conv_1", "metadata": {"k": "v"}}, True)
    assert await history.all_items("conv_1", "a") == [{"id": "i2", "n": 2}]
    assert await history.delete_conversation("conv_1", "a") and not await history.delete_conversation("conv_1", "a")
    await trio.lowlevel.checkpoint()


def test_a_lone_node_stores_a_response_at_once_with_the_same_rules():
    """Without a mesh a stored response is written without a checkpoint (no copies to wait for), read back as
    put_response's, refused as put_response's; a store in a mesh takes nothing at once (its copies are awaited)."""
    history = MemoryHistory(HistoryConfig(max_responses=8, record_bytes_max=2000))  # a tenant: 2 responses
    record = StoredResponse("resp_1", "a", {"id": "resp_1"}, ({"id": "i", "type": "message"},), (), None, ("resp_0",))
    assert history.put_response_at_once(record)
    assert trio.run(history.get_response, "resp_1", "a") == record
    assert trio.run(history.get_response, "resp_1", "b") is None
    assert history.put_response_at_once(StoredResponse("resp_2", "a", {"id": "resp_2"}, (), ()))
    with pytest.raises(StorageQuotaExceeded):
        history.put_response_at_once(StoredResponse("resp_3", "a", {"id": "resp_3"}, (), ()))
    with pytest.raises(RecordTooLarge):
        history.put_response_at_once(StoredResponse("resp_4", "b", {"text": "x" * 3000}, (), ()))
    assert len(history.shards) == 2
    meshed = MemoryHistory(HistoryConfig(), _Cluster())
    assert not meshed.put_response_at_once(record) and len(meshed.shards) == 0


def test_a_response_already_encoded_is_stored_as_those_bytes_and_read_back_the_same():
    """The Responses API hands its store the JSON it sends the client (encoded once): the record written is the
    one the dict would have made, and reads back as it."""
    import orjson
    response = {"id": "resp_1", "output": [{"type": "message", "content": [{"text": "caf\u00e9 \u2603"}]}]}
    plain = StoredResponse("resp_1", "a", response, ({"id": "i", "type": "message"},), (), None, ("resp_0",))
    encoded = StoredResponse("resp_1", "a", response, plain.input_items, (), None, ("resp_0",),
                             response_json=orjson.dumps(response))
    assert orjson.dumps(encoded.to_json()) == orjson.dumps(plain.to_json())
    # The bytes a memory store keeps: joined around the encoded response, the same as encoding the whole, and
    # for every optional field a record may carry.
    for record in (plain, encoded, dataclasses.replace(encoded, unfinished_until_s=12.5, events=((0, "e"),)),
                   dataclasses.replace(encoded, chain=None, history=({"id": "h"},))):
        assert record.to_bytes() == orjson.dumps(record.to_json())
        assert type(record.to_bytes()) is bytes
    history = MemoryHistory(HistoryConfig())
    assert history.put_response_at_once(encoded)
    assert trio.run(history.get_response, "resp_1", "a") == plain


class _Cluster:
    """Just enough of ClusterState for a store to register its peer handler."""

    node_name = "n1"

    def __init__(self) -> None:
        self.handlers = {}
        self.ring = HashRing.build([self.node_name])

    def serve_requests(self, mark, handler):
        self.handlers[mark] = handler

    def machine_of(self, member):
        return member

    def owners(self, key, count, ring=None):
        return (ring or self.ring).placement(key, count, self.machine_of)

    def walk(self, key, ring=None):
        return (ring or self.ring).placement(key, 0, self.machine_of, owners_only=False)

    def known_members(self):
        return [self.node_name]


async def test_a_peers_bad_frames_are_answered_refused_and_counted():
    cluster = _Cluster()
    history = MemoryHistory(HistoryConfig(), cluster)
    serve = cluster.handlers[b"H"]
    for frame in (b"", b"\xc1garbage", pack({"op": 1}), pack(["op", "exec", "x", "a", []]), pack(["rep", [[1, 2]]]),
                  pack(["sync", 1, 2, 3]), pack(["nothing"])):
        assert unpack(await serve(frame))[0] == "bad"
    assert history.stats.bad_frames == 7
    # A good one still works: an operation run here as the primary (no other owners).
    answer = unpack(await serve(pack(["op", "get_response", "resp_x", "a", []])))
    assert answer == ["ok", None]



async def test_a_peers_have_question_is_answered_by_version_and_bounded():
    """"have" (a former owner asking before it forgets its copy): True only for a shard held at that version or
    newer, a deletion included; entries that are not [id, version], or too many, are a bad frame."""
    cluster = _Cluster()
    history = MemoryHistory(HistoryConfig(**ONE_TENANT), cluster)
    serve = cluster.handlers[b"H"]
    await history.put_response(StoredResponse("resp_a", "a", {"id": "resp_a"}, (), ()))
    await history.put_response(StoredResponse("resp_d", "a", {"id": "resp_d"}, (), ()))
    held = history.shards.peek("resp_a").version
    await history.delete_response("resp_d", "a")
    answer = unpack(await serve(pack(["have", [["resp_a", held], ["resp_a", held + 1], ["resp_d", held],
                                               ["resp_none", 1], ["resp_a", 0]]])))
    assert answer == ["ok", [True, False, True, False, False]]
    for frame in (["have", [["resp_a"]]], ["have", [["resp_a", "1"]]], ["have", [[1, 1]]], ["have", [["resp_a", True]]],
                  ["have", [["x", 1]] * (HAVE_BATCH_MAX + 1)], ["have", "resp_a"]):
        assert unpack(await serve(pack(frame)))[0] == "bad"
    assert history.stats.bad_frames == 6
    # Extreme values a peer may send (msgpack's widest integers, a long id) are answered, not raised on.
    extremes = [["resp_a", 2 ** 64 - 1], ["resp_a", -2 ** 63], ["r" * 100_000, 1], ["", held]]
    assert unpack(await serve(pack(["have", extremes]))) == ["ok", [False, False, False, False]]
    assert history.stats.bad_frames == 6


@pytest.mark.parametrize("item_bytes", [40, 2_000, 45_000])
async def test_counted_bytes_match_what_the_process_holds(item_bytes):
    """Issue 33: a store counting 256 MiB held 1.1 GiB (orjson's bytes carry ~10x their length in allocation).
    What the store counts must be what the process holds for it: measured with tracemalloc, tiny to large."""
    import gc
    import tracemalloc
    store = MemoryHistory(HistoryConfig(max_bytes=10 ** 10, **ONE_TENANT))
    text = "x" * item_bytes
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(300):
            await store.put_response(StoredResponse(f"resp_{n:024x}", "tenant:t", {"id": f"resp_{n:024x}",
                                                    "output": [{"type": "message", "content": text}]}, (), ()))
        for n in range(30):
            await store.create_conversation({"id": f"conv_{n:024x}", "metadata": {}}, "tenant:t",
                                            [{"id": f"item_{n}_{j:020x}", "content": text} for j in range(10)])
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = store.shards.bytes
    assert 0.85 <= held / counted <= 1.15, f"the process holds {held} bytes for {counted} counted"


def test_an_open_data_plane_is_one_owner_bounded_by_the_node_alone():
    """No key or token required: every client is "anonymous" and none can be told apart, so a tenant's quarter
    protects nobody; it refused every stored write of a single-user node past 2,500 (a quarter of 10,000).
    The node's own bounds apply instead, its least recently used records going first, on primaries and
    replicas alike; a key's owner on the same node is still held to its quarter."""
    from gateway.auth.principal import ANONYMOUS
    from gateway.history.store import OPEN_DATA_PLANE_OWNER
    assert ANONYMOUS.key_id == OPEN_DATA_PLANE_OWNER
    o = ops(max_responses=8)  # a quarter: 2
    for n in range(12):
        put(o, f"r{n}", owner=OPEN_DATA_PLANE_OWNER, now=float(n))
    held = [n for n in range(12) if o.get_response(f"r{n}", OPEN_DATA_PLANE_OWNER, 20.0) is not None]
    assert held == list(range(4, 12)) and o.shards.refused_quota == 0  # the newest 8: the node's bound
    replica = ops(max_responses=8)
    for n in range(8):
        _, change = put(ops(max_responses=8), f"c{n}", owner=OPEN_DATA_PLANE_OWNER, now=float(n))
        replica.shards.apply(change, float(n))
    assert len(replica.shards) == 8 and replica.shards.evicted_over_quota == 0
    put(o, "k1", owner="key:k")
    put(o, "k2", owner="key:k")
    with pytest.raises(StorageQuotaExceeded, match="2 stored responses"):
        put(o, "k3", owner="key:k")

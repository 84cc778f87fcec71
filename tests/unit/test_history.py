"""The memory backend's parts without I/O: versioned shards and their bounds (gateway/history/shards.py),
the operations scoped to an owner (ops.py), the peer frames and their checks (wire.py), and the
lone-node store (memory.py without a mesh)."""

from __future__ import annotations

import pytest
import trio

from mesh.ring import HashRing

from gateway.history import ConversationFull, HistoryConfig, MemoryHistory, StoredResponse
from gateway.history.ops import HistoryOps
from gateway.history.shards import MemoryShards
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


def test_bounded_by_count_items_and_bytes_least_recently_used_first():
    o = ops(max_responses=3)
    for i in range(3):
        put(o, f"r{i}")
    o.get_response("r0", "a", 1.0)  # used: r1 is now the least recent
    put(o, "r3")
    assert [r for r in ("r0", "r1", "r2", "r3") if o.get_response(r, "a", 2.0)] == ["r0", "r2", "r3"]
    by_bytes = ops(max_bytes=1000)
    for i in range(10):
        put(by_bytes, f"b{i}", size=300)
    assert len(by_bytes.shards) == 2 and by_bytes.get_response("b9", "a", 1.0) is not None
    by_items = ops(max_items=10)
    for i in range(3):
        by_items.create_conversation(f"c{i}", "a", b"{}", [(f"i{j}", b"{}") for j in range(3)], 0.0)
    assert [c for c in ("c0", "c1", "c2") if by_items.get_conversation(c, "a", 1.0)] == ["c1", "c2"]


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
    o = ops(conversation_bytes_max=2000)
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
    with pytest.raises(ConversationFull):
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


class _Cluster:
    """Just enough of ClusterState for a store to register its peer handler."""

    node_name = "n1"

    def __init__(self) -> None:
        self.handlers = {}
        self.ring = HashRing.build([self.node_name])

    def serve_requests(self, mark, handler):
        self.handlers[mark] = handler

    def node_of(self, member):
        return member

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

"""The KV index built from engine events, and cache_aware routing on it."""

import contextlib
import dataclasses
import gc

import pytest
import trio

from chaos.sim_engine.kv_cache import PrefixCache
from gateway.routing.kv_index import (
    OP_CLEAR,
    OP_STORE,
    BatchOutcome,
    Cleared,
    KvIndex,
    RemovedBlocks,
    StoredBlocks,
    prompt_block_hashes,
)
from gateway.routing.policies import PolicyConfig, RoutingRequest, make_policy
from gateway.workers.kv_events import DECODE_BLOCKS_PER_STEP, apply_batch_in_steps, decode_batch, follow_kv_events


def feed(index: KvIndex, engine_id: str, cache: PrefixCache, since: int) -> int:
    """Apply the simulated engine's real event batches; return the next cursor."""
    for batch in cache.batches_since(since) or []:
        events, snapshot = decode_batch(batch)
        assert index.apply_batch(engine_id, batch.sequence_number, events, snapshot) is BatchOutcome.APPLIED
        since = batch.sequence_number + 1
    return since


def test_index_matches_what_the_engine_cached():
    cache = PrefixCache(block_size=4, capacity_blocks=100, replay_batches_max=100)
    index = KvIndex()
    prompt = list(range(100, 120))  # 5 blocks
    cache.release(cache.acquire(prompt, 0), 0)
    feed(index, "e1", cache, 1)
    assert index.block_size("e1") == 4
    assert index.matched_blocks("e1", prompt_block_hashes(prompt, 4)) == 5
    assert index.matched_blocks("e1", prompt_block_hashes(prompt[:8] + [0] * 12, 4)) == 2
    assert index.matched_blocks("e2", prompt_block_hashes(prompt, 4)) == 0


def test_removed_and_cleared_events_forget_blocks():
    cache = PrefixCache(block_size=2, capacity_blocks=2, replay_batches_max=100)
    index = KvIndex()
    cache.release(cache.acquire([1, 2, 3, 4], 0), 0)
    cache.release(cache.acquire([5, 6, 7, 8], 0), 0)  # evicts [1,2,3,4]'s blocks
    feed(index, "e", cache, 1)
    assert index.matched_blocks("e", prompt_block_hashes([1, 2, 3, 4], 2)) == 0
    assert index.matched_blocks("e", prompt_block_hashes([5, 6, 7, 8], 2)) == 2
    cache.clear(0)
    feed(index, "e", cache, cache.sequence_number)
    assert index.block_count("e") == 0


async def test_long_batches_are_decoded_and_applied_in_parts_with_the_same_result():
    block_size = 2
    cache = PrefixCache(block_size=block_size, capacity_blocks=400, replay_batches_max=100)
    first = list(range(2 * 300))  # 300 blocks
    cache.release(cache.acquire(first, 0), 0)
    cache.release(cache.acquire([7] * (2 * 300), 0), 0)  # 300 more: 200 of the first prompt's evicted
    stepped, whole, peer = KvIndex(), KvIndex(), KvIndex()
    for batch in cache.batches_since(1):
        events, snapshot = decode_batch(batch)
        assert all(len(getattr(e, "blocks", getattr(e, "engine_hashes", ()))) <= DECODE_BLOCKS_PER_STEP
                   for e in events)
        ops: list = []
        outcome = await apply_batch_in_steps(stepped, "e", batch.sequence_number, events, snapshot, ops)
        assert outcome is BatchOutcome.APPLIED
        assert peer.apply_ops("e", batch.sequence_number, ops, snapshot, block_size) is BatchOutcome.APPLIED
        # The reference: each engine event in one piece, applied at once.
        unsplit = []
        for e in batch.events:
            if e.WhichOneof("data") == "stored":
                parent = e.stored.parent_block_hash if e.stored.HasField("parent_block_hash") else None
                unsplit.append(StoredBlocks(parent, tuple((b.block_hash, tuple(b.token_ids)) for b in e.stored.blocks)))
            elif e.WhichOneof("data") == "removed":
                unsplit.append(RemovedBlocks(tuple(e.removed.block_hashes)))
        assert len(events) > len(unsplit)  # the 300-block events came out in parts
        whole.apply_batch("e", batch.sequence_number, unsplit, snapshot)
    assert stepped.block_count("e") == whole.block_count("e") == peer.block_count("e") == 400
    assert stepped.fingerprint("e") == whole.fingerprint("e") == peer.fingerprint("e")
    assert stepped.next_sequence("e") == whole.next_sequence("e") == cache.sequence_number + 1
    assert stepped.matched_blocks("e", prompt_block_hashes([7] * 600, block_size)) == 300
    assert stepped.orphans("e") == 0


async def test_a_follower_stopped_inside_a_batch_applies_and_publishes_all_of_it():
    # A 300-block batch is applied in three steps; the follower is cancelled during the first (its
    # ring ownership moved, or a second engine left). Without the shield it would keep 128 blocks its
    # peers never get.
    cache = PrefixCache(block_size=2, capacity_blocks=400, replay_batches_max=100)
    cache.release(cache.acquire(list(range(600)), 0), 0)
    batches = cache.batches_since(1)
    assert len(batches) == 1 and len(batches[0].events[0].stored.blocks) == 300

    class Engine:
        @contextlib.asynccontextmanager
        async def subscribe_kv_events(self, start):
            async def stream():
                yield batches
                await trio.sleep_forever()
            yield stream()

    class Worker:
        id = "e"
        client = Engine()

    class CancelledInsideTheBatch(KvIndex):
        def apply_events(self, engine_id, events, ops_out=None):
            super().apply_events(engine_id, events, ops_out)
            scope.cancel()

    index, published = CancelledInsideTheBatch(), []
    with trio.CancelScope() as scope:
        await follow_kv_events(Worker(), index, lambda *batch: published.append(batch))
    assert index.block_count("e") == 300 and index.next_sequence("e") == batches[0].sequence_number + 1
    peer = KvIndex()
    (engine_id, sequence, ops, snapshot, block_size), = published
    assert peer.apply_ops(engine_id, sequence, ops, snapshot, block_size) is BatchOutcome.APPLIED
    assert peer.fingerprint("e") == index.fingerprint("e")


async def test_a_refused_batch_is_not_applied_in_steps_either():
    index = KvIndex()
    stored = [StoredBlocks(None, ((11, (1, 2)),))]
    assert await apply_batch_in_steps(index, "e", 1, stored, False, None) is BatchOutcome.APPLIED
    assert await apply_batch_in_steps(index, "e", 1, stored, False, None) is BatchOutcome.DUPLICATE
    assert await apply_batch_in_steps(index, "e", 5, [RemovedBlocks((11,))], False, None) is BatchOutcome.GAP
    assert index.block_count("e") == 1 and index.next_sequence("e") == 2


def test_batches_apply_once_in_order_and_gaps_are_reported():
    index = KvIndex()
    stored = StoredBlocks(None, ((11, (1, 2)),))
    assert index.apply_batch("e", 1, [stored]) is BatchOutcome.APPLIED
    assert index.apply_batch("e", 1, [stored]) is BatchOutcome.DUPLICATE
    assert index.apply_batch("e", 3, [RemovedBlocks((11,))]) is BatchOutcome.GAP
    assert index.block_count("e") == 1 and index.next_sequence("e") == 2


def test_snapshot_replaces_the_state():
    index = KvIndex()
    index.apply_batch("e", 1, [StoredBlocks(None, ((11, (1, 2)),))])
    index.apply_batch("e", 7, [Cleared(), StoredBlocks(None, ((12, (3, 4)),))], snapshot=True)
    assert index.matched_blocks("e", prompt_block_hashes([1, 2], 2)) == 0
    assert index.matched_blocks("e", prompt_block_hashes([3, 4], 2)) == 1 and index.next_sequence("e") == 8


def test_blocks_with_an_unknown_parent_are_not_matched():
    index = KvIndex()
    index.apply_batch("e", 1, [StoredBlocks(999, ((12, (3, 4)),))])
    assert index.block_count("e") == 0


def test_memory_is_bounded_least_recently_used_first():
    index = KvIndex(blocks_max=4)
    index.apply_batch("a", 1, [StoredBlocks(None, ((1, (1, 1)), (2, (2, 2))))])
    index.apply_batch("b", 1, [StoredBlocks(None, ((3, (3, 3)), (4, (4, 4))))])
    index.matched_blocks("a", prompt_block_hashes([1, 1, 2, 2], 2))  # a's prefix is now recent
    index.apply_batch("b", 2, [StoredBlocks(None, ((5, (5, 5)),))])
    assert index.block_count() == 4 and index.evicted == 1
    assert index.matched_blocks("a", prompt_block_hashes([1, 1, 2, 2], 2)) == 2


def test_eviction_at_scale_goes_a_64th_below_the_limit_and_keeps_engines_apart():
    index = KvIndex(blocks_max=6400)
    for engine in ("a", "b"):
        for sequence in range(1, 41):  # 40 batches of 100 chained blocks per engine: 8,000 in all
            first = sequence * 1000
            parent = None if sequence == 1 else (sequence - 1) * 1000 + 99
            blocks = tuple((first + i, (sequence, i)) for i in range(100))
            index.apply_batch(engine, sequence, [StoredBlocks(parent, blocks)])
    assert index.evicted == 8000 - index.block_count() and 6300 <= index.block_count() <= 6400
    assert index.block_count("a") + index.block_count("b") == index.block_count()
    index.remove_engine("a")
    assert index.block_count() == index.block_count("b") and not index.has_engine("a")


def test_the_index_gives_the_garbage_collector_nothing_to_scan():
    """Its maps hold only ints: CPython never tracks such dicts, whatever their size."""
    index = KvIndex()
    index.apply_batch("e", 1, [StoredBlocks(None, tuple((i, (i, i)) for i in range(1, 2000)))])
    index.matched_blocks("e", prompt_block_hashes([1, 1, 2, 2], 2))
    engine = index._engines["e"]
    assert not any(gc.is_tracked(d) for d in (index._lru._order, engine.blocks, engine.by_engine_hash))


def test_the_same_events_give_the_same_fingerprint():
    a, b = KvIndex(), KvIndex()
    for index in (a, b):
        index.apply_batch("e", 1, [StoredBlocks(None, ((1, (1, 1)), (2, (2, 2))))])
    assert a.fingerprint("e") == b.fingerprint("e") != 0


@dataclasses.dataclass
class W:
    id: str
    load: int = 0

    def load_score(self):
        return self.load


def test_cache_aware_follows_the_engine_that_holds_the_prefix():
    index = KvIndex()
    prompt = list(range(64))
    index.apply_batch("holder", 1, [StoredBlocks(None, tuple((i, tuple(prompt[i * 16:(i + 1) * 16]))
                                                            for i in range(4)))])
    index.apply_batch("other", 1, [StoredBlocks(None, ((99, tuple(range(500, 516))),))])
    policy = make_policy(PolicyConfig(name="cache_aware"), index)
    workers = [W("other"), W("holder")]
    assert policy.choose(workers, RoutingRequest(input_ids=prompt + [7] * 10)).id == "holder"
    # A little load does not outweigh 4 cached blocks; a lot does (cost: blocks to prefill + 8 per request).
    workers[1].load = 0
    workers[0].load = 0
    assert policy.choose(workers, RoutingRequest(input_ids=prompt)).id == "holder"
    workers[1].load = 1
    assert policy.choose(workers, RoutingRequest(input_ids=prompt)).id == "other"


async def test_kv_sharing_drops_malformed_peer_items():
    import msgpack

    from gateway.cluster import KvSharing

    from gateway.cluster import PeerRequests

    class FakeCluster:
        node_name = "me"
        ring = __import__("mesh.ring", fromlist=["HashRing"]).HashRing.build(["me", "peer"])
        agent = None
        doc = None
        peer_requests = PeerRequests()

        def serve_requests(self, mark, handler):
            self.peer_requests.register(mark, handler)

        def owners(self, key, count, ring=None):  # every member a machine of its own
            return (ring or self.ring).placement(key, count, lambda member: member)

    index = KvIndex()
    cluster = FakeCluster()
    sharing = KvSharing(cluster, index, followers=2)
    # Frames come through the mark KV sharing registered; garbage after it is answered, never raised.
    assert msgpack.unpackb(await cluster.peer_requests.handle(b"K\xc1\xff")) == ["bad_request"]
    assert msgpack.unpackb(await cluster.peer_requests.handle(b"K" + msgpack.packb({"a": 1}))) == ["unknown"]
    assert await cluster.peer_requests.handle(b"Z...") == b"" and cluster.peer_requests.unrouted == 1
    for message in (["kv_batches", "peer", [["e", "x", 0, 16, []]]], ["kv_batches", "peer", [[1, 2]]],
                    ["kv_batches", "peer", "nope"], ["kv_replay", "e", "x"], [], ["other"]):
        answer = msgpack.unpackb(await sharing.on_request(message))
        assert answer[0] in ("ok", "unknown")
    assert index.block_count() == 0
    # A node that knows nothing of an engine does not start from a batch (it would hold a fragment
    # forever): it waits for a whole view (a snapshot item, what a replay answers), then batches in order.
    ok = msgpack.unpackb(await sharing.on_request(["kv_batches", "peer", [["e", 1, False, 2, [[0, [[5, 9]]]]]]]))
    assert ok == ["ok"] and index.next_sequence("e") == 0 and index.block_count("e") == 0
    snapshot = ["e", 1, True, 2, [[2], [0, [[5, 9], [6, 10]]]]]
    assert msgpack.unpackb(await sharing.on_request(["kv_batches", "peer", [snapshot]])) == ["ok"]
    assert index.next_sequence("e") == 2 and index.block_count("e") == 2 and index.block_size("e") == 2
    batch = ["e", 2, False, 2, [[0, [[7, 11]]]]]
    assert msgpack.unpackb(await sharing.on_request(["kv_batches", "peer", [batch]])) == ["ok"]
    assert index.next_sequence("e") == 3 and index.block_count("e") == 3


def test_cache_aware_keeps_no_approximate_tree_for_engines_with_events():
    index = KvIndex()
    index.apply_batch("evented", 1, [StoredBlocks(None, ((1, tuple(range(16))),))])
    policy = make_policy(PolicyConfig(name="cache_aware"), index)
    prompt = RoutingRequest(input_ids=list(range(256)))
    assert policy.choose([W("evented")], prompt).id == "evented"
    assert policy.index.size("evented") == 0  # its events say what it holds
    # Alone, an engine whose events are not followed (nothing to choose between) is not recorded either:
    # its events are followed from when a second engine serves the model.
    assert policy.choose([W("lone")], prompt).id == "lone"
    assert policy.index.size("lone") == 0
    unsupported = W("blind")
    unsupported.kv_events_unsupported = True  # answered SubscribeKvEvents with UNIMPLEMENTED
    assert policy.choose([unsupported], prompt).id == "blind"
    assert policy.index.size("blind") == 16  # no events: the tree remembers what was sent there
    # Beside an engine without events, the tree decides for both and records the choice.
    chosen = policy.choose([W("evented"), W("quiet")], prompt).id
    assert policy.index.size(chosen) == 16


def test_malformed_peer_ops_are_refused_before_they_change_anything():
    index = KvIndex()
    assert index.apply_ops("e", 1, [(0, [(5, 9), (6, 10)])], snapshot=True, block_size=2) is BatchOutcome.APPLIED
    fingerprint, count = index.fingerprint("e"), index.block_count()
    for ops in ([(0, [(7, 11), (8, 12, 13)])], [(0, [(7, 11), (8,)])], [(0, [("x", 11)])]):
        with pytest.raises((ValueError, TypeError)):
            index.apply_ops("e", 2, ops)
        assert index.fingerprint("e") == fingerprint and index.block_count() == count
        assert index.next_sequence("e") == 2


async def test_a_node_that_missed_the_last_batches_catches_up_from_the_owners_heads(autojump_clock):
    """The chaos smoke once ended with a restarted node one batch behind on both engines for good: its last
    batch was not delivered, and no later batch came to show the gap. The owners' heads show it."""
    from gateway.cluster import KvSharing, PeerRequests
    from gateway.cluster.kv_sharing import CATCH_UP_INTERVAL_S
    from mesh import PeerUnreachable
    from mesh.ring import HashRing

    ring = HashRing.build(["a", "b"])
    engine = next(f"e{i}" for i in range(100) if ring.owners(f"e{i}", 1) == ["a"])
    nodes: dict = {}
    lost = {"batches to b": 1}  # the next kv_batches request to b fails

    class Cluster:
        def __init__(self, name):
            self.node_name, self.ring, self.peer_requests = name, ring, PeerRequests()

        def serve_requests(self, mark, handler):
            self.peer_requests.register(mark, handler)

        def owners(self, key, count, ring=None):  # every member a machine of its own
            return (ring or self.ring).placement(key, count, lambda member: member)

        async def request_peer(self, peer, request, timeout_s):
            if peer == "b" and b"kv_batches" in request and lost["batches to b"]:
                lost["batches to b"] -= 1
                raise PeerUnreachable("cut")  # what ClusterState.request_peer raises for any failure
            return await nodes[peer].cluster.peer_requests.handle(request)

    for name in ("a", "b"):
        nodes[name] = KvSharing(Cluster(name), KvIndex(), followers=1)
    owner, follower = nodes["a"], nodes["b"]
    follower.cluster.doc = owner.cluster.doc = type("Doc", (), {"workers": staticmethod(dict)})()

    def publish(sequence, ops, snapshot=False):
        owner.index.apply_ops(engine, sequence, ops, snapshot, 2)
        owner.published(engine, sequence, ops, snapshot, 2)

    async with trio.open_nursery() as nursery:
        for sharing in nodes.values():
            await nursery.start(sharing.run)
        lost["batches to b"] = 0
        publish(0, [[OP_CLEAR], [OP_STORE, [[5, 9]]]], snapshot=True)
        await trio.sleep(1)
        assert follower.index.next_sequence(engine) == 1
        lost["batches to b"] = 1
        publish(1, [[OP_STORE, [[6, 10]]]])  # b never gets it, and nothing comes after
        await trio.sleep(1)
        assert follower.index.next_sequence(engine) == 1
        await trio.sleep(3 * CATCH_UP_INTERVAL_S)
        assert follower.index.next_sequence(engine) == 2 and follower.index.block_count(engine) == 2
        assert msgpack_answer(await follower.on_request(["kv_heads", "a", [["x" * 200, 1], [engine, -1], 7]]))
        assert follower.refused == 3  # malformed heads are counted, never acted on
        nursery.cancel_scope.cancel()


def msgpack_answer(raw: bytes) -> bool:
    import msgpack
    return msgpack.unpackb(raw) == ["ok"]

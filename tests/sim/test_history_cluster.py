"""The replicated memory history over the simulated network, on virtual time: real MeshAgents,
ClusterStates and MemoryHistory stores (gateway/history/memory.py), one per node.

The guarantee checked: every write acknowledged (the call returned) is read back on every survivor
after any one node crashes, and again after a second crash once the ring has settled (the shards
the first one held were copied to their new owners). A node restarted with an empty memory gets its
shards back from its peers, whether or not they noticed it was gone.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import trio

from gateway.cluster import ClusterState
from gateway.history import HistoryConfig, MemoryHistory, ReplicationConfig, StoredResponse, StoreUnavailable
from mesh.agent import MeshAgent
from mesh.config import MeshConfig
from mesh.crypto import Keyring
from mesh.simnet import SimNetwork

from .harness import KEY_A, addr, crash_node, form_cluster
from tests.support.waiting import time_until_trio

MESH = MeshConfig.lan()
EPOCH_S = 1.8e9  # the stores' wall clock: virtual time after a plausible date
OWNER = "tenant:acme"


@dataclasses.dataclass
class Node:
    name: str
    agent: MeshAgent
    cluster: ClusterState
    history: MemoryHistory
    scope: trio.CancelScope


async def start_node(nursery: trio.Nursery, net: SimNetwork, i: int, seed: int, incarnation: int = 0,
                     machine: str | None = None) -> Node:
    """Member ``node-i``; with ``machine``, tagged as one of that node's processes (as ``--workers N`` does)."""
    name = f"node-{i}"
    cluster = ClusterState(name)
    agent = MeshAgent(MESH, name, net.transport(addr(i)), Keyring([KEY_A]), hooks=cluster,
                      tags={"node": machine} if machine else None, rng=random.Random(seed * 1000 + i * 10 + incarnation))
    cluster.attach(agent)
    history = MemoryHistory(HistoryConfig(), cluster, ReplicationConfig(),
                            wall_clock=lambda: EPOCH_S + trio.current_time())

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as inner:
                await inner.start(agent.run)
                await inner.start(history.run)
                task_status.started(scope)

    scope = await nursery.start(run)
    return Node(name, agent, cluster, history, scope)


def record(i: int) -> StoredResponse:
    rid = f"resp_{i:04d}"
    return StoredResponse(rid, OWNER, {"id": rid, "n": i}, ({"id": f"in_{i}", "type": "message"},), ())


async def write_some(nodes: "list[Node]", rng: random.Random, count: int) -> list[StoredResponse]:
    written = []
    for i in range(count):
        r = record(i)
        await rng.choice(nodes).history.put_response(r)  # acknowledged once this returns
        written.append(r)
    return written


async def all_readable(nodes: "list[Node]", written: "list[StoredResponse]") -> None:
    for node in nodes:
        for r in written:
            got = await node.history.get_response(r.id, OWNER)
            assert got == r, f"{node.name} lost {r.id}"


def holders(nodes: "list[Node]", shard_id: str) -> int:
    return sum(n.history.shards.peek(shard_id) is not None for n in nodes)


@pytest.mark.parametrize("seed", [11, 12, 13])
async def test_acknowledged_writes_survive_one_crash_then_another_after_handoff(autojump_clock, seed):
    rng = random.Random(seed)
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 5, lambda i: start_node(nursery, net, i, seed))
        written = await write_some(nodes, rng, 40)
        assert all(holders(nodes, r.id) == 3 for r in written), f"seed={seed}: three copies of each"
        # A conversation too, written through one node and read through the others.
        await nodes[0].history.create_conversation({"id": "conv_x", "metadata": {}}, OWNER, [{"id": "i0"}])
        assert await nodes[1].history.add_items("conv_x", OWNER, [{"id": "i1"}])

        first = rng.choice(nodes)
        crash_node(net, first)
        survivors = [n for n in nodes if n is not first]
        await all_readable(survivors, written)  # at once, before anyone noticed the crash
        await time_until_trio(lambda: all(len(n.cluster.ring) == 4 for n in survivors), 60)
        # A turn after the crash, from any survivor.
        assert await survivors[-1].history.add_items("conv_x", OWNER, [{"id": "i2"}])
        await time_until_trio(lambda: all(holders(survivors, r.id) == 3 for r in written), 30)

        second = rng.choice(survivors)
        crash_node(net, second)
        left = [n for n in survivors if n is not second]
        await all_readable(left, written)
        items = await left[0].history.all_items("conv_x", OWNER)
        assert [i["id"] for i in items] == ["i0", "i1", "i2"], f"seed={seed}: crashed {first.name}, {second.name}"
        print(f"seed={seed}: crashed {first.name} then {second.name}; "
              f"handed off {sum(n.history.stats.handed_off for n in nodes)}")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("noticed", [True, False], ids=["after-detection", "before-detection"])
async def test_a_restarted_node_gets_its_shards_back(autojump_clock, noticed):
    seed = 21
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 4, lambda i: start_node(nursery, net, i, seed))
        written = await write_some(nodes, random.Random(seed), 30)
        victim = nodes[2]
        should_hold = {r.id for r in written if victim.history.shards.peek(r.id) is not None}
        assert should_hold
        crash_node(net, victim)
        others = [n for n in nodes if n is not victim]
        if noticed:
            await time_until_trio(lambda: all(len(n.cluster.ring) == 3 for n in others), 60)
        net.crashed.discard(victim.agent.transport.addr)
        reborn = await start_node(nursery, net, 2, seed, incarnation=1)
        await reborn.agent.join([nodes[0].agent.transport.addr])
        await time_until_trio(lambda: all(reborn.history.shards.peek(rid) is not None for rid in should_hold), 60)
        await all_readable([reborn, *others], written)
        nursery.cancel_scope.cancel()


async def test_a_write_is_refused_when_no_other_node_can_take_it(autojump_clock):
    """Two nodes, one crashed: nothing can be acknowledged (504) while the other is known, even after
    it is off the ring and past the old 5-minute reap (it may be cut off rather than dead, serving clients on
    its side); the survivor still reads what both held. Once an operator says the failed member is gone for
    good (force-leave), the survivor is alone."""
    seed = 31
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 2, lambda i: start_node(nursery, net, i, seed))
        written = await write_some(nodes, random.Random(seed), 5)
        crash_node(net, nodes[1])
        with pytest.raises(StoreUnavailable):
            await nodes[0].history.put_response(record(99))
        await all_readable([nodes[0]], written)
        await time_until_trio(lambda: len(nodes[0].cluster.ring) == 1, 60)
        with pytest.raises(StoreUnavailable):
            await nodes[0].history.put_response(record(99))  # failed, not forgotten: may be cut off
        await trio.sleep(420)
        with pytest.raises(StoreUnavailable):
            await nodes[0].history.put_response(record(99))  # still: a partition may last that long
        nodes[0].agent.force_leave(nodes[1].name)
        assert nodes[0].cluster.known_members() == [nodes[0].name]
        await nodes[0].history.put_response(record(99))  # alone now: its own copy is all there is
        nursery.cancel_scope.cancel()


async def test_a_lookup_of_an_absent_record_does_not_wait_for_a_failed_member(autojump_clock):
    """A failed member may hold a record (cut off, it may have taken writes on its side): an absent one is
    unknown (504) while it is known, for a day. Asking it would add its timeout to every such lookup; it is
    counted silent without asking."""
    seed = 51
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 4, lambda i: start_node(nursery, net, i, seed))
        crash_node(net, nodes[3])
        await time_until_trio(lambda: len(nodes[0].cluster.ring) == 3, 60)
        history = nodes[0].history
        absent = next(f"resp_absent{i}" for i in range(1000)
                      if nodes[3].name in history.placement(history._known_ring(), f"resp_absent{i}"))
        started = trio.current_time()
        with pytest.raises(StoreUnavailable):
            await history.get_response(absent, OWNER)
        assert trio.current_time() - started < history.replication.replicate_timeout_s / 2
        nursery.cancel_scope.cancel()


def held_not_owned(nodes: "list[Node]") -> "list[tuple[str, str]]":
    return [(n.name, shard_id) for n in nodes for shard_id in n.history.shards.ids()
            if n.name not in n.history.placement(n.cluster.ring, shard_id)]


@pytest.mark.parametrize("seed", [61, 62])
async def test_copies_a_node_no_longer_owns_are_forgotten_once_every_owner_holds_them(autojump_clock, seed):
    """Three nodes hold everything; three more join. The shards move to their new owners (handoff) and the
    former owners forget their copies: three copies of each, on its owners, every one readable anywhere, and
    the tenant's count on the first nodes down to what they own. Before, every copy stayed for a week."""
    rng = random.Random(seed)
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 3, lambda i: start_node(nursery, net, i, seed))
        written = await write_some(nodes, rng, 30)
        assert nodes[0].history.shards.usage(OWNER).responses == 30
        for i in range(3, 6):
            nodes.append(await start_node(nursery, net, i, seed))
            await nodes[-1].agent.join([nodes[0].agent.transport.addr])
        await time_until_trio(lambda: all(len(n.cluster.ring) == 6 for n in nodes), 60)
        await time_until_trio(lambda: not held_not_owned(nodes), 3 * ReplicationConfig().trim_interval_s)
        assert all(holders(nodes, r.id) == 3 for r in written), f"seed={seed}"
        await all_readable(nodes, written)
        assert sum(n.history.stats.trimmed for n in nodes) > 0
        assert all(n.history.shards.usage(OWNER).responses < 30 for n in nodes[:3]), f"seed={seed}"
        # Settled: the next passes find nothing to do and, with nothing new held, skip the walk (idle CPU).
        await trio.sleep(2 * ReplicationConfig().trim_interval_s)
        assert all(n.history._trimmed_clean == (n.cluster.ring, n.history.shards.installed) for n in nodes)
        nursery.cancel_scope.cancel()


async def test_a_copy_is_kept_while_an_owner_does_not_answer(autojump_clock):
    """A node joins and is cut off at once: the former owners cannot hear that it holds their shards, so they
    keep their copies; when it is gone for good, nothing was lost."""
    seed = 63
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 3, lambda i: start_node(nursery, net, i, seed))
        written = await write_some(nodes, random.Random(seed), 30)
        joiner = await start_node(nursery, net, 3, seed)
        await joiner.agent.join([nodes[0].agent.transport.addr])
        net.partition([joiner.agent.transport.addr], [n.agent.transport.addr for n in nodes])
        await time_until_trio(lambda: all(len(n.cluster.ring) == 4 for n in nodes), 60)
        await trio.sleep(2 * ReplicationConfig().trim_interval_s)  # trim passes ran while it was on the ring
        assert all(holders(nodes, r.id) == 3 for r in written)  # the joiner confirmed nothing: all kept
        crash_node(net, joiner)
        await time_until_trio(lambda: all(len(n.cluster.ring) == 3 for n in nodes), 60)
        await all_readable(nodes, written)
        nursery.cancel_scope.cancel()


async def test_a_write_with_two_of_its_owners_down_lands_on_the_next_member(autojump_clock):
    """Two of a conversation's three owners crash together: the write is still acknowledged, held by the
    live owner and the next member on the ring (the one that becomes an owner once the dead are gone),
    and every later reader finds all of it."""
    seed = 41
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 5, lambda i: start_node(nursery, net, i, seed))
        await nodes[0].history.create_conversation({"id": "conv_y", "metadata": {}}, OWNER, [{"id": "i0"}])
        ring_owners = nodes[0].cluster.ring.owners("conv_y", 3)
        dead = [n for n in nodes if n.name in ring_owners[:2]]
        for node in dead:
            crash_node(net, node)
        live = [n for n in nodes if n not in dead]
        assert await live[0].history.add_items("conv_y", OWNER, [{"id": "i1"}])  # before anyone noticed
        assert holders(live, "conv_y") >= 2
        await time_until_trio(lambda: all(len(n.cluster.ring) == 3 for n in live), 60)
        for node in live:
            assert [i["id"] for i in await node.history.all_items("conv_y", OWNER)] == ["i0", "i1"]
        nursery.cancel_scope.cancel()


async def test_an_owner_cut_off_during_a_write_is_repaired_after(autojump_clock):
    """An owner unreachable for a moment (not long enough to leave the ring) misses a change; the write
    is acknowledged by the other two, and the primary repairs the third copy once it answers again."""
    seed = 51
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 3, lambda i: start_node(nursery, net, i, seed))
        await nodes[0].history.create_conversation({"id": "conv_z", "metadata": {}}, OWNER, [{"id": "i0"}])
        cut = next(n for n in nodes if n.name == nodes[0].cluster.ring.owners("conv_z", 3)[-1])
        rest = [n for n in nodes if n is not cut]
        net.partition([cut.agent.transport.addr], [n.agent.transport.addr for n in rest])
        assert await rest[0].history.add_items("conv_z", OWNER, [{"id": "i1"}])
        assert cut.history.shards.peek("conv_z").items.keys() == {"i0"}  # it missed the change
        net.heal()
        await time_until_trio(lambda: "i1" in cut.history.shards.peek("conv_z").items, 30)
        assert sum(n.history.stats.repaired for n in rest) >= 1
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", [61, 62])
async def test_copies_go_to_three_machines_when_nodes_run_several_processes(autojump_clock, seed):
    """Three nodes of two processes each (six members): a shard's three owners are on three nodes, so
    killing every process of one node loses nothing acknowledged."""
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        members = await form_cluster(nursery, net, 6, lambda i: start_node(nursery, net, i, seed,
                                                                           machine=f"machine-{i // 2}"))
        written = await write_some(members, random.Random(seed), 30)
        machine_of = {m.name: int(m.name.split("-")[1]) // 2 for m in members}
        for r in written:
            holding = {machine_of[m.name] for m in members if m.history.shards.peek(r.id) is not None}
            assert holding == {0, 1, 2}, f"seed={seed}: {r.id} held on machines {holding}"
        doomed = random.Random(seed).randrange(3)
        for m in members:
            if machine_of[m.name] == doomed:
                crash_node(net, m)
        await all_readable([m for m in members if machine_of[m.name] != doomed], written)
        nursery.cancel_scope.cancel()


async def test_a_node_cut_off_neither_acknowledges_alone_nor_calls_the_others_writes_missing(autojump_clock):
    """One of three nodes cut off from the others, its clients still reaching it: it refuses writes (504)
    rather than acknowledge what the other side cannot read, and answers 504, not 404, for what the other
    side wrote meanwhile. The two others go on; after the heal every node reads everything."""
    seed = 71
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 3, lambda i: start_node(nursery, net, i, seed))
        before = await write_some(nodes, random.Random(seed), 5)
        cut, rest = nodes[0], nodes[1:]
        net.partition([cut.agent.transport.addr], [n.agent.transport.addr for n in rest])
        await time_until_trio(lambda: len(cut.cluster.ring) == 1 and all(len(n.cluster.ring) == 2 for n in rest), 60)
        with pytest.raises(StoreUnavailable):
            await cut.history.put_response(record(50))
        during = record(51)
        await rest[0].history.put_response(during)  # two copies on the majority side
        with pytest.raises(StoreUnavailable):
            await cut.history.get_response(during.id, OWNER)  # unknown to it, not missing
        await all_readable([cut], before)  # what it held before the cut, it still serves
        net.heal()
        await time_until_trio(lambda: all(len(n.cluster.ring) == 3 for n in nodes), 120)
        await all_readable(nodes, [*before, during])
        nursery.cancel_scope.cancel()


async def test_a_write_on_the_minority_side_is_unknown_not_missing_on_the_other(autojump_clock):
    """Five nodes split 2 | 3. The two-node side still acknowledges writes (two nodes hold each), even for
    a response whose owners in the whole cluster are all on the other side; there it is unknown (504)
    while the split lasts, not missing (404), and after the heal every node reads it."""
    seed = 81
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 5, lambda i: start_node(nursery, net, i, seed))
        small, large = nodes[:2], nodes[2:]
        whole_ring = nodes[0].cluster.ring
        i = next(i for i in range(1000) if set(whole_ring.owners(record(i).id, 3)) <= {n.name for n in large})
        net.partition([n.agent.transport.addr for n in small], [n.agent.transport.addr for n in large])
        await time_until_trio(lambda: all(len(n.cluster.ring) == 2 for n in small) and
                         all(len(n.cluster.ring) == 3 for n in large), 60)
        written = record(i)
        await small[0].history.put_response(written)  # acknowledged: both small-side nodes hold it
        for node in large:
            with pytest.raises(StoreUnavailable):
                await node.history.get_response(written.id, OWNER)
        net.heal()
        await time_until_trio(lambda: all(len(n.cluster.ring) == 5 for n in nodes), 120)
        await all_readable(nodes, [written])
        nursery.cancel_scope.cancel()


async def test_a_node_just_cut_off_answers_within_the_bound(autojump_clock):
    """Cut off a moment ago, before anyone noticed: every peer it asks is silent, not refusing. It still
    answers (504 for what it cannot find, a write refused) within 8 s, not after a timeout per member."""
    seed = 91
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await form_cluster(nursery, net, 5, lambda i: start_node(nursery, net, i, seed))
        written = await write_some(nodes[1:], random.Random(seed), 10)
        cut = nodes[0]
        net.partition([cut.agent.transport.addr], [n.agent.transport.addr for n in nodes[1:]])
        elsewhere = [r for r in written if cut.history.shards.peek(r.id) is None]
        assert elsewhere
        for call in (lambda: cut.history.get_response(elsewhere[0].id, OWNER),
                     lambda: cut.history.put_response(record(77))):
            started = trio.current_time()
            with pytest.raises(StoreUnavailable):
                await call()
            assert trio.current_time() - started <= 8.0, f"answered after {trio.current_time() - started:.1f} s"
        nursery.cancel_scope.cancel()

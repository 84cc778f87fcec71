"""Failed members are remembered for a day, and ``force-leave`` says one is gone for good (mesh/members.py).

A failed member may be cut off rather than crashed, serving clients on its side: the gateway counts it as known
(rate-limit shares, history writes) until it is forgotten. These run on virtual time over the simulated network.
"""

from __future__ import annotations

import pytest
import trio

from mesh.agent import ForceLeaveError
from mesh.config import MeshConfig
from mesh.members import MemberStatus

from .harness import agree, start_agent, start_agreed_cluster, view
from tests.support.waiting import time_until_trio

ALIVE, DEAD, LEFT = MemberStatus.ALIVE, MemberStatus.DEAD, MemberStatus.LEFT
# A reconnect attempt to a random dead member every 30 s: with 3 dead ones, a few attempts find one that answers.
HEAL_BOUND_S = 240.0


async def test_a_partition_longer_than_the_old_reap_keeps_each_side_known_and_heals_without_seeds(autojump_clock):
    """No seeds are joined again here: the members held dead are what brings the halves back together."""
    async with trio.open_nursery() as nursery:
        net, agents = await start_agreed_cluster(nursery, 6, seed=21)
        everyone = {a.name: ALIVE for a in agents}
        net.partition([a.transport.addr for a in agents[:3]], [a.transport.addr for a in agents[3:]])
        await trio.sleep(400)  # past lan's old 5-minute reap
        for i, agent in enumerate(agents):
            far = agents[3:] if i < 3 else agents[:3]
            assert all(view(agent)[a.name] is DEAD for a in far), (agent.name, view(agent))
        net.heal()
        await time_until_trio(lambda: agree(agents, everyone), HEAL_BOUND_S)
        nursery.cancel_scope.cancel()


async def test_a_forced_leave_reaches_every_member_and_is_forgotten_as_a_goodbye(autojump_clock):
    async with trio.open_nursery() as nursery:
        net, agents = await start_agreed_cluster(nursery, 4, seed=22)
        gone, survivors = agents[3], agents[:3]
        net.crashed.add(gone.transport.addr)
        gone.stop()
        await time_until_trio(lambda: agree(survivors, {gone.name: DEAD}), 60)
        assert survivors[0].force_leave(gone.name) == [gone.name]
        assert view(survivors[0])[gone.name] is LEFT
        await time_until_trio(lambda: agree(survivors, {gone.name: LEFT}), 10)  # by gossip
        late = await start_agent(nursery, net, 4, MeshConfig.lan(), seed=22)
        await late.join([survivors[1].transport.addr])
        await time_until_trio(lambda: agree([late], {a.name: ALIVE for a in survivors}), 10)
        assert gone.name not in view(late)  # a join learns of no member that left (memberlist's mergeState)
        # Left members are forgotten after left_reap_s, as those that said goodbye themselves.
        await time_until_trio(lambda: all(gone.name not in view(a) for a in [*survivors, late]), MeshConfig.lan().left_reap_s * 1.5)
        nursery.cancel_scope.cancel()


async def test_a_member_forced_out_while_only_cut_off_comes_back_by_refuting(autojump_clock):
    async with trio.open_nursery() as nursery:
        net, agents = await start_agreed_cluster(nursery, 4, seed=23)
        everyone = {a.name: ALIVE for a in agents}
        alone, others = agents[3], agents[:3]
        net.partition([alone.transport.addr], [a.transport.addr for a in others])
        await time_until_trio(lambda: agree(others, {alone.name: DEAD}), 60)
        others[0].force_leave(alone.name)  # a mistake: it was only cut off
        await time_until_trio(lambda: agree(others, {alone.name: LEFT}), 10)
        net.heal()
        await time_until_trio(lambda: agree(agents, everyone), HEAL_BOUND_S)  # it heard of its leave and refuted
        assert view(others[0])[alone.name] is ALIVE and alone.swim.incarnation > 1
        nursery.cancel_scope.cancel()


async def test_force_leave_names_failed_members_only(autojump_clock):
    async with trio.open_nursery() as nursery:
        net, agents = await start_agreed_cluster(nursery, 3, seed=24)
        with pytest.raises(ForceLeaveError) as alive:
            agents[0].force_leave(agents[1].name)
        assert not alive.value.missing and "alive" in str(alive.value)
        with pytest.raises(ForceLeaveError) as unknown:
            agents[0].force_leave("node-99")
        assert unknown.value.missing
        with pytest.raises(ForceLeaveError):
            agents[0].force_leave(agents[0].name)  # itself: smg-node leave
        assert agree(agents, {a.name: ALIVE for a in agents})
        nursery.cancel_scope.cancel()


async def test_a_node_name_forces_all_its_failed_processes_to_leave(autojump_clock):
    """The processes of ``--workers N`` are members that share a ``node`` tag: naming the node is enough, once
    every one of them failed."""
    async with trio.open_nursery() as nursery:
        net, agents = await start_agreed_cluster(nursery, 4, seed=25)
        for worker in agents[2:]:
            worker.set_tags({"node": "machine-b"})
        await time_until_trio(lambda: all(view(agents[0]) and agents[0].member(w.name).tags.get("node") == "machine-b"
                                     for w in agents[2:]), 30)
        net.crashed.add(agents[2].transport.addr)
        agents[2].stop()
        await time_until_trio(lambda: view(agents[0])[agents[2].name] is DEAD, 60)
        with pytest.raises(ForceLeaveError):  # one of its processes still answers
            agents[0].force_leave("machine-b")
        net.crashed.add(agents[3].transport.addr)
        agents[3].stop()
        await time_until_trio(lambda: view(agents[0])[agents[3].name] is DEAD, 60)
        assert sorted(agents[0].force_leave("machine-b")) == sorted(a.name for a in agents[2:])
        await time_until_trio(lambda: agree(agents[:2], {a.name: LEFT for a in agents[2:]}), 10)
        nursery.cancel_scope.cancel()

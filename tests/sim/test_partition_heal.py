"""A partition longer than the reap of failed members heals: the seeds are joined again (mesh/service.py
``keep_seeds_joined``).

Each side of a partition holds the other dead, then forgets it ``dead_reap_s`` later (24 h on ``lan``; it was
5 min, as these tests still set, until the long partitions of the chaos harness showed what forgetting costs).
The reconnect attempts to dead members heal shorter partitions; after a longer one the two sides ran on as two
clusters for good (every node's view stayed its own half: measured with these tests before the fix).
"""

from __future__ import annotations

import trio

from mesh.config import MeshConfig
from mesh.members import MemberStatus
from mesh.service import keep_seeds_joined, seeds_not_alive
from mesh.simnet import SimNetwork

from .harness import agree, start_cluster, view
from tests.support.waiting import time_until_trio

ALIVE = MemberStatus.ALIVE
REAP_S = 300.0  # the failed members' reap these tests set (lan's before 24 h)
PARTITION_S = 400.0  # longer than REAP_S: each side forgets the other
HEAL_BOUND_S = 90.0  # a rejoin tick (30 s, jittered up to 36 s), the push-pull, then gossip to everyone


async def _partition_then_heal(nursery: trio.Nursery, seed: int, seeds_of) -> list:
    config = MeshConfig.lan(dead_reap_s=REAP_S)
    net = SimNetwork(seed=seed)
    agents = await start_cluster(nursery, net, 6, config, seed=seed)
    everyone = {a.name: ALIVE for a in agents}
    await time_until_trio(lambda: agree(agents, everyone), 60)
    for i, agent in enumerate(agents):
        if seeds_of(i):
            nursery.start_soon(keep_seeds_joined, agent, [agents[j].transport.addr for j in seeds_of(i)],
                               config.reconnect_interval_s)
    halves = ([a.transport.addr for a in agents[:3]], [a.transport.addr for a in agents[3:]])
    net.partition(*halves)
    await trio.sleep(PARTITION_S)
    # Each side forgot the other: what made this partition permanent before.
    assert all(sorted(view(a)) == sorted(b.name for b in (agents[:3] if i < 3 else agents[3:]))
               for i, a in enumerate(agents)), f"seed={seed}: {[sorted(view(a)) for a in agents]}"
    net.heal()
    took = await time_until_trio(lambda: agree(agents, everyone), HEAL_BOUND_S)
    assert all(len(view(a)) == 6 for a in agents)
    return [took]


async def test_a_partition_longer_than_reap_heals_through_the_seeds(autojump_clock):
    """Every node but the first names it as its seed (as the deploy files do); the first names none."""
    for seed in (1, 2, 3):
        async with trio.open_nursery() as nursery:
            await _partition_then_heal(nursery, seed, lambda i: [0] if i else [])
            nursery.cancel_scope.cancel()


async def test_seeds_on_the_far_side_only_heal_too(autojump_clock):
    """The second half alone names a seed (node 0, across the partition): one side joining is enough."""
    async with trio.open_nursery() as nursery:
        await _partition_then_heal(nursery, 4, lambda i: [0] if i >= 3 else [])
        nursery.cancel_scope.cancel()


async def test_live_seeds_are_not_joined_again(autojump_clock):
    config = MeshConfig.lan()
    net = SimNetwork(seed=5)
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 3, config, seed=5)
        await time_until_trio(lambda: agree(agents, {a.name: ALIVE for a in agents}), 60)
        node = agents[2]
        seeds = [agents[0].transport.addr, agents[1].transport.addr, node.transport.addr]
        assert await seeds_not_alive(node, seeds) == []  # members and itself
        joins = []
        real_join = node.join

        async def counting_join(addrs):
            joins.append(list(addrs))
            return await real_join(addrs)

        node.join = counting_join
        nursery.start_soon(keep_seeds_joined, node, seeds, config.reconnect_interval_s)
        await trio.sleep(10 * config.reconnect_interval_s)
        assert joins == []
        # A seed that is down is tried every interval, and only it.
        net.crashed.add(agents[0].transport.addr)
        agents[0].stop()
        await time_until_trio(lambda: view(node).get(agents[0].name) is MemberStatus.DEAD, 60)
        await trio.sleep(3 * config.reconnect_interval_s)
        assert joins and all(j == [agents[0].transport.addr] for j in joins)
        nursery.cancel_scope.cancel()


async def test_a_seed_answering_under_another_address_is_said_once(autojump_clock, caplog):
    """A seed that answers every join, yet no member advertises its address (NAT, a wrong --mesh-advertise):
    joined each interval, and a warning once rather than a line every 30 s."""

    class Agent:
        leaving = False
        transport = type("T", (), {"addr": "10.0.0.2:7946"})()
        joins = 0

        def members(self):
            return []

        async def join(self, seeds):
            Agent.joins += 1
            return len(seeds)

    caplog.set_level("INFO", logger="mesh.service")
    with trio.move_on_after(10 * 30.0):
        await keep_seeds_joined(Agent(), ["10.0.0.1:7946"], 30.0)
    said = [r.getMessage() for r in caplog.records if r.name == "mesh.service"]
    assert Agent.joins >= 8
    assert len([m for m in said if "joined again" in m]) == 1
    assert len([m for m in said if "no member advertises" in m]) == 1

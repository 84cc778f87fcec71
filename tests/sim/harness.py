"""N mesh agents over the simulated network, on trio's virtual clock."""

from __future__ import annotations

import random

import trio

from mesh.agent import MeshAgent
from mesh.config import MeshConfig
from mesh.crypto import Keyring
from mesh.members import MemberStatus
from mesh.simnet import SimNetwork
from tests.support.waiting import time_until_trio

# Fixed keys so tests are reproducible; never use these outside tests.
KEY_A = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
KEY_B = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8="


def addr(i: int) -> str:
    return f"10.0.{i // 250}.{i % 250 + 1}:7946"


async def start_agent(nursery: trio.Nursery, net: SimNetwork, i: int, config: MeshConfig, seed: int,
                      keys: "list[str] | None" = None) -> MeshAgent:
    agent = MeshAgent(config, f"node-{i}", net.transport(addr(i)), Keyring(keys if keys is not None else [KEY_A]),
                      tags={"role": "gateway"}, rng=random.Random(seed * 1000 + i))
    await nursery.start(agent.run)
    return agent


async def start_cluster(nursery: trio.Nursery, net: SimNetwork, n: int, config: MeshConfig,
                        seed: int) -> list[MeshAgent]:
    net.nursery = nursery
    agents = [await start_agent(nursery, net, i, config, seed) for i in range(n)]
    for agent in agents[1:]:
        await agent.join([agents[0].transport.addr])
    return agents


async def start_agreed_cluster(nursery: trio.Nursery, n: int, seed: int,
                               config: MeshConfig | None = None) -> "tuple[SimNetwork, list[MeshAgent]]":
    """A new simulated network and ``n`` agents (``lan`` timers unless said) that all hold each other alive."""
    net = SimNetwork(seed=seed)
    agents = await start_cluster(nursery, net, n, config or MeshConfig.lan(), seed)
    await time_until_trio(lambda: agree(agents, {a.name: MemberStatus.ALIVE for a in agents}), 60)
    return net, agents


def view(agent: MeshAgent) -> dict[str, MemberStatus]:
    return {m.name: m.status for m in agent.members()}


def agree(agents: "list[MeshAgent]", expected: dict[str, MemberStatus]) -> bool:
    return all(all(view(a).get(name) is status for name, status in expected.items()) for a in agents)


async def form_cluster(nursery: trio.Nursery, net: SimNetwork, n: int, start_node) -> list:
    """``n`` nodes made by ``await start_node(i)`` (each with ``.agent`` and ``.cluster``), joined through
    the first; returns once every node's ring holds them all."""
    net.nursery = nursery
    nodes = [await start_node(i) for i in range(n)]
    for node in nodes[1:]:
        await node.agent.join([nodes[0].agent.transport.addr])
    await time_until_trio(lambda: all(len(node.cluster.ring) == len(nodes) for node in nodes), 30)
    return nodes


def crash_node(net: SimNetwork, node) -> None:
    """Everything to and from the node is lost, and its tasks stop (``node.scope``)."""
    net.crashed.add(node.agent.transport.addr)
    node.scope.cancel()

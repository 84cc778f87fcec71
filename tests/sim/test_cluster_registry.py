"""N nodes' cluster state and worker registries over the simulated network, on virtual time.

Each node is a real MeshAgent + ClusterState + WorkerRegistry following the worker document
(``gateway/cluster/registry_sync.py``); the engines are in-memory clients whose health the test
sets (``WorkerRegistry(connect=...)``). Checked: a registration on one node reaches every registry,
a removal drains everywhere, health checks move to the next ring owner when the owner crashes, and
a worker missing from the document is kept for the grace period, no longer.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import trio

from gateway.cluster import ABSENT_WORKER_GRACE_S, ClusterState, follow_worker_document
from gateway.engine.errors import EngineCallError
from gateway.routing.breaker import BreakerConfig
from gateway.workers import HealthConfig, WorkerRegistry, worker_id_for
from mesh.agent import MeshAgent
from mesh.config import MeshConfig
from mesh.crypto import Keyring
from mesh.simnet import SimNetwork

from .harness import KEY_A, addr, crash_node, form_cluster
from tests.support.waiting import time_until_trio

MESH = MeshConfig.lan()
HEALTH = HealthConfig(failure_threshold=2, success_threshold=1, interval_s=2.0, timeout_s=1.0)
ENGINE = "grpc://10.9.0.1:30001"
# Crash detection (LAN preset, 5 members: ~6 s, at most ~10 s in the mesh benchmarks) plus health
# intervals for the new owner to act on: generous, in virtual seconds.
HANDOVER_BOUND_S = 40.0


class Engines:
    """The simulated engines' state, shared by every node's clients (as real engines are)."""

    def __init__(self) -> None:
        self.healthy: dict[str, bool] = {}
        self.checks: dict[str, list[str]] = {}  # url -> nodes that checked it, in order

    async def connect(self, node: str, kind: str, target: str, url: str, model: str | None,
                      api_key: str | None) -> tuple["FakeClient", tuple[str, ...], int | None]:
        if url not in self.healthy:
            raise EngineCallError("UNAVAILABLE", f"nothing at {url}")
        return FakeClient(self, node, url), (model or "sim-model",), 4096


class FakeClient:
    kind = "grpc"
    runtime_name = "sglang"
    needs_tokenizer = True
    publishes_kv_events = False
    architectures = ()

    def __init__(self, engines: Engines, node: str, url: str) -> None:
        self.engines, self.node, self.url = engines, node, url

    async def health(self, timeout_s: float) -> bool:
        self.engines.checks.setdefault(self.url, []).append(self.node)
        return self.engines.healthy[self.url]

    async def loads(self, timeout_s: float) -> None:
        return None

    async def aclose(self) -> None:
        pass


@dataclasses.dataclass
class Node:
    name: str
    agent: MeshAgent
    cluster: ClusterState
    registry: WorkerRegistry
    scope: trio.CancelScope


async def start_node(nursery: trio.Nursery, net: SimNetwork, i: int, engines: Engines, seed: int) -> Node:
    name = f"node-{i}"
    cluster = ClusterState(name)
    agent = MeshAgent(MESH, name, net.transport(addr(i)), Keyring([KEY_A]), hooks=cluster,
                      rng=random.Random(seed * 1000 + i))
    cluster.attach(agent)

    async def connect(*args):
        return await engines.connect(name, *args)

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as inner:
                await inner.start(agent.run)
                registry = WorkerRegistry(None, None, HEALTH, BreakerConfig(), inner, cluster=cluster,
                                          connect=connect)
                inner.start_soon(follow_worker_document, registry, cluster)
                task_status.started((scope, registry))

    scope, registry = await nursery.start(run)
    return Node(name, agent, cluster, registry, scope)


async def start_cluster(nursery: trio.Nursery, net: SimNetwork, n: int, engines: Engines, seed: int) -> list[Node]:
    return await form_cluster(nursery, net, n, lambda i: start_node(nursery, net, i, engines, seed))


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_registration_reaches_every_registry_and_a_removal_drains_everywhere(autojump_clock, seed):
    engines = Engines()
    engines.healthy[ENGINE] = True
    wid = worker_id_for(ENGINE)
    async with trio.open_nursery() as nursery:
        nodes = await start_cluster(nursery, SimNetwork(seed), 5, engines, seed)
        await nodes[0].registry.add(ENGINE)
        took = await time_until_trio(lambda: all(n.registry.get(wid) is not None and n.registry.get(wid).healthy
                                            for n in nodes), 30)
        print(f"seed={seed}: registered everywhere in {took:.1f} virtual s")
        await nodes[3].registry.remove(wid)  # removed on another node than the one that added it
        await time_until_trio(lambda: all(n.registry.get(wid) is None for n in nodes), 30)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", [4, 5])
async def test_health_checks_move_to_the_next_owner_when_the_owner_crashes(autojump_clock, seed):
    engines = Engines()
    engines.healthy[ENGINE] = True
    wid = worker_id_for(ENGINE)
    async with trio.open_nursery() as nursery:
        net = SimNetwork(seed)
        nodes = await start_cluster(nursery, net, 5, engines, seed)
        await nodes[0].registry.add(ENGINE)
        await time_until_trio(lambda: all(n.registry.get(wid) is not None for n in nodes), 30)
        owner = next(n for n in nodes if n.cluster.owns(wid))
        assert sum(n.cluster.owns(wid) for n in nodes) == 1, f"seed={seed}: one owner"
        await time_until_trio(lambda: all((n.cluster.health_of(wid) or {}).get("by") == owner.name for n in nodes), 30)

        crash_node(net, owner)
        survivors = [n for n in nodes if n is not owner]
        engines.healthy[ENGINE] = False  # only a live owner's checks can find this out
        took = await time_until_trio(lambda: all(n.registry.get(wid) is not None and not n.registry.get(wid).healthy
                                            for n in survivors), HANDOVER_BOUND_S)
        successor = next(n for n in survivors if n.cluster.owns(wid))
        assert all(n.cluster.owns(wid) == (n is successor) for n in survivors), f"seed={seed}"
        assert all(n.cluster.health_of(wid)["by"] == successor.name for n in survivors), f"seed={seed}"
        # From now on the checks are the successor's alone.
        before = len(engines.checks[ENGINE])
        await trio.sleep(3 * HEALTH.interval_s)
        checks_after = engines.checks[ENGINE][before:]
        assert checks_after and set(checks_after) == {successor.name}, f"seed={seed}: {checks_after}"
        print(f"seed={seed}: {successor.name} took over from {owner.name}; unhealthy everywhere after {took:.1f} s")
        nursery.cancel_scope.cancel()


async def test_a_worker_missing_from_the_document_is_kept_for_the_grace_period_only(autojump_clock):
    engines = Engines()
    other = "grpc://10.9.0.2:30001"
    engines.healthy[ENGINE] = engines.healthy[other] = True
    async with trio.open_nursery() as nursery:
        nodes = await start_cluster(nursery, SimNetwork(7), 3, engines, 7)
        # A worker this node has but the document does not list (and no tombstone says it was removed):
        # what a node sees for a moment while documents merge.
        await nodes[1].registry.add(other, replicate=False)
        wid = worker_id_for(other)
        started = trio.current_time()
        await trio.sleep(ABSENT_WORKER_GRACE_S - 1)
        assert nodes[1].registry.get(wid) is not None and not nodes[1].registry.get(wid).draining
        await time_until_trio(lambda: nodes[1].registry.get(wid) is None, HEALTH.interval_s + 5)
        assert trio.current_time() - started >= ABSENT_WORKER_GRACE_S
        # A removal someone wrote (a tombstone) drains at once, with no grace.
        await nodes[0].registry.add(ENGINE)
        await time_until_trio(lambda: all(n.registry.get(worker_id_for(ENGINE)) is not None for n in nodes), 30)
        await nodes[0].registry.remove(worker_id_for(ENGINE))
        took = await time_until_trio(lambda: all(n.registry.get(worker_id_for(ENGINE)) is None for n in nodes), 15)
        assert took < ABSENT_WORKER_GRACE_S
        nursery.cancel_scope.cancel()

"""Whole clusters over the simulated network, on virtual time (MockClock, autojump)."""

from __future__ import annotations

import pytest
import trio

from mesh.agent import JoinError
from mesh.config import MeshConfig
from mesh.members import MemberStatus
from mesh.simnet import LinkFaults, SimNetwork

from .harness import KEY_B, agree, start_agent, start_cluster, view
from tests.support.waiting import time_until_trio

ALIVE, DEAD, LEFT = MemberStatus.ALIVE, MemberStatus.DEAD, MemberStatus.LEFT


async def test_ten_nodes_join_through_one_seed(autojump_clock):
    net = SimNetwork(seed=1)
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 10, MeshConfig.lan(), seed=1)
        took = await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(10)}), 30)
        assert took < 10
        assert all(m.tags == {"role": "gateway"} for m in agents[3].members())
        nursery.cancel_scope.cancel()


async def test_crashed_node_is_declared_dead_by_everyone(autojump_clock):
    net = SimNetwork(seed=2)
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 5, MeshConfig.lan(), seed=2)
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(5)}), 30)
        crashed_at = trio.current_time()
        net.crashed.add(agents[4].transport.addr)
        agents[4].stop()
        took = await time_until_trio(lambda: agree(agents[:4], {"node-4": DEAD}), 60)
        # memberlist's LAN defaults: ~5-6 s typical, ~25 s worst (ARCHITECTURE.md, design notes).
        assert took < 25, f"detection took {took}s"
        assert trio.current_time() - crashed_at == took
        # A lost host answers nothing, not even a refusal: no shortcut (a partition looks the same).
        assert took >= MeshConfig.lan().suspicion_min_s(5), took
        assert sum(a.protocol_stats["listener_checks"] for a in agents[:4]) >= 1
        assert sum(a.protocol_stats["listeners_refused"] for a in agents[:4]) == 0
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", [2, 7, 11])
async def test_a_crashed_process_whose_host_refuses_its_port_is_dead_everywhere_within_three_seconds(
        autojump_clock, seed):
    """SIGKILL, OOM kill, panic: the host is up and refuses connections to the port, which a slow or paused
    process's kernel never does. The probers' own refusals cut the suspicion to 0.5 s: ~2 s in all, where a
    lost host (nothing answers, the test above) waits the 4 s minimum a slow member needs to refute."""
    net = SimNetwork(seed=seed, faults=LinkFaults(delay_s=0.001, jitter_s=0.002))
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 5, MeshConfig.lan(), seed=seed)
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(5)}), 30)
        await trio.sleep(5)
        net.stopped.add(agents[4].transport.addr)
        agents[4].stop()
        took = await time_until_trio(lambda: agree(agents[:4], {"node-4": DEAD}), 60)
        assert took <= 3.0, f"detection took {took} s"
        assert sum(a.protocol_stats["listeners_refused"] for a in agents[:4]) >= 1
        # The same process back at its address: it rejoins, and nothing refuses it any more.
        net.stopped.discard(agents[4].transport.addr)
        agents[4] = await start_agent(nursery, net, 4, MeshConfig.lan(), seed=seed + 100)
        await agents[4].join([agents[0].transport.addr])
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(5)}), 30)
        await trio.sleep(60)
        assert agree(agents, {f"node-{i}": ALIVE for i in range(5)})
        nursery.cancel_scope.cancel()


async def test_graceful_leave_is_left_not_dead(autojump_clock):
    net = SimNetwork(seed=3)
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 5, MeshConfig.lan(), seed=3)
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(5)}), 30)
        await agents[2].leave()
        rest = [a for i, a in enumerate(agents) if i != 2]
        took = await time_until_trio(lambda: agree(rest, {"node-2": LEFT}), 30)
        assert took < 5
        await trio.sleep(30)
        assert agree(rest, {"node-2": LEFT})  # not turned into dead later
        nursery.cancel_scope.cancel()


async def test_a_dead_node_that_restarts_rejoins_with_a_higher_incarnation(autojump_clock):
    net = SimNetwork(seed=4)
    config = MeshConfig.lan()
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 4, config, seed=4)
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(4)}), 30)
        net.crashed.add(agents[3].transport.addr)
        agents[3].stop()
        await time_until_trio(lambda: agree(agents[:3], {"node-3": DEAD}), 60)
        dead_incarnation = next(m.incarnation for m in agents[0].members() if m.name == "node-3")
        net.crashed.discard(agents[3].transport.addr)
        reborn = await start_agent(nursery, net, 3, config, seed=99)
        await reborn.join([agents[0].transport.addr])
        await time_until_trio(lambda: agree(agents[:3] + [reborn], {f"node-{i}": ALIVE for i in range(4)}), 30)
        assert next(m.incarnation for m in agents[0].members() if m.name == "node-3") > dead_incarnation
        nursery.cancel_scope.cancel()


async def test_nodes_killed_and_restarted_in_turn_are_declared_dead_as_fast_each_time(autojump_clock):
    """As mesh_real_bench.py does with real processes: kill each node in turn, restart it, and kill them all
    again. A restarted node refutes its previous life's death (a peer's "dead", merged at its join, is a
    suspicion in its own name): that is no sign of slowness. When it counted as one, every survivor of the
    second round held its own suspicions for the longest timeout and the second kills took ~26 s."""
    net = SimNetwork(seed=5, faults=LinkFaults(delay_s=0.001, jitter_s=0.002))
    config = MeshConfig.lan()
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 5, config, seed=5)
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(5)}), 30)
        took = []
        for trial in range(8):
            victim = 1 + trial % 4
            net.crashed.add(agents[victim].transport.addr)
            agents[victim].stop()
            survivors = [a for i, a in enumerate(agents) if i != victim]
            took.append(await time_until_trio(lambda: agree(survivors, {f"node-{victim}": DEAD}), 60))
            net.crashed.discard(agents[victim].transport.addr)
            agents[victim] = await start_agent(nursery, net, victim, config, seed=100 + trial)
            await agents[victim].join([agents[0].transport.addr])
            await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(5)}), 30)
        assert max(took) < 10, f"detection times {took}"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", [3, 5, 6])
async def test_a_crash_right_after_a_lossy_half_minute_is_declared_dead_without_the_longest_wait(
        autojump_clock, seed):
    """30 s of 20 % packet loss have most members refute a suspicion of themselves; the loss ends and a node
    crashes. A refutation's memory holds a suspicion for the longest timeout only while it lasts (20 s), and
    our own refutation only while our probes still fail: detection took 25-28 s on these seeds when every
    survivor held its suspicions for the whole minute's memory; ~6-8 s now."""
    net = SimNetwork(seed=seed, faults=LinkFaults(delay_s=0.001, jitter_s=0.002))
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 5, MeshConfig.lan(), seed=seed)
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(5)}), 30)
        net.faults = LinkFaults(drop=0.2, delay_s=0.001, jitter_s=0.002)
        await trio.sleep(30)
        net.faults = LinkFaults(delay_s=0.001, jitter_s=0.002)
        net.crashed.add(agents[4].transport.addr)
        agents[4].stop()
        took = await time_until_trio(lambda: all(view(a).get("node-4") is DEAD for a in agents[:4]), 60)
        assert took < 12, f"seed {seed}: detection took {took:.2f} s"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_three_nodes_declare_a_crashed_one_dead_as_fast_as_five_do(autojump_clock, seed):
    """The one confirmation a 3-member cluster can give brings the minimum suspicion (Lifeguard's k is at most
    n - 2): ~6 s on the LAN preset, where k = 2 left it at ~13 s (60 % of the longest timeout)."""
    net = SimNetwork(seed=seed, faults=LinkFaults(delay_s=0.001, jitter_s=0.002))
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 3, MeshConfig.lan(), seed=seed)
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(3)}), 30)
        net.crashed.add(agents[2].transport.addr)
        agents[2].stop()
        took = await time_until_trio(lambda: agree(agents[:2], {"node-2": DEAD}), 60)
        assert took < 8, f"seed {seed}: detection took {took:.2f} s"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_a_slow_member_of_three_declares_no_healthy_one_dead(autojump_clock, seed):
    """A member handling every packet 4 s late suspects the healthy ones from its late view; nobody
    confirms (they hear each other), so its suspicions run the longest timeout and their refutations reach it
    (memberlist's k = 0 for n - 2 < k would give the minimum, 4 s: measured 7 false verdicts in 10 seeds)."""
    net = SimNetwork(seed=seed, faults=LinkFaults(delay_s=0.001, jitter_s=0.002))
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 3, MeshConfig.lan(), seed=seed)
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(3)}), 30)
        verdicts = []
        for agent in agents:
            agent.listeners.append(lambda member, previous, observer=agent.name: verdicts.append(
                (observer, member.name)) if member.status is DEAD and member.name != "node-0" else None)
        net.slow_s[agents[0].transport.addr] = 4.0
        await trio.sleep(120)
        assert not verdicts, f"seed {seed}: healthy members declared dead (observer, member): {verdicts}"
        nursery.cancel_scope.cancel()


async def test_a_node_without_the_key_cannot_join(autojump_clock):
    net = SimNetwork(seed=5)
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 3, MeshConfig.lan(), seed=5)
        stranger = await start_agent(nursery, net, 9, MeshConfig.lan(), seed=5, keys=[KEY_B])
        with pytest.raises(JoinError):
            await stranger.join([agents[0].transport.addr])
        await trio.sleep(10)
        assert "node-9" not in view(agents[0]) and "node-9" not in view(agents[1])
        assert agents[0].stats.dropped["decrypt"] >= 1
        nursery.cancel_scope.cancel()


async def test_tag_changes_propagate(autojump_clock):
    net = SimNetwork(seed=6)
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 6, MeshConfig.lan(), seed=6)
        await time_until_trio(lambda: agree(agents, {f"node-{i}": ALIVE for i in range(6)}), 30)
        agents[1].set_tags({"role": "gateway", "zone": "b"})

        def seen() -> bool:
            return all(next(m for m in a.members() if m.name == "node-1").tags.get("zone") == "b" for a in agents)

        assert await time_until_trio(seen, 10) < 3
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", [11, 12, 13])
async def test_partition_then_heal_converges(autojump_clock, seed):
    net = SimNetwork(seed=seed, faults=LinkFaults(drop=0.05, duplicate=0.02, delay_s=0.002, jitter_s=0.01))
    config = MeshConfig.lan()
    async with trio.open_nursery() as nursery:
        agents = await start_cluster(nursery, net, 8, config, seed=seed)
        everyone = {f"node-{i}": ALIVE for i in range(8)}
        await time_until_trio(lambda: agree(agents, everyone), 60)
        left, right = [a.transport.addr for a in agents[:4]], [a.transport.addr for a in agents[4:]]
        net.partition(left, right)
        await trio.sleep(60)  # each side declares the other dead
        assert agree(agents[:4], {f"node-{i}": DEAD for i in range(4, 8)}), f"seed={seed}"
        net.heal()
        # Dead members are still gossiped to for a while and push-pull repairs the rest:
        # within a stated bound everyone is alive again in every view.
        took = await time_until_trio(lambda: agree(agents, everyone), 120)
        assert took < 120, f"seed={seed}"
        nursery.cancel_scope.cancel()


class RecordingHooks:
    """A subsystem plugged into the mesh: a set of strings replicated by push-pull and gossip."""

    def __init__(self, items=()):
        self.items = set(items)
        self.outbox: list[bytes] = []
        self.sent: dict[bytes, int] = {}

    def local_state(self, join: bool) -> bytes:
        return "\n".join(sorted(self.items)).encode()

    def merge_remote_state(self, data: bytes, join: bool) -> None:
        self.items |= {x for x in data.decode().split("\n") if x}

    def broadcasts(self, budget_bytes: int) -> "list[bytes]":
        # Each payload rides on the next 6 packets (a subsystem keeps its own retransmit count).
        out = []
        for item in list(self.outbox):
            if len(item) + 8 <= budget_bytes:
                budget_bytes -= len(item) + 8
                out.append(item)
                self.sent[item] = self.sent.get(item, 0) + 1
                if self.sent[item] >= 6:
                    self.outbox.remove(item)
        return out

    def notify(self, payload: bytes) -> None:
        self.items.add(payload.decode())


async def test_state_hooks_ride_on_push_pull_and_gossip(autojump_clock):
    import random

    from mesh.agent import MeshAgent
    from mesh.crypto import Keyring

    from .harness import KEY_A, addr

    net = SimNetwork(seed=8)
    async with trio.open_nursery() as nursery:
        net.nursery = nursery
        hooks = [RecordingHooks({f"from-{i}"}) for i in range(4)]
        agents = []
        for i in range(4):
            agent = MeshAgent(MeshConfig.lan(), f"node-{i}", net.transport(addr(i)), Keyring([KEY_A]), hooks=hooks[i],
                              rng=random.Random(i))
            await nursery.start(agent.run)
            agents.append(agent)
        for agent in agents[1:]:
            await agent.join([agents[0].transport.addr])
        # A joining node receives the whole state at once (push-pull with the seed).
        assert {"from-0", "from-3"} <= hooks[3].items
        hooks[2].outbox.append(b"news")  # the subsystem's own broadcasts ride on gossip packets
        await time_until_trio(lambda: all("news" in h.items for h in hooks if h is not hooks[2]), 10)
        agents[1].broadcast(b"queued", key="k")  # or it hands them to the mesh's retransmit queue
        await time_until_trio(lambda: all("queued" in h.items for h in hooks if h is not hooks[1]), 10)
        nursery.cancel_scope.cancel()


async def test_join_retries_until_a_seed_appears(autojump_clock):
    from mesh.options import MeshOptions
    from mesh.service import join_with_retry

    from .harness import addr

    net = SimNetwork(seed=9)
    async with trio.open_nursery() as nursery:
        net.nursery = nursery
        late = await start_agent(nursery, net, 1, MeshConfig.lan(), seed=9)
        options = MeshOptions(bind=addr(1), join=(addr(0),), retry_join_interval_s=1.0)
        joined = trio.Event()

        async def join():
            assert await join_with_retry(late, options)
            joined.set()

        nursery.start_soon(join)
        await trio.sleep(30)  # the seed is not there yet: attempts fail and back off
        assert not joined.is_set()
        seed = await start_agent(nursery, net, 0, MeshConfig.lan(), seed=9)
        await joined.wait()
        assert agree([late, seed], {"node-0": ALIVE, "node-1": ALIVE})
        assert trio.current_time() < 30 + 60  # backoff is capped at 60 s
        nursery.cancel_scope.cancel()


async def test_join_gives_up_after_retry_join_rounds(autojump_clock):
    from mesh.options import MeshOptions
    from mesh.service import join_with_retry

    from .harness import addr

    net = SimNetwork(seed=10)
    async with trio.open_nursery() as nursery:
        net.nursery = nursery
        lonely = await start_agent(nursery, net, 1, MeshConfig.lan(), seed=10)
        options = MeshOptions(bind=addr(1), join=(addr(0),), retry_join_max=3, retry_join_interval_s=1.0)
        assert not await join_with_retry(lonely, options)
        nursery.cancel_scope.cancel()


async def test_dns_seeds_resolve_to_every_address():
    from mesh.service import resolve_seeds

    seeds = await resolve_seeds(["dns:localhost:7946", "10.0.0.1:7946", "dns:no-such-host.invalid:1"])
    assert "127.0.0.1:7946" in seeds and "10.0.0.1:7946" in seeds
    assert not any("no-such-host" in s for s in seeds)

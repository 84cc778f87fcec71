"""Mesh figures on the simulated network (virtual time): not a test, it prints figures.

    python tests/bench/mesh_bench.py [--seeds 5] [--nodes-large 1000]

* Lifeguard: 20 members, 3 of them slow (every packet to them handled 4 s
  late, like a CPU-starved process), no member ever fails; 120 virtual seconds.
  Every "dead" verdict is a false positive; those about healthy (not slow)
  members are the ones Lifeguard exists to prevent. Lifeguard on vs off (plain SWIM).
* Dissemination: one member changes its tags; virtual time until 99.99 % of
  members (all of them, below 10,000) have seen it. 30 and --nodes-large members.
* Crash detection: time from a crash until every survivor holds the member dead.
* Gossip bytes per second per node in steady state.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import trio
import trio.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mesh.agent import MeshAgent  # noqa: E402
from mesh.config import MeshConfig  # noqa: E402
from mesh.crypto import Keyring  # noqa: E402
from mesh.members import MemberStatus  # noqa: E402
from mesh.simnet import LinkFaults, SimNetwork  # noqa: E402
from mesh.swim import RemoteState  # noqa: E402
from mesh.wire import PushPull  # noqa: E402

KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="


async def _cluster(nursery, net: SimNetwork, n: int, config: MeshConfig, seed: int) -> list[MeshAgent]:
    """n agents that already know each other (as after a join), for steady-state figures."""
    net.nursery = nursery
    agents = []
    for i in range(n):
        agent = MeshAgent(config, f"node-{i}", net.transport(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:7946"),
                          Keyring([KEY]), rng=random.Random(seed * 100_000 + i))
        await nursery.start(agent.run)
        agents.append(agent)
    everyone = tuple(m for a in agents for m in a.swim.local_state() if m.name == a.name)
    for agent in agents:
        agent._handle(RemoteState(PushPull(False, everyone, b"")))
    await trio.sleep(config.probe_interval_s * 3)
    return agents


def _dead_verdicts(agents: "list[MeshAgent]") -> int:
    return sum(1 for a in agents for m in a.members() if m.status is MemberStatus.DEAD)


SLOW_S = 4.0


async def lifeguard_scenario(seed: int, lifeguard: bool) -> dict:
    net = SimNetwork(seed, LinkFaults(delay_s=0.001, jitter_s=0.002))
    config = MeshConfig.lan(lifeguard=lifeguard)
    dead = {"healthy": 0, "slow": 0}
    async with trio.open_nursery() as nursery:
        agents = await _cluster(nursery, net, 20, config, seed)
        slow = {a.name for a in agents[:3]}

        def on_change(member, previous):
            if member.status is MemberStatus.DEAD:
                dead["slow" if member.name in slow else "healthy"] += 1

        for a in agents:
            a.listeners.append(on_change)
        for a in agents[:3]:
            net.slow_s[a.transport.addr] = SLOW_S
        await trio.sleep(120)
        suspicions = sum(a.swim.stats["suspicions_raised"] for a in agents)
        nursery.cancel_scope.cancel()
    return {"healthy_dead": dead["healthy"], "slow_dead": dead["slow"], "suspicions": suspicions}


async def dissemination_scenario(seed: int, n: int) -> float:
    net = SimNetwork(seed, LinkFaults(delay_s=0.001, jitter_s=0.002))
    async with trio.open_nursery() as nursery:
        agents = await _cluster(nursery, net, n, MeshConfig.lan(), seed)
        start = trio.current_time()
        agents[0].set_tags({"changed": "yes"})
        need = n if n < 10_000 else int(n * 0.9999)
        while True:
            seen = sum(1 for a in agents if a.swim.table.get("node-0").tags == (("changed", "yes"),))
            if seen >= need:
                break
            await trio.sleep(0.01)
        took = trio.current_time() - start
        nursery.cancel_scope.cancel()
    return took


async def crash_scenario(seed: int, n: int, host_lost: bool = True) -> tuple[float, float]:
    """(seconds until every survivor holds the crashed member dead, gossip bytes/s/node before). ``host_lost``:
    nothing answers (the machine or its link is gone); else only the process is gone, and its host refuses
    connections to its port (a SIGKILL, an OOM kill, a panic)."""
    net = SimNetwork(seed, LinkFaults(delay_s=0.001, jitter_s=0.002))
    async with trio.open_nursery() as nursery:
        agents = await _cluster(nursery, net, n, MeshConfig.lan(), seed)
        b0, t0 = sum(a.stats.bytes_sent for a in agents), trio.current_time()
        await trio.sleep(30)
        rate = (sum(a.stats.bytes_sent for a in agents) - b0) / (trio.current_time() - t0) / n
        victim = agents[-1]
        (net.crashed if host_lost else net.stopped).add(victim.transport.addr)
        victim.stop()
        start = trio.current_time()
        while not all(a.swim.table.get(victim.name).status is MemberStatus.DEAD for a in agents[:-1]):
            await trio.sleep(0.05)
        took = trio.current_time() - start
        nursery.cancel_scope.cancel()
    return took, rate


PARTS = ["lifeguard", "crash", "dissemination"]


def run(fn, *args):
    return trio.run(fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--nodes-large", type=int, default=1000)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS, help="which tables to print")
    args = parser.parse_args()
    seeds = list(range(1, args.seeds + 1))
    wall = time.perf_counter()

    print(f"# Mesh on the simulated network, {time.strftime('%Y-%m-%d')}, seeds {seeds}\n")
    if "lifeguard" in args.parts:
        lifeguard_table(seeds)
    if "crash" in args.parts:
        crash_table(seeds)
    if "dissemination" in args.parts:
        dissemination_table(seeds, args.nodes_large)
    print(f"\n(wall time of this run: {time.perf_counter() - wall:.0f} s)")


def lifeguard_table(seeds: "list[int]") -> None:
    print(f"## Lifeguard: 20 members, 3 slow ({SLOW_S:.0f} s), nobody fails, 120 s\n")
    print("False 'dead' verdicts (one per member per observer), about healthy members and about the slow ones, "
          "and suspicions raised.\n")
    print("| seed | SWIM: healthy dead | SWIM: slow dead | SWIM suspicions | Lifeguard: healthy dead | "
          "Lifeguard: slow dead | Lifeguard suspicions |")
    print("|---|---|---|---|---|---|---|")
    totals = [0] * 6
    for seed in seeds:
        plain = run(lifeguard_scenario, seed, False)
        lg = run(lifeguard_scenario, seed, True)
        row = [plain["healthy_dead"], plain["slow_dead"], plain["suspicions"], lg["healthy_dead"], lg["slow_dead"],
               lg["suspicions"]]
        totals = [t + r for t, r in zip(totals, row)]
        print(f"| {seed} | " + " | ".join(map(str, row)) + " |", flush=True)
    print("| total | " + " | ".join(map(str, totals)) + " |\n")


def crash_table(seeds: "list[int]") -> None:
    print("## Crash detection and gossip load (LAN preset)\n")
    print("| members | crash | -> all survivors hold it dead, p50 s | max s | gossip bytes/s/node |")
    print("|---|---|---|---|---|")
    for n in (5, 30):
        for host_lost in (True, False):
            results = [run(crash_scenario, seed, n, host_lost) for seed in seeds]
            took = [r[0] for r in results]
            print(f"| {n} | {'host lost' if host_lost else 'process gone'} | {statistics.median(took):.2f} | "
                  f"{max(took):.2f} | {statistics.median(r[1] for r in results):.0f} |", flush=True)


def dissemination_table(seeds: "list[int]", nodes_large: int) -> None:
    print("\n## Dissemination of one change (LAN preset: gossip every 200 ms to 3 members)\n")
    print("| members | virtual s to reach all, p50 | max |")
    print("|---|---|---|")
    for n in (30, nodes_large):
        took = [run(dissemination_scenario, seed, n) for seed in seeds[:3 if n > 100 else len(seeds)]]
        print(f"| {n} | {statistics.median(took):.2f} | {max(took):.2f} |", flush=True)


if __name__ == "__main__":
    main()

"""The named scenarios: when each fault strikes and when it heals, seeded and replayable.

A scenario turns (cluster, seeded rng, duration) into timed ``Event``s. Faults
start a quarter into the run and heal by about 60 % of it, so the rest of the
run shows the cluster converging under load. ``kind`` tells the checkers what a
fault may excuse: ``process`` faults (kill, pause, restart) may fail requests
that were in flight on that process; ``network`` faults between nodes may not
fail any request; a ``model`` fault (every engine of one model gone) may fail
that model's requests, with a 503 that names it, and no other model's.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any

from gateway.ratelimit.limits import Identity
from mesh.ring import HashRing

from .cluster import ChaosCluster

HOT_API_KEY = "chaos-hot"  # the workload's rate-limited key


@dataclasses.dataclass
class Event:
    at_s: float
    label: str
    kind: str  # process, network, heal
    action: Callable[[], None]
    nodes: tuple[int, ...] = ()
    model: str | None = None  # a model fault's model (and its heal's)


@dataclasses.dataclass
class Plan:
    events: list[Event]
    heal_at_s: float  # everything is back by then (the membership checker starts here)
    faults: int  # how many faults strike the rate limiter's owners (for its overshoot bound)
    pause_s: float = 0.0  # the longest a process is stopped (requests on it wait that long)


def hot_key_owner(cluster: ChaosCluster) -> int:
    """The node whose process owns the hot key (the ring is of every node's processes)."""
    machine_of = {member: i for i in range(cluster.spec.nodes) for member in cluster.members(i)}
    key = f"per-key:{Identity.hash_api_key('Bearer ' + HOT_API_KEY)}"
    return machine_of[HashRing.build(list(machine_of)).owner(key)]


def kill_one(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    victim = rng.randrange(cluster.spec.nodes)
    start, back = 0.25 * duration_s, 0.55 * duration_s
    return Plan([Event(start, f"SIGKILL {cluster.name(victim)}", "process", lambda: cluster.kill(victim), (victim,)),
                 Event(back, f"restart {cluster.name(victim)}", "heal",
                       lambda: cluster.restart(victim, graceful=False), (victim,))], back, 1)


def lose_one(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    """A node lost for good: SIGKILLed and never restarted. The others hold it failed (it may be cut off: it
    keeps its share of the rate limits) until an operator says it is gone (``smg-node force-leave`` on a
    survivor); then they carry on as a cluster without it, every stored response still read back."""
    victim = rng.randrange(cluster.spec.nodes)
    operator = next(i for i in range(cluster.spec.nodes) if i != victim)
    start, gone = 0.25 * duration_s, 0.45 * duration_s
    return Plan([Event(start, f"SIGKILL {cluster.name(victim)} (for good)", "process", lambda: cluster.kill(victim),
                       (victim,)),
                 Event(gone, f"force-leave {cluster.name(victim)} (operator, on {cluster.name(operator)})", "heal",
                       lambda: cluster.force_leave(operator, victim), (victim,))], gone, 1)


def kill_owner(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    owner = hot_key_owner(cluster)
    start, back = 0.25 * duration_s, 0.55 * duration_s
    return Plan([Event(start, f"SIGKILL {cluster.name(owner)} (owns the hot rate-limit key)", "process",
                       lambda: cluster.kill(owner), (owner,)),
                 Event(back, f"restart {cluster.name(owner)}", "heal",
                       lambda: cluster.restart(owner, graceful=False), (owner,))], back, 1)


def kill_owner_machine(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    """Nodes of two processes each (--workers 2): the machine owning the hot rate-limit key SIGKILLed whole, then
    restarted. Its keys' copies are on other machines (one placement rule), so the counts go on there."""
    owner = hot_key_owner(cluster)
    start, back = 0.25 * duration_s, 0.55 * duration_s
    return Plan([Event(start, f"SIGKILL {cluster.name(owner)}'s {cluster.spec.workers} processes (own the hot "
                              "rate-limit key)", "process", lambda: cluster.kill(owner), (owner,)),
                 Event(back, f"restart {cluster.name(owner)}", "heal",
                       lambda: cluster.restart(owner, graceful=False), (owner,))], back, 1)


KILL_EVERY_S = 20.0
RESTART_AFTER_S = 8.0


def kill_in_turn(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    """Crash detection under load, on the `lan` preset (memberlist's timers, as deployed): every KILL_EVERY_S
    one node SIGKILLed, restarted RESTART_AFTER_S later; the victims take turns among all nodes but the first
    two (the seeds stay up, and the no-false-dead check keeps two untouched nodes to judge each other). The
    crash-detection check reads how long every other node took to list each victim dead."""
    victims = list(range(2, cluster.spec.nodes)) or [cluster.spec.nodes - 1]
    rng.shuffle(victims)
    first, last = 0.15 * duration_s, 0.75 * duration_s
    events, owner, faults = [], hot_key_owner(cluster), 0
    for k in range(max(1, int((last - first) // KILL_EVERY_S))):
        victim, at = victims[k % len(victims)], first + k * KILL_EVERY_S
        faults += victim == owner
        events += [Event(at, f"SIGKILL {cluster.name(victim)}", "process", lambda v=victim: cluster.kill(v),
                         (victim,)),
                   Event(at + RESTART_AFTER_S, f"restart {cluster.name(victim)}", "heal",
                         lambda v=victim: cluster.restart(v, graceful=False), (victim,))]
    return Plan(events, events[-1].at_s, max(1, faults))


def pause_one(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    victim = rng.randrange(cluster.spec.nodes)
    start = 0.25 * duration_s
    return Plan([Event(start, f"SIGSTOP {cluster.name(victim)}", "process", lambda: cluster.pause(victim), (victim,)),
                 Event(start + 10, f"SIGCONT {cluster.name(victim)}", "heal", lambda: cluster.resume(victim),
                       (victim,))], start + 10, 1, pause_s=10.0)


def partition_halves(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    order = list(range(cluster.spec.nodes))
    rng.shuffle(order)
    half = len(order) // 2
    a, b = sorted(order[:half]), sorted(order[half:])
    start, heal = 0.25 * duration_s, 0.55 * duration_s
    label = f"partition {[cluster.name(i) for i in a]} | {[cluster.name(i) for i in b]}"
    return Plan([Event(start, label, "network", lambda: cluster.partition(a, b), tuple(order)),
                 Event(heal, "heal the partition", "heal", cluster.heal)], heal, 1)


def isolate_one(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    victim = rng.randrange(cluster.spec.nodes)
    rest = [i for i in range(cluster.spec.nodes) if i != victim]
    start, heal = 0.25 * duration_s, 0.55 * duration_s
    return Plan([Event(start, f"isolate {cluster.name(victim)}", "network", lambda: cluster.partition([victim], rest),
                       (victim,)),
                 Event(heal, "heal the partition", "heal", cluster.heal)], heal, 1)


def lossy_network(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    start, heal = 0.25 * duration_s, 0.6 * duration_s
    return Plan([Event(start, "10% packet loss between all nodes", "network", lambda: cluster.set_loss(0.10)),
                 Event(heal, "loss back to 0", "heal", cluster.heal)], heal, 1)


def rolling_restart(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    n = cluster.spec.nodes
    first, last = 0.15 * duration_s, 0.6 * duration_s
    step = (last - first) / max(1, n - 1)
    events = [Event(first + k * step, f"restart {cluster.name(i)} (SIGTERM, drain, start)", "process",
                    lambda i=i: cluster.restart(i, graceful=True), (i,)) for k, i in enumerate(range(n))]
    return Plan(events, last + 5, n)


def restart_engines(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    m = cluster.spec.engines
    first, last = 0.25 * duration_s, 0.55 * duration_s
    step = (last - first) / max(1, m - 1)
    events = [Event(first + k * step, f"restart engine{j}", "process", lambda j=j: cluster.restart_engine(j))
              for k, j in enumerate(range(m))]
    return Plan(events, last + 2, 0)


def kill_history_owners(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    """Two owners of stored responses killed one after the other, each restarted with an empty memory (its data
    directory kept, as a machine keeps its disk); with three nodes every node owns every response. Responses
    acknowledged before each kill must survive it, and those only the first victim got back from its peers must
    survive the second. The second kill waits until the first victim is ready again (joined, the registry
    received), as an operator does: on a busy machine a restart can take longer than the plan's gap, and a second
    kill before the first victim rejoined leaves one node alone to refuse writes (a harness race, not a store's
    loss). The second victim then stays dead for the plan's gap, whenever its kill came, so that every node sees
    it dead before it is back."""
    first, second = rng.sample(range(cluster.spec.nodes), 2)
    times = [f * duration_s for f in (0.2, 0.4, 0.5, 0.7)]

    def restart_first() -> None:
        cluster.restart(first, graceful=False)
        cluster.wait_ready(first)

    def kill_second() -> None:
        cluster.kill(second)
        time.sleep(times[3] - times[2])  # dead for the plan's gap even when this kill came late: the restart follows

    return Plan([Event(times[0], f"SIGKILL {cluster.name(first)} (owns stored responses)", "process",
                       lambda: cluster.kill(first), (first,)),
                 Event(times[1], f"restart {cluster.name(first)} (empty memory)", "heal", restart_first, (first,)),
                 Event(times[2], f"SIGKILL {cluster.name(second)} (owns stored responses)", "process", kill_second,
                       (second,)),
                 Event(times[3], f"restart {cluster.name(second)} (empty memory)", "heal",
                       lambda: cluster.restart(second, graceful=False), (second,))], times[3], 2)


def kill_model_engines(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    """Every engine of one model killed, then started again: that model answers 503 naming it meanwhile,
    and the other model must not see a single error; no node leaves the balancer for it."""
    model = cluster.models[-1]
    engines = cluster.engines_of(model)
    start, back = 0.25 * duration_s, 0.55 * duration_s

    def kill() -> None:
        for j in engines:
            cluster.kill_engine(j)

    def restart() -> None:
        for j in engines:
            cluster.start_engine(j)

    return Plan([Event(start, f"SIGKILL the engines of {model} ({', '.join(f'engine{j}' for j in engines)})",
                       "model", kill, model=model),
                 Event(back, f"restart the engines of {model}", "heal", restart, model=model)], back, 0)


def kill_prefill_engine(cluster: ChaosCluster, rng: random.Random, duration_s: float) -> Plan:
    """A prefill/decode cluster (two prefill and two decode engines): one prefill engine SIGKILLed under load, then
    started again on its ports. Requests whose prefill it had not finished are retried on the other pair; those
    already handed over finish on their decode."""
    victim = rng.randrange(cluster.spec.engines // 2)
    start, back = 0.25 * duration_s, 0.55 * duration_s
    return Plan([Event(start, f"SIGKILL prefill engine{victim}", "process", lambda: cluster.kill_engine(victim)),
                 Event(back, f"restart prefill engine{victim}", "heal", lambda: cluster.start_engine(victim))],
                back + 2, 0)


# Scenarios whose faults strike engines only: no partition, no majority needed, so two nodes can run them.
ENGINE_SCENARIOS = frozenset({"restart-engines", "kill-model-engines", "kill-prefill-engine"})

# What a scenario needs of the cluster beyond the defaults.
SCENARIO_SPECS: dict[str, dict[str, Any]] = {"kill-model-engines": {"models": 2},
                                             "kill-prefill-engine": {"pd": True, "engines": 4},
                                             "kill-owner-machine": {"workers": 2},
                                             "kill-in-turn": {"mesh_preset": "lan", "observe_interval_s": 0.2}}

SCENARIOS: dict[str, tuple[Callable[[ChaosCluster, random.Random, float], Plan], str]] = {
    "kill-one": (kill_one, "SIGKILL one node under load, restart it later"),
    "lose-one": (lose_one, "SIGKILL one node for good; an operator force-leaves it and the cluster goes on "
                 "without it"),
    "kill-owner": (kill_owner, "SIGKILL the owner of the hot rate-limit key, restart it later"),
    "kill-owner-machine": (kill_owner_machine, "nodes of two processes: SIGKILL the machine owning the hot "
                           "rate-limit key, restart it later"),
    "kill-in-turn": (kill_in_turn, "lan timers: SIGKILL a node every 20 s, in turn, restarting each 8 s later; how "
                     "soon every other node lists it dead"),
    "pause-one": (pause_one, "SIGSTOP one node for 10 s, then SIGCONT"),
    "partition-halves": (partition_halves, "split the nodes in two halves, then heal"),
    "isolate-one": (isolate_one, "cut one node off from the others, then heal"),
    "lossy-network": (lossy_network, "10% packet loss between nodes, then none"),
    "rolling-restart": (rolling_restart, "restart every node in turn (SIGTERM, drain, start)"),
    "restart-engines": (restart_engines, "restart every engine in turn"),
    "kill-history-owners": (kill_history_owners, "SIGKILL two owners of stored responses in turn, restarting "
                            "each with an empty memory"),
    "kill-prefill-engine": (kill_prefill_engine, "prefill/decode pairs: SIGKILL one prefill engine under load, "
                            "restart it later; requests go to the other pair meanwhile"),
    "kill-model-engines": (kill_model_engines, "two models on separate engines: SIGKILL every engine of one, "
                           "restart them later; the other model must see no error"),
}

"""No false "dead": a node the run's faults never touched is never listed dead by another untouched node.

Untouched: named by no event of the run (killed, paused, isolated, partitioned, restarted nodes are
touched; a fault of the network as a whole, such as packet loss, or of the engines touches no node).
What a touched node believes is left out (an isolated node rightly holds the others dead), and so is
what anyone believes of a touched node (a paused one may rightly be declared dead). Among the others
SWIM with Lifeguard must never settle on "dead": that is the false verdict whose rate Lifeguard exists
to cut. Sampled: the observer reads every node's view every 0.5 s, so a verdict refuted faster than
that can go unseen; one that lasts, which is what costs a cluster its member, is seen.

Excused: a verdict seen only within ``AFTER_HEAL_S`` of a heal, in a run whose faults named nodes. What a
cut-off node concluded while cut off (the others dead) reaches the rest with its first packets after the
heal, and the members it was about refute it: SWIM's dissemination repairing a partition, not its
detector's mistake (CI's isolate-one: node0 held node2 dead for one sample, 0.2 s after the heal, on
the isolated node's word). Such verdicts are counted apart; one still held past the window fails.
"""

from __future__ import annotations

from . import CheckResult

NAME = "no false dead"
VERDICTS_SHOWN = 5
# A probe period and a few gossip rounds on the harness's `local` preset (0.2 s probes, 50 ms gossip): the
# time for a member to hear a stale verdict of itself and for its refutation to reach the others, with room.
AFTER_HEAL_S = 5.0


def untouched(run) -> list[int]:
    touched = {node for event in run.events for node in event.nodes}
    return [i for i in range(len(run.node_names)) if i not in touched]


def dead_sightings(run) -> "dict[tuple[int, int], list[float]]":
    """(observer, member) -> every time (monotonic) an untouched observer listed an untouched member dead."""
    keep = set(untouched(run))
    names = run.node_names
    seen: dict[tuple[int, int], list[float]] = {}
    for sample in sorted(run.samples, key=lambda s: s.t):
        if sample.node not in keep or sample.members is None:
            continue
        for member in keep:
            if member != sample.node and sample.members.get(names[member]) == "dead":
                seen.setdefault((sample.node, member), []).append(sample.t)
    return seen


def after_heal(run, times: "list[float]") -> bool:
    """Every sighting within AFTER_HEAL_S of one heal, in a run whose faults named nodes."""
    if not any(event.nodes for event in run.events):
        return False
    heals = [event.t for event in run.events if event.kind == "heal"]
    return any(all(heal <= t <= heal + AFTER_HEAL_S for t in times) for heal in heals)


def false_verdicts(run) -> "tuple[list[tuple[float, int, int]], list[tuple[float, int, int]]]":
    """(false, excused): (seconds into the run, observer, member) of each pair's first sighting."""
    false, excused = [], []
    for (observer, member), times in dead_sightings(run).items():
        (excused if after_heal(run, times) else false).append((times[0] - run.t0, observer, member))
    return sorted(false), sorted(excused)


def check(run) -> CheckResult:
    keep = untouched(run)
    verdicts, excused = false_verdicts(run)
    names = run.node_names
    samples = sum(1 for s in run.samples if s.node in keep and s.members is not None)
    as_dicts = lambda found: [{"t_s": round(t, 2), "observer": names[o], "member": names[m]}  # noqa: E731
                              for t, o, m in found]
    details = {"untouched": [names[i] for i in keep], "samples": samples, "verdicts": as_dicts(verdicts),
               "after_heal": as_dicts(excused)}
    if len(keep) < 2:
        return CheckResult(NAME, True, "every node was touched by a fault: no verdict here can be called false",
                           details)
    if not verdicts:
        healed = f"; {len(excused)} listed dead for under {AFTER_HEAL_S:.0f} s after the heal, on a cut-off " \
                 "node's word" if excused else ""
        return CheckResult(NAME, True, f"none of the {len(keep)} untouched nodes was listed dead by another "
                                       f"({samples} views read){healed}", details)
    shown = "; ".join(f"{names[o]} held {names[m]} dead at t={t:.1f} s" for t, o, m in verdicts[:VERDICTS_SHOWN])
    return CheckResult(NAME, False, f"{len(verdicts)} false dead verdicts: {shown}", details)

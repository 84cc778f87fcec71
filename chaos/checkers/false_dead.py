"""No false "dead": a node the run's faults never touched is never listed dead by another untouched node.

Untouched: named by no event of the run (killed, paused, isolated, partitioned, restarted nodes are
touched; a fault of the network as a whole, such as packet loss, or of the engines touches no node).
What a touched node believes is left out (an isolated node rightly holds the others dead), and so is
what anyone believes of a touched node (a paused one may rightly be declared dead). Among the others
SWIM with Lifeguard must never settle on "dead": that is the false verdict whose rate Lifeguard exists
to cut. Sampled: the observer reads every node's view every 0.5 s, so a verdict refuted faster than
that can go unseen; one that lasts, which is what costs a cluster its member, is seen.
"""

from __future__ import annotations

from . import CheckResult

NAME = "no false dead"
VERDICTS_SHOWN = 5


def untouched(run) -> list[int]:
    touched = {node for event in run.events for node in event.nodes}
    return [i for i in range(len(run.node_names)) if i not in touched]


def false_verdicts(run) -> "list[tuple[float, int, int]]":
    """(seconds into the run, observer, member) the first time each untouched observer listed an untouched
    member dead."""
    keep = set(untouched(run))
    names = run.node_names
    first: dict[tuple[int, int], float] = {}
    for sample in sorted(run.samples, key=lambda s: s.t):
        if sample.node not in keep or sample.members is None:
            continue
        for member in keep:
            if member != sample.node and sample.members.get(names[member]) == "dead":
                first.setdefault((sample.node, member), sample.t - run.t0)
    return sorted((t, observer, member) for (observer, member), t in first.items())


def check(run) -> CheckResult:
    keep = untouched(run)
    verdicts = false_verdicts(run)
    names = run.node_names
    samples = sum(1 for s in run.samples if s.node in keep and s.members is not None)
    details = {"untouched": [names[i] for i in keep], "samples": samples,
               "verdicts": [{"t_s": round(t, 2), "observer": names[o], "member": names[m]} for t, o, m in verdicts]}
    if len(keep) < 2:
        return CheckResult(NAME, True, "every node was touched by a fault: no verdict here can be called false",
                           details)
    if not verdicts:
        return CheckResult(NAME, True, f"none of the {len(keep)} untouched nodes was listed dead by another "
                                       f"({samples} views read)", details)
    shown = "; ".join(f"{names[o]} held {names[m]} dead at t={t:.1f} s" for t, o, m in verdicts[:VERDICTS_SHOWN])
    return CheckResult(NAME, False, f"{len(verdicts)} false dead verdicts: {shown}", details)

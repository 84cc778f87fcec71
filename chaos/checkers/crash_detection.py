"""Crash detection: every SIGKILLed node is listed dead by every other running node, soon, and before it restarts.

For each SIGKILL of the run: the time from the kill until the last of the other answering nodes first lists
every member of the victim (its processes, with ``--workers``) dead or left, or none of them (a node restarted
after the kill never hears of a member already dead), read from the observer's samples
(so an upper bound: a verdict shows at the next sample). Issue 39's goal on the `lan` preset is p50 3 s and
p99 6 s on 5 nodes under the harness's load; each kill must be seen within ``DETECTED_BOUND_S`` and before the
victim is started again (a restart would hide a crash nobody noticed). Runs without a kill pass with nothing
to measure.
"""

from __future__ import annotations

import statistics

from . import CheckResult

NAME = "crash detection"
DETECTED_BOUND_S = 6.0
GONE = ("dead", "left")


def kills(run) -> list:
    return [e for e in run.events if e.kind == "process" and e.label.startswith("SIGKILL") and e.nodes]


def member_names(run, node: int, seen: "dict[str, str]") -> list[str]:
    """The victim's members as a view lists them: its name, and its processes' (``nodeI-wK``)."""
    name = run.node_names[node]
    return [member for member in seen if member == name or member.startswith(name + "-w")]


def detection_s(run, kill) -> float | None:
    """Seconds from ``kill`` until every other answering node listed the victim gone; None: not before the
    victim was started again (or the run ended)."""
    victims = set(kill.nodes)
    back = min([e.t for e in run.events if e.t > kill.t and set(e.nodes) & victims] + [float("inf")])
    first_gone: dict[int, float] = {}
    answering: set[int] = set()
    for sample in sorted(run.samples, key=lambda s: s.t):
        if not kill.t <= sample.t < back or sample.node in victims or sample.members is None:
            continue
        answering.add(sample.node)
        # Not listed at all is not believed alive either: a node restarted after the kill learns the members
        # alive, not those already dead (memberlist's merge), and nothing depends on the victim there.
        names = [m for v in victims for m in member_names(run, v, sample.members)]
        if all(sample.members[m] in GONE for m in names):
            first_gone.setdefault(sample.node, sample.t)
    if not answering or answering - set(first_gone):
        return None
    return max(first_gone.values()) - kill.t


def check(run) -> CheckResult:
    found = kills(run)
    if not found:
        return CheckResult(NAME, True, "no SIGKILL in this scenario", {"kills": 0})
    names = run.node_names
    took = [detection_s(run, kill) for kill in found]
    per_kill = [{"t_s": round(k.t - run.t0, 2), "nodes": [names[i] for i in k.nodes],
                 "detected_after_s": None if t is None else round(t, 2)} for k, t in zip(found, took)]
    seen = sorted(t for t in took if t is not None)
    missed = len(took) - len(seen)
    details = {"kills": len(found), "per_kill": per_kill, "bound_s": DETECTED_BOUND_S}
    if seen:
        details.update(p50_s=round(statistics.median(seen), 2), max_s=round(seen[-1], 2))
        if len(seen) > 1:
            details["p99_s"] = round(statistics.quantiles(seen, n=100, method="inclusive")[98], 2)
    late = [t for t in seen if t > DETECTED_BOUND_S]
    passed = not missed and not late
    figures = (f"p50 {details['p50_s']:.2f} s, p99 {details.get('p99_s', details['max_s']):.2f} s, "
               f"max {details['max_s']:.2f} s" if seen else "none seen")
    summary = f"{len(found)} SIGKILL(s), listed dead by every other node after {figures} (bound {DETECTED_BOUND_S:.0f} s)"
    if missed:
        summary += f"; {missed} not seen by every node before the victim's restart"
    return CheckResult(NAME, passed, summary, details)

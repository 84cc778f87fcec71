"""Membership converged: after the last fault heals, every running node lists every running node
as alive and every stopped one as not alive, within a stated bound."""

from __future__ import annotations

from . import CheckResult

NAME = "membership converged"
# The `local` preset: a crash is declared within ~5 s; two sides of a healed partition find each
# other at the next reconnect to the dead (every 6 s) or push-pull (10 s); a restarted node joins at once.
CONVERGE_BOUND_S = 30.0


def converged_at(run) -> float | None:
    """Seconds after the heal when all views first agreed (None: never, within the samples)."""
    running = run.final_running
    names = {i: run.node_names[i] for i in range(len(run.node_names))}
    latest: dict[int, dict | None] = {}
    for sample in sorted(run.samples, key=lambda s: s.t):
        if sample.t < run.heal_t:
            continue
        latest[sample.node] = sample.members
        views = [latest.get(i) for i in running]
        if any(v is None for v in views):
            continue
        if all(all(v.get(names[j]) == "alive" for j in running) and
               all(v.get(names[j], "dead") != "alive" for j in names if j not in running) for v in views):
            return sample.t - run.heal_t
    return None


def check(run) -> CheckResult:
    took = converged_at(run)
    passed = took is not None and took <= CONVERGE_BOUND_S
    summary = (f"every running node agreed {took:.1f} s after the heal (bound {CONVERGE_BOUND_S:.0f} s)"
               if took is not None else f"views never agreed within {CONVERGE_BOUND_S:.0f} s of the heal")
    return CheckResult(NAME, passed, summary, {"converged_after_s": took, "bound_s": CONVERGE_BOUND_S})

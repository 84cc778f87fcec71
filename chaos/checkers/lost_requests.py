"""Requests lost: only requests in flight on a process that was killed, stopped or restarted may
fail, and they must fail fast; no request may hang. Network faults between nodes excuse one thing
only: a request for stored history (a Responses API turn) that a node cut off from the holders of that
history answers 504 ``history_unavailable`` (nothing can make data on the other side of a partition
readable; the store refuses rather than answer 404 or acknowledge a copy the other side cannot
read). Everything else must succeed: clients never see the nodes' own network. A request for a model
whose engines were all down while it ran is the models-apart check's to judge (a 503 naming the model)."""

from __future__ import annotations

from . import CheckResult
from .models_apart import in_outage, outage_windows

NAME = "requests lost"
FAIL_FAST_S = 5.0  # a request cut by a process fault fails within this after the fault
IN_FLIGHT_SLACK_S = 0.5  # clocks of the harness threads: a request ending just before a fault counts
REJOIN_S = 10.0  # after a heal, until the nodes that were cut off see each other again (local preset: ~3 s)


def _network_windows(run) -> "list[tuple[float, float]]":
    """(start, end) of each network fault: from the fault to the next heal, plus the time the nodes take
    to see each other again."""
    windows, start = [], None
    for event in sorted(run.events, key=lambda e: e.t):
        if event.kind == "network" and start is None:
            start = event.t
        elif event.kind == "heal" and start is not None:
            windows.append((start - IN_FLIGHT_SLACK_S, event.t + REJOIN_S))
            start = None
    if start is not None:
        windows.append((start - IN_FLIGHT_SLACK_S, float("inf")))
    return windows


def check(run) -> CheckResult:
    faults = [e.t for e in run.events if e.kind == "process"]
    partitioned = _network_windows(run)
    outages = outage_windows(run)
    history_unavailable = 0
    hang_bound_s = 10.0 + run.plan.pause_s
    unexcused, slow_failures, hangs = [], [], []
    for r in run.records:
        if r.duration_s > hang_bound_s:
            hangs.append(r)
        if r.outcome != "error" or in_outage(r, outages):
            continue
        struck = [t for t in faults if r.start - IN_FLIGHT_SLACK_S <= t <= r.end + IN_FLIGHT_SLACK_S]
        if r.kind == "response" and "history_unavailable" in r.error and any(
                a <= r.start and r.end <= b for a, b in partitioned):
            history_unavailable += 1
            continue
        if not struck:
            unexcused.append(r)
        elif min(r.end - t for t in struck) > FAIL_FAST_S + run.plan.pause_s:
            slow_failures.append(r)
    errors = sum(1 for r in run.records if r.outcome == "error")
    passed = not unexcused and not slow_failures and not hangs
    partition_note = (f"; {history_unavailable} of them stored-history 504s across the partition, the others"
                      if history_unavailable else ", all")
    summary = (f"{len(run.records)} requests, {errors} failed{partition_note} in flight on a faulted process, "
               f"failing within {FAIL_FAST_S + run.plan.pause_s:.0f} s; none over {hang_bound_s:.0f} s" if passed else
               f"{len(unexcused)} failures no process fault explains, {len(slow_failures)} slow failures, "
               f"{len(hangs)} requests over {hang_bound_s:.0f} s")
    sample = [dict(kind=r.kind, start_s=round(r.start - run.t0, 2), duration_s=round(r.duration_s, 2), error=r.error)
              for r in (unexcused + slow_failures + hangs)[:20]]
    return CheckResult(NAME, passed, summary, {"failed": errors, "unexcused": len(unexcused),
                                               "slow_failures": len(slow_failures), "hangs": len(hangs),
                                               "history_unavailable_in_partition": history_unavailable,
                                               "examples": sample})

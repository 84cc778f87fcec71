"""Models apart: one model's outage is that model's alone. While every engine of a model is down (a
``model`` fault, until its heal and the health checks that see the engines back), every request for any
other model succeeds, through the balancer, on every node: no node is taken out for it. The dead model's
requests fail with a 503 that names the model (those in flight on the engines when they died may fail
otherwise, within FAIL_FAST_S), and the model answers again once its engines are back. Every run reports
its requests and errors per model."""

from __future__ import annotations

from . import CheckResult

NAME = "models apart"
IN_FLIGHT_SLACK_S = 0.5  # as lost_requests: a request ending just before the fault counts as in flight
FAIL_FAST_S = 5.0
# From the heal (the engines started again) until the nodes' health checks have them back: a check every
# 0.5 s in the harness, two in a row to change state, and an engine's own start.
RECOVER_S = 10.0


def outage_windows(run) -> "list[tuple[str, float, float]]":
    """(model, start, end) of each model fault: from the kill to its heal, plus the time to recover."""
    windows, open_at = [], {}
    for event in sorted(run.events, key=lambda e: e.t):
        model = getattr(event, "model", None)
        if model is None:
            continue
        if event.kind == "model":
            open_at[model] = event.t
        elif event.kind == "heal" and model in open_at:
            windows.append((model, open_at.pop(model) - IN_FLIGHT_SLACK_S, event.t + RECOVER_S))
    windows += [(model, start - IN_FLIGHT_SLACK_S, float("inf")) for model, start in open_at.items()]
    return windows


def in_outage(record, windows) -> bool:
    """A request for a model that was down while it ran (the lost-requests check leaves it to this one)."""
    return any(model == record.model and start <= record.end and record.start <= end for model, start, end in windows)


def check(run) -> CheckResult:
    windows = outage_windows(run)
    per_model: dict[str, dict[str, int]] = {}
    for r in run.records:
        counts = per_model.setdefault(r.model, {"ok": 0, "rate_limited": 0, "error": 0})
        counts[r.outcome] += 1
    bystanders, unnamed, slow, recovered = [], [], [], {}
    for model, start, end in windows:
        kill = start + IN_FLIGHT_SLACK_S
        for r in run.records:
            overlaps = start <= r.end and r.start <= end
            if not overlaps:
                continue
            if r.model != model:
                if r.outcome == "error":
                    bystanders.append(r)
            elif r.outcome == "error":
                in_flight = r.start <= kill + IN_FLIGHT_SLACK_S
                if in_flight:
                    if r.end - kill > FAIL_FAST_S:
                        slow.append(r)
                elif r.status != 503 or model not in r.error:
                    unnamed.append(r)
        healed_at = end - RECOVER_S  # (end is infinite when the run ended before the heal: nothing to ask)
        recovered[model] = end == float("inf") or any(r.model == model and r.outcome == "ok" and r.start > healed_at
                                                       for r in run.records)
    passed = not bystanders and not unnamed and not slow and all(recovered.values())
    counts_text = "; ".join(f"{m}: {c['ok']} ok, {c['error']} failed" for m, c in sorted(per_model.items()))
    if not windows:
        summary = f"no model outage in this scenario ({counts_text})"
    elif passed:
        down = ", ".join(sorted({m for m, _, _ in windows}))
        summary = (f"{down} down: no error for any other model, its own failures 503s naming it, and it "
                   f"answered again ({counts_text})")
    else:
        summary = (f"{len(bystanders)} errors of models that were up, {len(unnamed)} of the dead model not a 503 "
                   f"naming it, {len(slow)} slow in-flight failures, not recovered: "
                   f"{[m for m, ok in recovered.items() if not ok]} ({counts_text})")
    sample = [dict(model=r.model, kind=r.kind, start_s=round(r.start - run.t0, 2), status=r.status, error=r.error)
              for r in (bystanders + unnamed + slow)[:20]]
    return CheckResult(NAME, passed, summary, {"per_model": per_model, "bystander_errors": len(bystanders),
                                               "unnamed_errors": len(unnamed), "slow_failures": len(slow),
                                               "recovered": recovered, "examples": sample})

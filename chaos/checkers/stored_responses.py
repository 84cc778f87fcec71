"""Stored responses kept: every response the cluster acknowledged storing (a 200 to a Responses API
request with store on) is found after the run, with the same output text, whatever nodes were killed,
paused, cut off or restarted meanwhile. The memory store's promise: a write is acknowledged once two
nodes hold it, so no single fault loses it (gateway/history/memory.py)."""

from __future__ import annotations

from . import CheckResult

NAME = "stored responses kept"


def check(run) -> CheckResult:
    lost = [r for r in run.stored if run.stored_read.get(r.response_id) is None]
    changed = [r for r in run.stored if r not in lost and run.stored_read[r.response_id] != r.text]
    passed = not lost and not changed
    after_faults = sum(1 for r in run.stored if any(e.t <= r.acknowledged_at for e in run.events if e.kind != "heal"))
    summary = (f"{len(run.stored)} acknowledged responses ({after_faults} after the first fault), every one found "
               f"unchanged after the run" if passed else
               f"{len(lost)} of {len(run.stored)} acknowledged responses lost, {len(changed)} changed")
    sample = [dict(id=r.response_id, acknowledged_s=round(r.acknowledged_at - run.t0, 2),
                   found=run.stored_read.get(r.response_id)) for r in (lost + changed)[:20]]
    return CheckResult(NAME, passed, summary, {"acknowledged": len(run.stored), "lost": len(lost),
                                               "changed": len(changed), "examples": sample})

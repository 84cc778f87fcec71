"""KV index equal: once the load stops, every node's index of every engine is the same (the
sequence number applied and a fingerprint of the blocks)."""

from __future__ import annotations

from . import CheckResult

NAME = "KV index equal"


def signature(view: dict) -> str:
    """One node's index, comparable across nodes: per engine the sequence, blocks and fingerprint
    (the orphan count, last in each row, is that node's own history, not its state)."""
    return repr(sorted((engine, row[:3]) for engine, row in view.items()))


def check(run) -> CheckResult:
    views = {run.node_names[i]: kv for i, kv in run.final_kv.items()}
    distinct = {signature(kv) for kv in views.values()}
    engines = {e for kv in views.values() for e in kv}
    passed = len(distinct) == 1 and len(engines) == run.engines
    summary = (f"{len(views)} nodes hold the same index of {len(engines)} engines "
               f"(waited {run.kv_wait_s:.1f} s after the load stopped)" if passed
               else f"indexes differ after {run.kv_wait_s:.1f} s: {views}")
    return CheckResult(NAME, passed, summary, {"views": views})

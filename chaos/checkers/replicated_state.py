"""Replicated state equal: after the heal every node holds the same worker registry and the same
rate limits (compared by hash)."""

from __future__ import annotations

import hashlib
import json

from . import CheckResult

NAME = "replicated state equal"


def state_hash(workers: list, limits: dict) -> str:
    registry = sorted((w["id"], w["url"]) for w in workers)
    return hashlib.sha256(json.dumps([registry, limits], sort_keys=True).encode()).hexdigest()[:16]


def check(run) -> CheckResult:
    hashes = {run.node_names[i]: state_hash(s["workers"], s["limits"]) for i, s in run.final_state.items()}
    counts = {run.node_names[i]: len(s["workers"]) for i, s in run.final_state.items()}
    passed = len(set(hashes.values())) == 1 and all(c == run.engines for c in counts.values()) and bool(hashes)
    summary = (f"{len(hashes)} nodes hold the same registry ({run.engines} workers) and limits (hash "
               f"{next(iter(hashes.values()))})" if passed else f"nodes differ: {hashes}, workers {counts}")
    return CheckResult(NAME, passed, summary, {"hashes": hashes, "workers": counts})

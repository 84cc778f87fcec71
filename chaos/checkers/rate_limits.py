"""Rate-limit admitted counts within the documented bound: the hot key's admitted requests over the
run stay under limit x time + burst + the overshoot bound of each fault (gateway/ratelimit/limiter.py)."""

from __future__ import annotations

from gateway.ratelimit import LimitSet, RateLimitConfig, RateLimiter, parse_limit_set
from mesh.config import MeshConfig

from ..scenarios import HOT_API_KEY
from . import CheckResult

NAME = "rate limits held"


def check(run) -> CheckResult:
    spec = parse_limit_set({"limits": [{"name": "per-key", "scope": "api_key", "limit": run.per_key_limit,
                                        "burst": run.per_key_burst}]}).limits[0]
    mesh = MeshConfig.local()
    detection_s = mesh.probe_interval_s * 2 + mesh.suspicion_timeout_s(len(run.node_names), 0)
    per_fault = RateLimiter(RateLimitConfig(), LimitSet()).overshoot_bound(spec, detection_s, len(run.node_names))
    hot = [r for r in run.records if r.api_key == HOT_API_KEY]
    admitted = sum(1 for r in hot if r.outcome == "ok")
    refused = sum(1 for r in hot if r.outcome == "rate_limited")
    seconds = run.t_end - run.t0
    bound = run.per_key_limit * seconds + run.per_key_burst + run.plan.faults * per_fault
    floor = 0.5 * run.per_key_limit * seconds  # the limiter kept admitting: it did not fail closed
    passed = floor <= admitted <= bound and refused > 0
    # The rate once the cluster settled after the last heal (2 s for the change to reach every node): a node
    # lost for good and force-left no longer holds a share, so this is the whole limit again.
    settled = run.heal_t + 2.0
    after_s = max(0.0, run.t_end - settled)
    after = sum(1 for r in hot if r.outcome == "ok" and r.start >= settled) / after_s if after_s >= 1.0 else None
    summary = (f"hot key: {admitted} admitted in {seconds:.0f} s ({admitted / seconds:.1f}/s, limit "
               f"{run.per_key_limit:g}/s), {refused} refused; bound {bound:.0f} ({run.plan.faults} fault(s) x "
               f"{per_fault:.0f})")
    return CheckResult(NAME, passed, summary, {"admitted": admitted, "refused": refused, "bound": bound,
                                               "floor": floor, "seconds": seconds,
                                               "limit_per_s": run.per_key_limit, "admitted_per_s_after_heal": after})

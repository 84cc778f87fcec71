"""Whether a worker is healthy, from its health checks: a pure rule on passed-in time.

    failure_threshold checks failed in a row   healthy   -> unhealthy
    success_threshold checks passed in a row   unhealthy -> healthy
    anything else                               no change (a passed check clears the failure run,
                                                a failed one the success run)

In a cluster only a worker's ring owner checks it; the other nodes ``adopt`` the
owner's verdict as it is. The registry (``registry.py``) does the checking and
acts on the verdicts; nothing here awaits or reads a clock.
"""

from __future__ import annotations

import dataclasses
import enum
from ..base.options import Option


@dataclasses.dataclass(frozen=True)
class HealthConfig:
    enabled: bool = True
    # smg's defaults are 3 / 2 / 5 s / 60 s; we check every 5 s: a dead engine
    # leaves routing in ~15 s instead of ~3 min, at the cost of one tiny RPC per
    # engine every 5 s.
    failure_threshold: int = 3
    success_threshold: int = 2
    timeout_s: float = 5.0
    interval_s: float = 5.0
    endpoint: str = "/health"  # HTTP workers only
    # GetLoads poll for the load-aware policies (gRPC engines).
    load_interval_s: float = 1.0
    # A node that routed nothing for this long stops polling loads until it routes again: an idle node's
    # polls were most of its idle work (one RPC a second per engine, on every node), and nothing reads
    # them. The first requests after it route on the node's own counts, for the one poll it takes to
    # learn the loads again.
    load_idle_s: float = 10.0


class Verdict(enum.Enum):
    UNCHANGED = "unchanged"
    BECAME_HEALTHY = "became_healthy"
    BECAME_UNHEALTHY = "became_unhealthy"


class HealthTracker:
    __slots__ = ("config", "healthy", "failures", "successes", "checked_at", "changed_at")

    def __init__(self, config: HealthConfig, healthy: bool, now: float) -> None:
        self.config = config
        self.healthy = healthy
        self.failures = 0  # checks failed in a row
        self.successes = 0  # checks passed in a row
        self.checked_at: float | None = None
        self.changed_at = now

    def record(self, ok: bool, now: float) -> Verdict:
        """One check's outcome, at ``now``."""
        self.checked_at = now
        if ok:
            self.failures = 0
            self.successes += 1
            if not self.healthy and self.successes >= self.config.success_threshold:
                return self._become(True, now)
        else:
            self.successes = 0
            self.failures += 1
            if self.healthy and self.failures >= self.config.failure_threshold:
                return self._become(False, now)
        return Verdict.UNCHANGED

    def adopt(self, healthy: bool, now: float) -> Verdict:
        """Another node's verdict (the worker's ring owner checks it): taken as it is."""
        if healthy == self.healthy:
            return Verdict.UNCHANGED
        self.failures = self.successes = 0
        return self._become(healthy, now)

    def _become(self, healthy: bool, now: float) -> Verdict:
        self.healthy = healthy
        self.changed_at = now
        return Verdict.BECAME_HEALTHY if healthy else Verdict.BECAME_UNHEALTHY


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--health-failure-threshold", "health.failure_threshold", int, "failed checks to mark unhealthy", "engines"),
    Option("--health-success-threshold", "health.success_threshold", int, "good checks to mark healthy", "engines"),
    Option("--health-check-timeout-secs", "health.timeout_s", float, "timeout of one check", "engines"),
    Option("--health-check-interval-secs", "health.interval_s", float, "time between checks", "engines"),
    Option("--health-check-endpoint", "health.endpoint", str, "health path of HTTP workers", "engines"),
    Option("--disable-health-check", "health.enabled", "disable", "no background health checks", "engines"),
)

"""Event-loop lag: how late the trio loop runs a task that asked to wake up.

A task sleeps ``interval_s`` over and over and records how much later than
asked it woke. Anything that holds the loop (a long encode on the loop thread,
a big JSON dump) shows up here directly. Exported as a histogram; the
statistics keep p50/p99/max of the recent window for /metrics readers and
benchmarks.
"""

from __future__ import annotations

import collections
import statistics

import trio
from prometheus_client import Histogram

INTERVAL_S = 0.01
WINDOW = 6000  # samples kept: one minute at the default interval
LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class LoopLagMonitor:
    def __init__(self, histogram: Histogram, interval_s: float = INTERVAL_S) -> None:
        self.histogram = histogram
        self.interval_s = interval_s
        self.samples: collections.deque[float] = collections.deque(maxlen=WINDOW)

    async def run(self) -> None:
        while True:
            expected = trio.current_time() + self.interval_s
            await trio.sleep_until(expected)
            lag = max(0.0, trio.current_time() - expected)
            self.samples.append(lag)
            self.histogram.observe(lag)

    def statistics(self) -> dict[str, float]:
        if len(self.samples) < 2:
            return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        q = statistics.quantiles(self.samples, n=100, method="inclusive")
        return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "max_ms": max(self.samples) * 1000}

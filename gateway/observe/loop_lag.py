"""Event-loop lag: how late the trio loop runs a task that asked to wake up.

A task sleeps ``interval_s`` over and over and records how much later than
asked it woke. Anything that holds the loop (a long encode on the loop thread,
a big JSON dump) shows up here directly. Exported as a histogram; the
statistics keep p50/p99/max of the recent window for /metrics readers and
benchmarks.

Each sample is the lag a timer set at that moment would have seen, so the
samples estimate the lag distribution over time at any rate; the rate only sets
how many samples back a percentile. 20 per second (1,200 a minute) is enough for
a p99, and each wake-up is trio's whole sleep machinery (a cancel scope with a
deadline, expired, delivered): at 100 per second an idle node spent 59 ms of CPU
per second on it, at 20 per second 14 ms (all of the node's idle work). So the
probe samples at that rate only while the node has work (``busy``: requests
admitted or waiting) or had some within ``BUSY_HOLD_S`` (gaps between bursts are
sampled as the bursts are), and once a second otherwise: an idle loop has no lag
worth 20 wake-ups a second, and the slow sampling still sees a stall of
background work.

The wake-ups come from a kernel timer (``kernel_ticker.py``: ~54 k instructions each against ~150 k
for trio's sleep, which raises and catches a Cancelled every time); on trio's clock under a virtual
clock (tests) and where there is no timerfd.
"""

from __future__ import annotations

import collections
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import trio
import trio.testing
from prometheus_client import Histogram

from .kernel_ticker import KernelTicker
from .metrics import gauge

INTERVAL_S = 0.05
IDLE_INTERVAL_S = 1.0  # while nothing is busy (see the module's docstring)
BUSY_HOLD_S = 10.0  # the fast rate lasts this long after the node was last seen busy
WINDOW = 1200  # samples kept: one minute at the default interval


class LoopLagMonitor:
    def __init__(self, histogram: Histogram, interval_s: float = INTERVAL_S,
                 gc_pauses: Histogram | None = None, busy: "Callable[[], bool]" = lambda: True,
                 idle_interval_s: float = IDLE_INTERVAL_S) -> None:
        self.histogram = histogram
        self.interval_s = interval_s
        self.idle_interval_s = idle_interval_s
        self.busy = busy
        self.samples: collections.deque[float] = collections.deque(maxlen=WINDOW)
        # The cyclic garbage collector stops every thread: its pauses are lag the loop cannot avoid.
        self.gc_pauses = gc_pauses
        self.gc_pause_max_s = 0.0
        self._gc_started = 0.0
        if gc_pauses is not None:
            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_started
        self.gc_pause_max_s = max(self.gc_pause_max_s, pause)
        self.gc_pauses.labels(str(info.get("generation", "?"))).observe(pause)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    async def run(self) -> None:
        ticks = _ticks_for(trio.lowlevel.current_clock())
        try:
            busy_at = -BUSY_HOLD_S
            while True:
                now = trio.current_time()
                if self.busy():
                    busy_at = now
                interval_s = self.interval_s if now - busy_at < BUSY_HOLD_S else self.idle_interval_s
                if interval_s != ticks.interval_s:
                    ticks.arm(interval_s)
                lag = await ticks.wait()
                self.samples.append(lag)
                self.histogram.observe(lag)
        finally:
            ticks.close()
            self.close()

    def statistics(self) -> dict[str, float]:
        if len(self.samples) < 2:
            return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "gc_pause_max_ms": self.gc_pause_max_s * 1000}
        q = statistics.quantiles(self.samples, n=100, method="inclusive")
        return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "max_ms": max(self.samples) * 1000,
                "gc_pause_max_ms": self.gc_pause_max_s * 1000}

    def metric_families(self) -> Iterator[Any]:
        stats = self.statistics()  # quantiles of the last minute's samples: computed once per scrape
        yield gauge("smg_event_loop_lag_ms", "Event-loop lag over the last minute", ["quantile"],
                    [([k.removesuffix("_ms")], v) for k, v in stats.items() if not k.startswith("gc_")])
        yield gauge("smg_gc_pause_max_ms", "Longest garbage-collector pause since start", [],
                    [([], stats["gc_pause_max_ms"])])


class TrioSleeps:
    """The probe's wake-ups as trio sleeps: what a kernel ticker does, on trio's clock."""

    __slots__ = ("interval_s",)

    def __init__(self) -> None:
        self.interval_s = 0.0

    def arm(self, interval_s: float) -> None:
        self.interval_s = interval_s

    async def wait(self) -> float:
        expected = trio.current_time() + self.interval_s
        await trio.sleep_until(expected)
        return max(0.0, trio.current_time() - expected)

    def close(self) -> None:
        pass


def _ticks_for(clock: trio.abc.Clock) -> "KernelTicker | TrioSleeps":
    """A kernel ticker, unless the loop runs on a virtual clock (which a kernel timer would not follow) or
    this system has no timerfd."""
    if isinstance(clock, trio.testing.MockClock):
        return TrioSleeps()
    return KernelTicker.open() or TrioSleeps()


class SlowStepLog(trio.abc.Instrument):
    """Logs every task step that held the loop longer than a threshold, with where the task stood.

    For finding what makes the lag: set SMG_NODE_SLOW_STEP_MS (off by default; the check costs two
    clock reads per task step).
    """

    def __init__(self, threshold_s: float, logger) -> None:
        self.threshold_s = threshold_s
        self.log = logger
        # Added from inside a running task: that task's step ends without having begun under us.
        self._started = time.perf_counter()
        self._started_cpu = time.thread_time()
        self._collections = 0  # garbage collections so far, counted by gc.callbacks
        self._started_collections = 0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "stop":
            self._collections += 1

    def before_task_step(self, task) -> None:
        self._started = time.perf_counter()
        self._started_cpu = time.thread_time()
        self._started_collections = self._collections

    def after_task_step(self, task) -> None:
        held = time.perf_counter() - self._started
        if held >= self.threshold_s:
            # The loop thread's own CPU in the step: much less than the wall time means it waited
            # (for the GIL, or for a core), not that the step's code was slow. A collection inside the
            # step is charged to whatever the step was doing.
            cpu = time.thread_time() - self._started_cpu
            where = " <- ".join(f"{frame.f_code.co_name}:{lineno}" for frame, lineno in task.iter_await_frames())
            self.log.warning("task %s held the loop %.1f ms, %.1f ms of it on the CPU, %d garbage collections "
                             "(now at %s)", task.name, held * 1000, cpu * 1000,
                             self._collections - self._started_collections, where)

"""The kernel ticker (gateway/observe/kernel_ticker.py) and the loop-lag probe on it, on the real clock.

These run in real time, since a kernel timer does not follow trio's virtual clock; each wait has a
bound, and the only sleeps are the stalls being measured (the loop held on purpose).
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import trio

from gateway.observe.kernel_ticker import KernelTicker, _LibcTimerfd, _OsTimerfd
from gateway.observe.loop_lag import LoopLagMonitor, TrioSleeps, _ticks_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")

BOUND_S = 10.0  # generous: a busy machine delays ticks, it does not lose them


def backends():
    yield _LibcTimerfd()
    if hasattr(os, "timerfd_create"):
        yield _OsTimerfd()


@pytest.mark.parametrize("timerfd", list(backends()), ids=lambda t: type(t).__name__)
async def test_a_ticker_ticks_at_its_interval(timerfd):
    ticker = KernelTicker(timerfd)
    try:
        started = time.monotonic()  # before arming: a preemption between the two cannot shorten what is measured
        ticker.arm(0.01)
        with trio.fail_after(BOUND_S):
            lags = [await ticker.wait() for _ in range(5)]
        # The fifth tick is due five intervals after arming, and a kernel timer never fires early.
        assert time.monotonic() - started >= 0.05 - 1e-6  # (nanosecond truncation of the timespec)
        assert all(lag >= 0 for lag in lags)
    finally:
        ticker.close()
    assert ticker.closed


async def test_a_stalled_loop_shows_as_the_first_missed_ticks_lateness():
    ticker = KernelTicker.open()
    assert ticker is not None
    try:
        ticker.arm(0.01)
        time.sleep(0.2)  # the loop held: ~20 ticks pass unseen
        with trio.fail_after(BOUND_S):
            lag = await ticker.wait()
        assert lag >= 0.2 - 0.01 - 0.002  # measured from the first tick missed, not the last
        # The ticks slept through are not waited for again: the next one is due within an interval.
        with trio.fail_after(BOUND_S):
            await ticker.wait()
    finally:
        ticker.close()


async def test_rearming_replaces_the_interval_and_drops_pending_ticks():
    ticker = KernelTicker.open()
    try:
        ticker.arm(0.005)
        time.sleep(0.05)  # ticks pending
        ticker.arm(60.0)
        with trio.move_on_after(0.3) as scope:
            await ticker.wait()
        assert scope.cancelled_caught  # neither a pending tick nor the old interval woke it
        assert ticker.interval_s == 60.0
    finally:
        ticker.close()


async def test_a_ticker_must_be_armed_with_a_positive_interval():
    ticker = KernelTicker.open()
    try:
        with pytest.raises(RuntimeError):
            await ticker.wait()
        with pytest.raises(ValueError):
            ticker.arm(0)
    finally:
        ticker.close()
    ticker.close()  # twice is harmless


class Recorder:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)


async def test_the_lag_probe_runs_on_a_kernel_ticker_and_sees_a_stall():
    assert isinstance(_ticks_for(trio.lowlevel.current_clock()), KernelTicker)
    histogram = Recorder()
    monitor = LoopLagMonitor(histogram, interval_s=0.01)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.run)
        with trio.fail_after(BOUND_S):
            while len(histogram.values) < 3:
                await trio.sleep(0.01)
        time.sleep(0.15)  # the loop held
        seen = len(histogram.values)
        with trio.fail_after(BOUND_S):
            while len(histogram.values) == seen:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert max(histogram.values) >= 0.15 - 0.01 - 0.002
    assert list(monitor.samples) == histogram.values


async def test_under_a_virtual_clock_the_probe_sleeps_on_trios_clock(autojump_clock):
    assert isinstance(_ticks_for(trio.lowlevel.current_clock()), TrioSleeps)

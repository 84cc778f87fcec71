"""A periodic kernel timer (Linux ``timerfd``) that the event loop waits on as it waits on a socket.

Why not ``trio.sleep``: trio wakes a sleeping task through a cancel scope's deadline, which expires,
creates a ``Cancelled``, raises it through the sleep and catches it again: ~150 k instructions a
wake-up on this project's CPython 3.11, where a readable file descriptor costs ~54 k
(``tests/bench/wakeup_bench.py``'s measure, BENCHMARKS.md). A task that wakes many times a second
for as long as the node serves (the loop-lag probe: 20 a second while requests run and 10 s after)
spent ~3 M instructions a second on it. A ``timerfd`` armed once with an interval ticks on its own;
each wait is one readiness wait and one 8-byte read.

The ticker keeps its schedule: ``wait`` returns how late the loop came to the first tick it had
not yet seen (ticks it slept through are counted, not waited for again), which is the lag a
timer set for that tick would have seen.

``KernelTicker.open`` returns None where there is no ``timerfd`` (not Linux); callers then sleep
on trio's clock, as they do under a virtual clock (``trio.testing.MockClock``), which a kernel
timer does not follow.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import trio

# timerfd_create(2), timerfd_settime(2): the constants of Linux's <sys/timerfd.h>, <time.h>.
_CLOCK_MONOTONIC = 1  # time.monotonic's clock on Linux
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1
_NS_PER_S = 1_000_000_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _timespec(seconds: float) -> _Timespec:
    whole = int(seconds)
    return _Timespec(whole, int((seconds - whole) * _NS_PER_S))


class _LibcTimerfd:
    """timerfd through libc, for Pythons before 3.13 (which has ``os.timerfd_create``)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        self._libc.timerfd_settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p)

    def create(self) -> int:
        fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        return fd

    def set_absolute(self, fd: int, first_s: float, interval_s: float) -> None:
        spec = _Itimerspec(_timespec(interval_s), _timespec(first_s))
        if self._libc.timerfd_settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")


class _OsTimerfd:
    """timerfd through the os module (Python 3.13 and later)."""

    def create(self) -> int:
        return os.timerfd_create(time.CLOCK_MONOTONIC, flags=os.TFD_NONBLOCK | os.TFD_CLOEXEC)

    def set_absolute(self, fd: int, first_s: float, interval_s: float) -> None:
        os.timerfd_settime(fd, flags=os.TFD_TIMER_ABSTIME, initial=first_s, interval=interval_s)


class KernelTicker:
    """Ticks every ``interval_s`` once armed; one task waits on it at a time."""

    __slots__ = ("_timerfd", "_fd", "_interval_s", "_next_due_s")

    def __init__(self, timerfd: "_LibcTimerfd | _OsTimerfd") -> None:
        self._timerfd = timerfd
        self._fd = timerfd.create()
        self._interval_s = 0.0
        self._next_due_s = 0.0  # on time.monotonic's clock

    @classmethod
    def open(cls) -> "KernelTicker | None":
        """A disarmed ticker, or None where the kernel has no timerfd."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls(_OsTimerfd() if hasattr(os, "timerfd_create") else _LibcTimerfd())
        except (OSError, AttributeError):  # no such call in this libc, or the kernel refused
            return None

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def arm(self, interval_s: float) -> None:
        """Tick one interval from now, then every interval; ticks not yet waited for are dropped."""
        if interval_s <= 0:
            raise ValueError("a ticker's interval must be positive")
        first_s = time.monotonic() + interval_s
        self._timerfd.set_absolute(self._fd, first_s, interval_s)
        self._interval_s = interval_s
        self._next_due_s = first_s

    async def wait(self) -> float:
        """Wait for the next tick not yet seen; how late (seconds) the loop came to it."""
        if self._interval_s == 0.0:
            raise RuntimeError("the ticker is not armed")
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                raw = os.read(self._fd, 8)
            except BlockingIOError:  # woken without a tick (spurious): wait again
                continue
            due_s = self._next_due_s
            self._next_due_s = due_s + int.from_bytes(raw, sys.byteorder) * self._interval_s
            return max(0.0, time.monotonic() - due_s)

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            trio.lowlevel.notify_closing(self._fd)  # a task still waiting on it is woken, not left hanging
        except RuntimeError:  # closed outside trio: nobody can be waiting
            pass
        os.close(self._fd)
        self._fd = -1

    @property
    def closed(self) -> bool:
        return self._fd < 0

"""Waiting for what another process (or task) decides, bounded; and holding that something stays so.

    eventually(check, timeout_s, what)        until ``check()`` gives something true (an AssertionError it raises
                                              counts as not yet): that value; AssertionError naming ``what``
                                              after ``timeout_s``
    time_until(check, timeout_s, what)        the same, the seconds it took
    remains(check, for_s, what)               ``check()`` true at every look for ``for_s``: a negative that must
                                              hold over time, looked at throughout rather than once after a sleep
    eventually_trio, time_until_trio          the first two for a trio test: awaited between looks, so they run
                                              on virtual time too (``autojump_clock``)
    until_listening(port, process, ...)       until a server process we started accepts connections; at once
                                              if it exited

Nothing here sleeps for a fixed time to let something happen: a look is bounded by the deadline, and a result is
reported as soon as it holds. ``what`` may be a string or a callable returning one (the state when it failed).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import trio

INTERVAL_S = 0.05  # between looks: another process's state changes over milliseconds, a look costs a request


def _said(what: "str | Callable[[], Any] | None") -> str:
    if what is None:
        return ""
    return f": {what() if callable(what) else what}"


def _look(check: Callable[[], Any]) -> "tuple[Any, str]":
    try:
        return check(), ""
    except AssertionError as e:
        return None, f" (last: {e})" if str(e) else ""


def _until(check: Callable[[], Any], timeout_s: float, what: Any, interval_s: float) -> "tuple[Any, float]":
    started = time.monotonic()
    while True:
        value, last = _look(check)
        if value:
            return value, time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s:g} s{_said(what)}{last}")
        time.sleep(interval_s)


def eventually(check: Callable[[], Any], timeout_s: float = 10.0, what: "str | Callable[[], Any] | None" = None,
               interval_s: float = INTERVAL_S) -> Any:
    return _until(check, timeout_s, what, interval_s)[0]


def time_until(check: Callable[[], Any], timeout_s: float = 10.0, what: "str | Callable[[], Any] | None" = None,
               interval_s: float = INTERVAL_S) -> float:
    return _until(check, timeout_s, what, interval_s)[1]


def remains(check: Callable[[], Any], for_s: float, what: "str | Callable[[], Any] | None" = None,
            interval_s: float = INTERVAL_S) -> None:
    started = time.monotonic()
    while True:
        value, last = _look(check)
        if not value:
            raise AssertionError(f"stopped holding after {time.monotonic() - started:.2f} s{_said(what)}{last}")
        if time.monotonic() - started >= for_s:
            return
        time.sleep(interval_s)


async def _until_trio(check: Callable[[], Any], timeout_s: float, what: Any, interval_s: float) -> "tuple[Any, float]":
    started = trio.current_time()
    while True:
        value, last = _look(check)
        if value:
            return value, trio.current_time() - started
        if trio.current_time() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s:g} s{_said(what)}{last}")
        await trio.sleep(interval_s)


async def eventually_trio(check: Callable[[], Any], timeout_s: float = 10.0,
                          what: "str | Callable[[], Any] | None" = None, interval_s: float = INTERVAL_S) -> Any:
    return (await _until_trio(check, timeout_s, what, interval_s))[0]


async def time_until_trio(check: Callable[[], Any], timeout_s: float = 10.0,
                          what: "str | Callable[[], Any] | None" = None, interval_s: float = INTERVAL_S) -> float:
    return (await _until_trio(check, timeout_s, what, interval_s))[1]


def until_listening(port: int, process: subprocess.Popen, timeout_s: float, what: str,
                    host: str = "127.0.0.1") -> None:
    """Until ``process`` accepts connections on ``host:port``; RuntimeError at once if it exited (no point waiting
    out the bound), AssertionError after ``timeout_s``."""

    def accepting() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return True
        return False

    eventually(accepting, timeout_s, f"{what} did not listen on {host}:{port}")

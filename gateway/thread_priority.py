"""Work handed to threads runs below the event loop's scheduling priority.

Why: the loop thread answers every request; a thread encoding a long prompt (GIL
released) competes with it for a core. When they share one (a node pinned to a
core, or every core busy), Linux splits the core between them in slices of a few
milliseconds, and each slice the loop waits is lag for every request in flight:
under the mixed benchmark with the node on one core, most loop steps over 4 ms
had used less than half of their time on the CPU. A thread at nice +10 (CFS
weight 110 against 1024) still has an idle core to itself, but the loop thread
runs first whenever it wakes. Raising one's own nice value needs no privilege,
and on Linux it is per thread (setpriority(2), "the nice value is a per-thread
attribute"). Elsewhere this does nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

# Added to the process's nice value for threads doing background work (19 is the lowest priority).
BACKGROUND_NICE_INCREMENT = 10

T = TypeVar("T")
_state = threading.local()


def lower_this_thread() -> None:
    """Once per thread: this thread's nice value becomes the process's plus the increment."""
    if getattr(_state, "lowered", False):
        return
    _state.lowered = True
    try:
        tid = threading.get_native_id()
        nice = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, nice + BACKGROUND_NICE_INCREMENT))
    except (OSError, AttributeError):
        pass  # not Linux, or not allowed: the thread keeps the loop's priority


def in_background(fn: Callable[..., T], *args) -> T:
    """Run ``fn(*args)`` on the calling (worker) thread, at background priority."""
    lower_this_thread()
    return fn(*args)

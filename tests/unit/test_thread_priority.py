"""Threads doing background work run below the event loop's priority; the loop's thread keeps its own."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import trio

from gateway import thread_priority


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
async def test_work_handed_to_a_thread_runs_at_background_priority():
    loop_tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, loop_tid)

    def my_nice() -> tuple[int, int]:
        tid = threading.get_native_id()
        return tid, os.getpriority(os.PRIO_PROCESS, tid)

    tid, nice = await trio.to_thread.run_sync(thread_priority.in_background, my_nice)
    assert tid != loop_tid and nice == min(19, before + thread_priority.BACKGROUND_NICE_INCREMENT)
    tid_again, nice_again = await trio.to_thread.run_sync(thread_priority.in_background, my_nice)
    assert nice_again == nice  # once per thread: never lowered twice
    assert os.getpriority(os.PRIO_PROCESS, loop_tid) == before

"""Long-lived threads that encode long texts off the event loop, each with an encoder of its own.

Why not ``trio.to_thread``: its threads come and go, and the fast encoder's regex engine
(tiktoken's core) keeps scratch space in pools that belong to the first thread that uses
them; every other thread takes a mutex-guarded path for each pre-token. A 7,800-token
prompt encodes in ~0.87 ms on the owning thread and ~1.25-1.8 ms on another; with two
threads contending, that path was ~10 % of a node's CPU under long prompts (perf,
BENCHMARKS.md eighth pass). Here each thread makes its own encoder (``FastBpe.fork``) and
keeps it for its life. Threads and their encoders are made when the first job comes: since
the event loop encodes texts up to 48 Ki characters itself, most nodes never need them, and
each fork holds ~35-56 MB.

Jobs are callables ``job(encoder)``; the caller's trio task sleeps until the result is
delivered back through the trio token. A job is not interrupted by cancellation: a caller
cancelled meanwhile gets Cancelled once the job is done, so an encode never outlives the
request that asked for it.

Threads stop when the owner is garbage-collected (``close``).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import outcome
import trio

E = TypeVar("E")
T = TypeVar("T")

_STOP = object()


class EncoderThreads(Generic[E]):
    def __init__(self, make_encoder: Callable[[], E], count: int, name: str = "encoder") -> None:
        if count < 1:
            raise ValueError("at least one thread")
        self._make_encoder = make_encoder
        self._count = count
        self._name = name
        self._jobs: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        # Stops the threads when this object is collected: they hold the queue, not this object.
        self._finalizer = weakref.finalize(self, _stop_all, self._jobs, count)

    def _start(self) -> None:
        # Called from run() on the event loop's thread, with no await before the threads exist.
        for i in range(self._count):
            thread = threading.Thread(target=_serve, args=(self._jobs, self._make_encoder), daemon=True,
                                      name=f"{self._name}-{i}")
            thread.start()
            self._threads.append(thread)

    async def run(self, job: Callable[[E], T]) -> T:
        """``job(encoder)`` on one of the threads; its result, or what it raised."""
        if not self._threads:
            self._start()
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()

        def deliver(result: outcome.Outcome) -> None:
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)
            except trio.RunFinishedError:
                pass  # the event loop ended while this ran: nobody is waiting any more

        self._jobs.put((job, deliver))
        # Not abortable while the job runs; a cancellation that came meanwhile is raised once it is done.
        result = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        await trio.lowlevel.checkpoint_if_cancelled()
        return result

    def close(self) -> None:
        """Stop the threads once the jobs queued before this are done."""
        self._finalizer()


def _serve(jobs: "queue.SimpleQueue[Any]", make_encoder: Callable[[], Any]) -> None:
    # Made here, so this thread is the first to use it. An encoder that cannot be made fails each job
    # this thread takes (its caller gets the error) rather than leaving the job waiting forever.
    made = outcome.capture(make_encoder)
    while True:
        item = jobs.get()
        if item is _STOP:
            return
        job, deliver = item
        # (An outcome is unwrapped once: each failed job gets one of its own.)
        deliver(outcome.capture(job, made.value) if isinstance(made, outcome.Value) else outcome.Error(made.error))
        del item, job, deliver  # nothing of a finished job is kept while waiting for the next


def _stop_all(jobs: "queue.SimpleQueue[Any]", count: int) -> None:
    for _ in range(count):
        jobs.put(_STOP)

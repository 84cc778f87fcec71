"""Admission control: at most ``max_concurrent_requests`` generations at once, a bounded queue.

A request beyond the running limit waits in a FIFO queue; beyond
``queue_size`` waiting requests it is refused at once (``Overloaded``: 429 with
Retry-After); a request that waited ``queue_timeout_s`` without a slot is
refused too (``NoCapacity``: 503 with Retry-After). A limit of 0 means unlimited.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import trio

from .errors import NoCapacity, Overloaded


@dataclasses.dataclass(frozen=True)
class AdmissionConfig:
    # Generations running at once per gateway process; excess requests queue (0 = unlimited, smg's
    # default). Finite by default: each running request holds its prompt's ids, its stream and a
    # connection, so an unbounded number is an unbounded amount of memory. 256 is above what an engine
    # batches (SGLang and vLLM default to 256 running sequences) and far above what wrk at 64
    # connections needs.
    max_concurrent_requests: int = 256
    queue_size: int = 100
    queue_timeout_s: float = 60.0
    # Bodies above this are refused with 413 before being read. None (the default): sized for the
    # largest context the node serves, ModelCatalog.body_bytes_max_auto: 32 bytes per context token
    # (text runs ~4 characters per token; 32 leaves room for JSON escapes, multi-byte characters, tool
    # schemas and message framing), at least 1 MiB; 8 MiB while no model states its context. What a
    # request may cost beyond its body is bounded by its model's context too
    # (gateway.api.openai.check_prompt_chars); BENCHMARKS.md measures the ceiling.
    body_bytes_max: int | None = None
    # The whole request, queue wait included; smg's default is 30 minutes.
    request_timeout_s: float = 1800.0


class Admission:
    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        limit = config.max_concurrent_requests
        self._semaphore = trio.Semaphore(limit) if limit > 0 else None
        self.running = 0
        self.waiting = 0
        self.rejected_queue_full = 0
        self.rejected_queue_timeout = 0
        self._idle = trio.Event()  # set while nothing runs or waits
        self._idle.set()
        self._slot = _Slot(self)

    def _enter(self) -> None:
        self.running += 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def _leave(self) -> None:
        self.running -= 1
        if self.running == 0 and self.waiting == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no request runs or waits (for the drain at shutdown)."""
        await self._idle.wait()

    def slot(self) -> "_Slot":
        """``async with admission.slot():`` runs the block holding one of the running slots.

        Raises TooManyRequests (the queue is full) or Unavailable (waited too long) instead.
        """
        return self._slot

    async def _acquire(self) -> None:
        sem = self._semaphore
        if sem is None:
            self._enter()
            return
        try:
            sem.acquire_nowait()
        except trio.WouldBlock:
            if self.waiting >= self.config.queue_size:
                self.rejected_queue_full += 1
                raise Overloaded("too many requests in flight and the queue is full; retry later",
                                 code="queue_full", retry_after_s=1) from None
            self.waiting += 1
            if self._idle.is_set():
                self._idle = trio.Event()
            try:
                with trio.move_on_after(self.config.queue_timeout_s) as scope:
                    await sem.acquire()
            finally:
                self.waiting -= 1
            if scope.cancelled_caught:
                if self.running == 0 and self.waiting == 0:
                    self._idle.set()
                self.rejected_queue_timeout += 1
                raise NoCapacity("timed out waiting for a free slot; retry later", code="queue_timeout",
                                 retry_after_s=max(1, int(self.config.queue_timeout_s // 10))) from None
        self._enter()

    def _release(self) -> None:
        self._leave()
        if self._semaphore is not None:
            self._semaphore.release()


class _Slot:
    """The context manager of ``Admission.slot``: holds no state of its own, so one serves every request.

    A class rather than an ``asynccontextmanager`` generator: it is on every request's path,
    where a generator-based manager costs a generator, its wrapper and trio's async-generator
    hooks per use.
    """

    __slots__ = ("_admission",)

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    async def __aenter__(self) -> None:
        await self._admission._acquire()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        self._admission._release()

"""One attempt on a worker: its in-flight count and its circuit's verdict, however the attempt ends.

Generation (gRPC engines) and the relay (HTTP workers) both run attempts as

    with WorkerAttempt(worker) as attempt:
        ...                      # call the worker
        attempt.failed(error)    # on an EngineCallError, before deciding whether to retry

and the rules live here once: an engine's fault (``EngineCallError.engine_fault``)
counts against its circuit; a failure that is the request's (INVALID_ARGUMENT...),
a cancellation (client gone, timeout) or a bug of ours gives the circuit no
verdict and frees the half-open probe the attempt may hold; an attempt that ends
without a failure is a success.

A class rather than a ``contextmanager`` generator: it is on every request's path.
"""

from __future__ import annotations

from typing import Any

import logging

import trio

from ..engine.errors import EngineCallError
from .worker import Worker

log = logging.getLogger("gateway.workers")


class AttemptFailed(Exception):
    """An attempt failed before anything reached the client; it may be retried."""

    def __init__(self, error: EngineCallError) -> None:
        super().__init__(str(error))
        self.error = error


class WorkerAttempt:
    __slots__ = ("worker", "_judged")

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._judged = False

    def __enter__(self) -> "WorkerAttempt":
        self.worker.begin_request()
        return self

    def failed(self, error: EngineCallError) -> None:
        """The worker's call failed: the circuit's verdict, now (the attempt may still return normally)."""
        self._judged = True
        breaker = self.worker.breaker
        if error.engine_fault:
            breaker.record_failure(trio.current_time())
        else:
            breaker.release_probe()

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        worker = self.worker
        worker.end_request()
        if self._judged:
            return
        if exc is None:
            worker.breaker.record_success(trio.current_time())
        else:
            worker.breaker.release_probe()  # cancelled, or failed on our side: no verdict on the engine


async def abort_quietly(worker: Worker, request_id: str, timeout_s: float) -> None:
    """Ask the engine to stop a generation it may still run (and free its slot and KV); bounded, and a failure only
    logged: the call it ends is already gone from our side."""
    try:
        with trio.move_on_after(timeout_s):
            await worker.client.abort(request_id, timeout_s)
    except EngineCallError as e:
        log.debug("abort of %s on %s failed: %s", request_id, worker.id, e)

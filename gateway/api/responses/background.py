"""Responses generated in the background (``background: true``): queued at once and stored, then admitted, run by
the pipeline with no client (``background.BackgroundOut``) and stored as they go (queued -> in_progress ->
completed, incomplete or failed), their stream's events in their log for a client following or resuming it, stopped
by a cancel from any node (``background.BackgroundRuns``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ...base.errors import GatewayError
from ...serving.generation import GenerationPlan
from ...tokenizer.service import TokenizerService
from ..background import STORE_POLL_S, BackgroundOut, BackgroundRun
from ..chat_output import ChatOutput
from ...serving.chat import plain_answer
from ..errors import ApiError, TooManyRequests, to_api_error
from ..http import Request
from ..pipeline import run_unary, stream_chat
from ..state import GatewayState
from .events import CREATED, IN_PROGRESS, QUEUED
from .shape import ResponseShape
from .stream_log import FLUSH_INTERVAL_S, follow_log
from .tools import ToolLoop, no_emit

log = logging.getLogger("gateway.api")


async def background_loop(state: GatewayState, loop: ToolLoop, shape: ResponseShape, keep: Any,
                           run: BackgroundRun) -> dict[str, Any]:
    """A background response's tool loop (each step admitted by itself): the final response, failed on an error."""
    try:
        await _in_progress(shape, keep, run)
        final = await loop.run(no_emit)
        if shape.log is not None:
            shape.terminal_event()
        return final
    except Exception as e:
        return _failed(shape, e)


async def _in_progress(shape: ResponseShape, keep: Any, run: BackgroundRun) -> None:
    """The response starts: in_progress in its stream and in the store (unless a cancel came first); once, though
    a routed one may try several targets."""
    if shape.in_progress_told:
        return
    shape.in_progress_told = True
    in_progress = shape.response("in_progress")
    if shape.log is not None:
        shape.response_event(IN_PROGRESS, in_progress)
    if not run.cancelled:
        await keep(in_progress, final=False)


def _failed(shape: ResponseShape, e: Exception) -> dict[str, Any]:
    """The failed response an exception makes (a stream's error event too), as a client's stream would end."""
    error = to_api_error(e)
    if error is None:
        log.exception("background response %s failed", shape.id)
        error = ApiError("internal error", code="internal_error")
    if shape.log is not None:
        shape.error_event(error)
    return shape.failed(error)


# -- background responses ------------------------------------------------------------------------------------

async def start_in_background(state: GatewayState, request: Request, shape: ResponseShape, keep: Any, stream: bool,
                               limits: contextlib.AsyncExitStack,
                               answer: Callable[[BackgroundRun], Awaitable[dict[str, Any]]]) -> None:
    """Store the response queued and answer it (or follow its stream); the run goes on in ``state.background``.
    Counted like any request before anything is stored: the caller's rate limits (``limits``, taken by the
    caller, settled when the generation ends; a tool loop takes them step by step), its share of the node's slots
    when it runs, and at most that many in progress. ``answer(run)`` is the final response."""
    owner, runs = request.owner, state.background
    in_progress = runs.in_progress(owner)
    if in_progress >= state.admission.config.tenant_running_max() > 0:
        await limits.aclose()
        raise TooManyRequests(f"{in_progress} background responses of yours are in progress on this node, as "
                              "many as may be: wait for one to finish", code="too_many_background_responses",
                              retry_after_s=1)
    run = runs.reserve(shape.id, owner, shape.log)  # a cancel finds it from now on, on any node
    try:
        queued = shape.response("queued")
        if stream:  # OpenAI's opening of a background stream: created (queued), then queued
            shape.response_event(CREATED, queued)
            shape.response_event(QUEUED, queued)
        await keep(queued, final=False)  # stored first: GET, cancel and a resume work at once, on any node
    except BaseException:
        runs.release(run)
        await limits.aclose()
        raise
    runs.start(run, lambda run: _run_in_background(state, run, shape, keep, limits, answer))
    if shape.log is None:
        await request.send_json(200, queued)
    else:  # the client follows the stream; if it goes, the response goes on and a resume picks it up
        await follow_log(request, shape.log, -1)


async def _run_in_background(state: GatewayState, run: BackgroundRun, shape: ResponseShape, keep: Any,
                             limits: contextlib.AsyncExitStack,
                             answer: Callable[[BackgroundRun], Awaitable[dict[str, Any]]]) -> None:
    """A background response: admitted, generated and stored as it goes (queued -> in_progress -> completed
    or failed), stopped by a cancel (on any node: ``BackgroundRuns.cancel``). ``limits`` holds its rate
    limits' reservation, settled with the tokens used when it ends."""
    history = state.history
    async with limits:
        try:
            with run.scope:
                async with trio.open_nursery() as nursery:
                    if shape.log is not None:
                        nursery.start_soon(_store_events, shape, keep)
                    if state.background.poll_store:
                        nursery.start_soon(_poll_store_for_cancel, state, run)
                    final = await answer(run)
                    nursery.cancel_scope.cancel()
                stored = await history.get_response(shape.id, run.owner)
                if stored is not None and stored.response.get("status") != "cancelled":
                    await keep(final)
            if run.cancelled:  # whatever this run stored before the cancel reached it, the response is cancelled
                stored = await history.get_response(shape.id, run.owner)
                if stored is not None and stored.response.get("status") != "cancelled":
                    await keep({**stored.response, "status": "cancelled"}, final=False)
        except (GatewayError, ApiError) as e:  # the store failed, or the conversation went: nobody to tell
            log.warning("background response %s could not be stored: %s", shape.id, e)


async def background_answer(state: GatewayState, request: Request, plan: GenerationPlan,
                            tokenizer: TokenizerService, shape: ResponseShape, output: ChatOutput | None,
                            keep: Any, run: BackgroundRun) -> dict[str, Any]:
    """The final response (completed, incomplete or failed), run by the pipeline as a client's would be, with
    the background's output (``BackgroundOut``): streamed (``shape.log``), every event went into the log, the
    terminal one last."""
    streamed = shape.log is not None
    failures: list[ApiError] = []
    out = BackgroundOut()

    def failed(error: ApiError) -> bytes:
        failures.append(error)
        return shape.error_event(error)

    async def terminal() -> bytes:
        return shape.terminal_event()

    try:
        async with state.admission.slot(request.tenant_key):  # its rate limits were taken when it was created
            await _in_progress(shape, keep, run)
            if streamed:
                await stream_chat(state, out, plan, tokenizer, output, shape, terminal, opened=True,
                                  error_event=failed)
                return shape.failed(failures[0]) if failures else shape.final
            result = await run_unary(state, out, plan, tokenizer)
        return shape.whole(output.whole(result) if output is not None else plain_answer(result))
    except Exception as e:  # the answer is a failed response, as a stream's would be
        return _failed(shape, e)


class ProviderInBackground:
    """The shape as a hosted provider's answer renders into it in the background (``gateway/api/routed.py``'s
    ``answer_provider``): the opening events were made when it was queued and started, so none again; the
    whole answer and a stream's error are kept for the run's final response."""

    def __init__(self, shape: ResponseShape, keep: Any, run: BackgroundRun) -> None:
        self.shape = shape
        self._keep = keep
        self._run = run
        self.final: "dict[str, Any] | None" = None
        self.failure: ApiError | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shape, name)

    async def begin(self, model: str) -> None:
        """A target was chosen: the response names its model, and is in progress."""
        self.shape.base["model"] = model
        await _in_progress(self.shape, self._keep, self._run)

    def delta_events(self, deltas: Any, first: bool) -> bytes:
        return self.shape.delta_events(deltas, False)

    def error_event(self, error: ApiError) -> bytes:
        self.failure = error
        return self.shape.error_event(error)

    async def keep_whole(self, answer: "dict[str, Any]") -> None:
        self.final = answer  # stored by the run when it ends (``_run_in_background``)

    async def terminal(self) -> bytes:
        return self.shape.terminal_event()

    def result(self) -> "dict[str, Any]":
        """The run's final response: failed by the stream's error, else the answer."""
        if self.failure is not None:
            return self.shape.failed(self.failure)
        return self.final if self.final is not None else self.shape.final


def failed_response(shape: ResponseShape, e: Exception) -> dict[str, Any]:
    """The failed response an exception of a background run makes (its stream's error event too)."""
    return _failed(shape, e)


async def _store_events(shape: ResponseShape, keep: Any) -> None:
    """While a background response streams: its new events reach the store FLUSH_INTERVAL_S apart at most (for
    a resume on another node), woken by the events themselves: nothing runs while none comes."""
    log_ = shape.log
    while True:
        if not log_.dirty:
            await log_.changed().wait()
        await trio.sleep(FLUSH_INTERVAL_S)  # what comes meanwhile goes in the same write
        if log_.dirty:
            try:
                await keep(shape.response("in_progress"), final=False)
            except GatewayError:
                continue  # the store is away for now: the next events try again


async def _poll_store_for_cancel(state: GatewayState, run: BackgroundRun) -> None:
    """Without a mesh, a cancel made on another node of a shared store reaches this run only through the store."""
    while True:
        await trio.sleep(STORE_POLL_S)
        try:
            stored = await state.history.get_response(run.id, run.owner)
        except GatewayError:
            continue  # the store is away for now; look again
        if stored is None or stored.response.get("status") == "cancelled":  # cancelled, or deleted
            state.background.cancelled_in_store(run)
            return

"""Running a generation for an HTTP request: one JSON answer, or a stream of SSE events.

Shared by every generation endpoint; the endpoints differ only in how they
shape text and the final result into bytes.

Streaming: nothing is sent until the first text is decided, so a failure
before that (no healthy worker, every retry failed) is still a proper HTTP
error status. After that, failures become an error event followed by
``[DONE]``: the OpenAI SDK raises on it instead of waiting on a silent stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from ..engine.errors import EngineCallError
from ..generation import GenerationPlan, GenerationResult, MidStreamError
from ..tokenizer.service import TokenizerService
from .errors import ApiError, UpstreamTimeout, from_engine_error, to_api_error
from .http import SSE_DONE, SSE_HEADERS, Request, sse_event
from .ratelimits import rate_limited


def admitted(state, request: Request, plan: GenerationPlan) -> Any:
    """``async with admitted(...)``: rate limits first (a denied request never queues), then a slot
    of the admission queue."""
    limiter = state.rate_limiter
    if limiter is None or not limiter.active:  # no limits: the slot alone, no manager around it
        return state.admission.slot(request.tenant_key)
    return _rate_limited_then_admitted(state, request, plan, limiter)


def rate_limited_generation(state, request: Request, plan: GenerationPlan) -> Any:
    """The rate limits of a generation alone (its slot taken later: a background response)."""
    return rate_limited(state.rate_limiter, request, plan.model, plan.usage, estimated_tokens(plan))


def estimated_tokens(plan: GenerationPlan) -> int:
    return len(plan.input_ids) + plan.sampling.max_new_tokens * plan.sampling.n


@contextlib.asynccontextmanager
async def _rate_limited_then_admitted(state, request: Request, plan: GenerationPlan, limiter) -> AsyncIterator[None]:
    async with rate_limited(limiter, request, plan.model, plan.usage, estimated_tokens(plan)), \
            state.admission.slot(request.tenant_key):
        yield


def _deadline(plan: GenerationPlan) -> float:
    return trio.current_time() + plan.timeout_s if plan.timeout_s else float("inf")


def _timeout_error() -> UpstreamTimeout:
    return UpstreamTimeout("the request took longer than the gateway's request timeout", code="request_timeout")


async def run_unary(state, request: Request, plan: GenerationPlan,
                    tokenizer: TokenizerService) -> GenerationResult | None:
    """The whole result, or None when the client went away (nothing to answer then)."""
    result = await _unary(request, plan, lambda: state.generator.run(plan, tokenizer, None))
    if result is not None:
        state.count_tokens(plan.model, result)
    return result


async def run_unary_choices(state, request: Request, plan: GenerationPlan,
                            tokenizer: TokenizerService) -> "list[GenerationResult] | None":
    """``run_unary`` for n > 1 answers."""
    results = await _unary(request, plan, lambda: state.generator.run_choices(plan, tokenizer, None))
    for result in results or ():
        state.count_tokens(plan.model, result)
    return results


async def _unary(request: Request, plan: GenerationPlan, generate: Callable[[], Awaitable[Any]]) -> Any:
    async with request.cancel_on_disconnect() as scope:
        scope.deadline = _deadline(plan)  # one scope for both ends: the client's and the clock's
        try:
            outcome = await generate()
        except EngineCallError as e:  # mapped here, where the model is known: the answer names it
            raise from_engine_error(e, plan.model) from None
    if request.disconnected:
        return None
    if scope.cancelled_caught:
        raise _timeout_error()
    return outcome


async def run_streamed(state, request: Request, plan: GenerationPlan, tokenizer: TokenizerService,
                       text_event: Callable[[str, bool], bytes],
                       final_events: Callable[[GenerationResult], bytes],
                       error_event: "Callable[[ApiError], bytes] | None" = None, done: bytes = SSE_DONE,
                       finish: "Callable[[], Awaitable[bytes]] | None" = None) -> None:
    """Stream SSE: ``text_event(text, first)`` per decided piece, ``final_events(result)`` then ``done``
    ([DONE]); another API's stream (Anthropic's, the Responses API's) gives its own ``error_event`` and
    ends without [DONE]. ``finish``, when given, runs after a successful generation and before the last
    write (the Responses API stores the response there); its events come last, or its error's."""
    sink = SseSink(request, text_event)

    def tail(result: GenerationResult | None) -> bytes:
        opening = b"" if sink.started else text_event("", True)  # no text came at all: an empty answer
        if result is None:
            return opening
        state.count_tokens(plan.model, result)
        return opening + final_events(result)

    await _stream_sse(request, plan, sink, lambda: state.generator.run(plan, tokenizer, sink), tail,
                      error_event or _openai_error_event, done, finish)


async def run_streamed_choices(state, request: Request, plan: GenerationPlan, tokenizer: TokenizerService,
                               text_event: Callable[[int, str, bool], bytes],
                               final_events: Callable[[list[GenerationResult]], bytes]) -> None:
    """``run_streamed`` for n > 1 answers: ``text_event(index, text, first)``, ``final_events(results)``."""
    sink = ChoicesSseSink(request, text_event)

    def tail(results: "list[GenerationResult] | None") -> bytes:
        opening = b"".join(text_event(i, "", True) for i in range(plan.sampling.n) if i not in sink.opened)
        if results is None:
            return opening
        for result in results:
            state.count_tokens(plan.model, result)
        return opening + final_events(results)

    await _stream_sse(request, plan, sink, lambda: state.generator.run_choices(plan, tokenizer, sink), tail)


def _openai_error_event(error: ApiError) -> bytes:
    return sse_event(error.body())


async def _stream_sse(request: Request, plan: GenerationPlan, sink: Any, generate: Callable[[], Awaitable[Any]],
                      tail: Callable[[Any], bytes], error_event: Callable[[ApiError], bytes] = _openai_error_event,
                      done: bytes = SSE_DONE, finish: "Callable[[], Awaitable[bytes]] | None" = None) -> None:
    """Run ``generate`` under the request's deadline and the client's presence; its text went out through
    ``sink``; end with ``tail(outcome)`` (None after a failure: ``error_event`` follows) and ``done``."""
    outcome: Any = None
    error: ApiError | None = None
    async with request.cancel_on_disconnect():
        # Two scopes here, unlike run_unary: the last events are written after the deadline has
        # cancelled the generation, still under the watch for the client going away.
        with trio.CancelScope(deadline=_deadline(plan)) as timeout:
            try:
                outcome = await generate()
            except MidStreamError as e:
                error = from_engine_error(e.error, plan.model)
            except EngineCallError as e:  # before the first byte: a status, naming the model
                raise from_engine_error(e, plan.model) from None
        if timeout.cancelled_caught:
            if not sink.started:
                raise _timeout_error()
            error = _timeout_error()
        if request.disconnected:
            return
        # The last write carries the head too when no text came at all (an empty answer).
        if not sink.started:
            await request.start_stream(200, SSE_HEADERS)
        end = tail(None if error is not None else outcome)
        if error is None and finish is not None:
            try:
                end += await finish()
            except Exception as e:
                error = to_api_error(e)
                if error is None:
                    raise
        if error is not None:
            end += error_event(error)
        await request.end_stream(end + done)  # the last events and the end: one write


class SseSink:
    """Where a streamed generation's text goes: one SSE event per piece, the response head with the first.

    Awaited by the request's task; once the stream has started, also written synchronously
    (``ready_now``, ``send_now``, ``flush``: ``generation.TextSink``) by the task that reads the
    engine, so a token costs no wake-up of the request's task.
    """

    __slots__ = ("_request", "_text_event", "started")

    def __init__(self, request: Request, text_event: Callable[[str, bool], bytes]) -> None:
        self._request = request
        self._text_event = text_event
        self.started = False

    async def __call__(self, text: str) -> None:
        if not self.started:
            self.started = True
            await self._request.start_stream(200, SSE_HEADERS)
            await self._request.send_chunk(self._text_event(text, True))
        else:
            await self._request.send_chunk(self._text_event(text, False))

    def ready_now(self) -> bool:
        return self.started and self._request.can_send_chunk_now()

    def send_now(self, text: str) -> bool:
        return self._request.send_chunk_now(self._text_event(text, False))

    async def flush(self) -> None:
        await self._request.flush()


class ChoicesSseSink:
    """``SseSink`` for n > 1 answers in one stream: written only by the request's task (in order), the
    response head with the first text of any answer, each answer's first piece marked first."""

    __slots__ = ("_request", "_text_event", "started", "opened")

    def __init__(self, request: Request, text_event: Callable[[int, str, bool], bytes]) -> None:
        self._request = request
        self._text_event = text_event
        self.started = False
        self.opened: set[int] = set()  # answers whose first piece went out

    async def __call__(self, index: int, text: str) -> None:
        first = index not in self.opened
        self.opened.add(index)
        if not self.started:
            self.started = True
            await self._request.start_stream(200, SSE_HEADERS)
        await self._request.send_chunk(self._text_event(index, text, first))

"""One generation on a gRPC engine: route, send token ids, detokenize, stop, retry, abort.

Flow of an attempt: the router picks a worker (its circuit admits the
attempt); the engine streams token ids; ids become text through the
incremental decoder, text passes the stop matcher, and what is decided goes to
the sink (the SSE writer) or into the result. Tokens that arrive together
(batched by the gRPC bridge) are decoded and written together. On a streamed
response, tokens that arrive while the request's task waits for them are
stepped and written by the task reading the engine connection (``_Progress``);
everything else, and anything that must await, stays with the request's task.

Retries: a failure before anything reached the client is retried on another
worker when the error is retryable, after an exponential backoff with jitter.
After the first text was sent, a failure ends the stream with an error.

Abort: whenever a generation stops before the engine finished it (stop string
matched, client gone, timeout, error), the gRPC call is cancelled and an
explicit Abort is sent from a background task, so the engine frees the slot
even if it ignores cancellation.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from ..engine.errors import EngineCallError
from ..base.errors import InvalidInput
from ..engine.grpc_engine import Embedding, Handover, SamplingOptions
from ..observe.metrics import GatewayMetrics
from ..routing.policies import RoutingRequest
from ..routing.retry import RetryConfig, backoff_s
from ..tokenizer.service import TokenizerService
from ..tokenizer.stop import StopMatcher, StopResult
from ..workers import AttemptFailed, Router, Worker, WorkerAttempt, abort_quietly

if TYPE_CHECKING:
    from .disaggregation import Pair, PdLegs

log = logging.getLogger("gateway.generation")

ABORT_TIMEOUT_S = 5.0

T = TypeVar("T")


class TextSink(Protocol):
    """Where a streamed generation's decided text goes (``api.pipeline.SseSink``)."""

    async def __call__(self, text: str) -> None:
        """Send ``text``, in the request's task."""

    def ready_now(self) -> bool:
        """``send_now`` may be called: nothing is being written, the bytes would keep their order."""

    def send_now(self, text: str) -> bool:
        """Send ``text`` without awaiting, from any task; False when ``flush`` must follow."""

    async def flush(self) -> None:
        """Finish what ``send_now`` left, in the request's task."""


class ChoiceSink(Protocol):
    """Where the streamed text of n > 1 answers goes, each piece with its answer's index."""

    async def __call__(self, index: int, text: str) -> None:
        """Send ``text`` of answer ``index``, in the request's task."""


def _by_index(events: list, n: int) -> "list[tuple[int, list]]":
    """A batch's events grouped by answer, in order of first appearance; indexes past n are the engine's
    error (dropped)."""
    groups: dict[int, list] = {}
    for event in events:
        if 0 <= event.index < n:
            groups.setdefault(event.index, []).append(event)
    return list(groups.items())


@dataclasses.dataclass
class UsageTally:
    """Tokens a generation has used so far, kept up to date while it runs (read when it ends, aborted or not)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt's, read from a cache (a provider's, the engine's prefix cache)
    reasoning_tokens: int = 0  # of the completion's, spent reasoning (where the answer says)

    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class LogprobRecord:
    """The log probabilities of a generation as they arrive (requests that ask for them).

    ``tokens``: one entry per output token (grpc_engine.TokenLogprob); ``prompt``: the prompt's, when
    asked; ``sent``: how many entries a stream has already sent. Reset for each attempt. A streamed
    answer's record (``keep`` False) forgets what it sent: 16 answers of 16,000 tokens with 20
    alternatives each held ~700 MiB until the stream ended.
    """

    __slots__ = ("tokens", "prompt", "sent", "keep")

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.reset()

    def reset(self) -> None:
        self.tokens: list[Any] = []
        self.prompt: "tuple[Any, ...] | None" = None
        self.sent = 0

    def unsent(self) -> list[Any]:
        """The entries not sent yet, now marked sent (and let go, unless the record keeps them)."""
        if not self.keep:
            entries, self.tokens = self.tokens, []
            return entries
        entries = self.tokens[self.sent:]
        self.sent = len(self.tokens)
        return entries


# What one answer may hold, estimated as the JSON it becomes: a token's text, and per logprob entry (the
# token's and each alternative's: token, logprob, bytes) ~80 bytes, measured on OpenAI's chat shape.
LOGPROB_ENTRY_BYTES = 80


class AnswerTooLarge(InvalidInput):
    """An answer held whole (not streamed) grew past its bound: the generation is stopped, the client told to
    stream it or ask for less."""

    def __init__(self, bound_bytes: int) -> None:
        super().__init__(f"the answer would be larger than {bound_bytes} bytes held at once (--max-answer-bytes): "
                         "stream it (\"stream\": true), or ask for fewer tokens, answers (n) or top_logprobs",
                         code="answer_too_large")


def answer_bytes_estimate(n: int, max_tokens: int, top_logprobs: int | None) -> int:
    """The most an answer of ``n`` choices of ``max_tokens`` tokens can hold (see LOGPROB_ENTRY_BYTES)."""
    per_token = 8 + (LOGPROB_ENTRY_BYTES * (1 + top_logprobs) if top_logprobs is not None else 0)
    return n * max_tokens * per_token


# Not frozen, as no dataclass made for every request is (GenerationPlan, SamplingRequest, ChatRequest,
# SamplingOptions, RoutingRequest, SegmentMatch; GenerateEvent and StopResult, made per token, are
# NamedTuples): a frozen dataclass's __init__ sets each field through object.__setattr__, and these
# ~50 fields were ~5 % of a short request's instructions (1.276 -> 1.207 M, tests/bench/instructions.py).
# Nothing changes them once made.
@dataclasses.dataclass(slots=True)
class GenerationPlan:
    request_id: str
    model: str
    input_ids: list[int]
    sampling: SamplingOptions
    stop: tuple[str, ...]
    include_stop_str: bool
    skip_special_tokens: bool
    stream: bool  # the client streams: text goes to the sink as it is decided
    routing: RoutingRequest
    timeout_s: float | None
    usage: UsageTally = dataclasses.field(default_factory=UsageTally, compare=False)
    # Special tokens kept in the text although skip_special_tokens is set: the markers the answer's
    # parsers read (Llama's <|python_tag|>, Mistral's [TOOL_CALLS]), by their spelling.
    kept_special: frozenset[str] = frozenset()
    logprobs: LogprobRecord | None = None  # filled as tokens arrive when the request asks for logprobs
    # n > 1 (sampling.n): one record per answer instead of ``logprobs``
    choice_logprobs: "list[LogprobRecord] | None" = None
    # An answer held whole until it ends (not streamed, or kept to be stored) stops with AnswerTooLarge past
    # this many bytes (its JSON, estimated as it arrives; every choice together); 0: not held, no bound.
    answer_bytes_max: int = 0
    answer_bytes: int = 0
    # The prompt's images, processed (gateway/media: their tensors and where their tokens are), None without.
    media: Any = None


@dataclasses.dataclass
class GenerationResult:
    text: str
    output_ids: list[int]
    finish_reason: str
    matched_stop: "str | int | None"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    worker_id: str


class MidStreamError(Exception):
    """The engine failed after text reached the client: the stream must end with an error event."""

    def __init__(self, error: EngineCallError) -> None:
        super().__init__(str(error))
        self.error = error


class Generator:
    def __init__(self, router: Router, retry: RetryConfig, metrics: GatewayMetrics, nursery: trio.Nursery,
                 pd: "PdLegs | None" = None, tracing: Any = None, rng: random.Random | None = None) -> None:
        self.router = router
        self.retry = retry
        self.metrics = metrics
        self._nursery = nursery  # long-lived: background aborts outlive the request
        self._rng = rng or random.Random()
        self.tracing = tracing  # gateway.tracing's Tracing when --enable-trace: a span per engine attempt
        # Prefill/decode pairs (gateway/serving/disaggregation.py), run when the node has prefill or decode workers.
        self.pd = pd

    async def run(self, plan: GenerationPlan, tokenizer: TokenizerService, sink: TextSink | None) -> GenerationResult:
        return await self.with_retries(
            plan.request_id, plan.model, plan.routing, "grpc", lambda worker: self._attempt(worker, plan, tokenizer, sink),
            lambda pair: self.pd.run(pair, plan, self._trace_metadata(), lambda worker, handover, on_first: self._attempt(
                worker, plan, tokenizer, sink, handover, on_first)))

    async def embed(self, model: str, input_ids: "list[int]", request_id: str, timeout_s: float | None) -> Embedding:
        """One input's embedding on a worker of ``model`` chosen by the routing policy (by its ids, like any
        prompt), retried on another when an attempt fails; the engine's error after the last."""
        async def attempt(worker: Worker) -> Embedding:
            with WorkerAttempt(worker) as counted:
                try:
                    return await worker.client.embed(request_id, input_ids, timeout_s)
                except EngineCallError as e:
                    self.metrics.engine_errors.labels(worker.id, e.code).inc()
                    counted.failed(e)
                    raise AttemptFailed(e) from None

        return await self.with_retries(request_id, model, RoutingRequest(input_ids=input_ids), "grpc", attempt,
                                       span="engine.embed")

    async def run_choices(self, plan: GenerationPlan, tokenizer: TokenizerService,
                          sink: "ChoiceSink | None") -> list[GenerationResult]:
        """The engine's ``plan.sampling.n`` answers to one prompt (prefilled once), each through its own
        decoder and stop strings; streamed text goes to ``sink`` with its answer's index."""
        return await self.with_retries(
            plan.request_id, plan.model, plan.routing, "grpc",
            lambda worker: self._attempt_choices(worker, plan, tokenizer, sink),
            lambda pair: self.pd.run(pair, plan, self._trace_metadata(), lambda worker, handover, on_first:
                                     self._attempt_choices(worker, plan, tokenizer, sink, handover, on_first)))

    async def with_retries(self, request_id: str, model: str, routing: RoutingRequest, kind: str,
                           attempt_fn: Callable[[Worker], Awaitable[T]],
                           pair_fn: "Callable[[Pair], Awaitable[T]] | None" = None,
                           span: str = "engine.generate") -> T:
        """Run attempt_fn on a chosen worker; retry failures that nothing reached the client of.

        attempt_fn raises AttemptFailed for those; anything else propagates. The last failure is
        raised as the engine's ``EngineCallError``; ``NoCapacity`` when no worker can take an attempt.
        A model served by prefill/decode pairs runs ``pair_fn`` on a chosen pair instead (when given).
        """
        pd = self.pd
        if pair_fn is not None and pd is not None and pd.pairs.registry.pd_workers and pd.pairs.serves(model):
            return await self._with_pair_retries(request_id, model, routing, pair_fn)
        tried: set[str] = set()
        attempts = self.retry.attempts_max
        for attempt in range(attempts):
            worker = self.router.select(model, routing, exclude=tried, kind=kind)
            tried.add(worker.id)
            try:
                if routing.adapter is not None:  # the adapter loaded there (room made) and held while it answers
                    async with self.router.adapters.ready(worker, routing.adapter):
                        return await self._traced(attempt_fn, worker, attempt, span, model)
                if self.tracing is None or not self.tracing.active():
                    return await attempt_fn(worker)
                return await self._traced(attempt_fn, worker, attempt, span, model)
            except AttemptFailed as failed:
                await trio.sleep(self._backoff_after(failed, attempt, request_id, worker.id))
        raise AssertionError("unreachable: the last attempt raises")

    async def _traced(self, attempt_fn: "Callable[[Worker], Awaitable[T]]", worker: Worker, attempt: int, span: str,
                      model: str) -> T:
        """One attempt, in a span of its own when the node traces."""
        if self.tracing is None or not self.tracing.active():
            return await attempt_fn(worker)
        with self.tracing.client_span(span, {
                "smg.worker.id": worker.id, "smg.worker.url": worker.url, "smg.attempt": attempt + 1,
                "smg.policy": self.router.policy.name, "gen_ai.request.model": model}):
            return await attempt_fn(worker)

    async def _with_pair_retries(self, request_id: str, model: str, routing: RoutingRequest,
                                 pair_fn: "Callable[[Pair], Awaitable[T]]") -> T:
        """``with_retries`` on prefill/decode pairs: a retry prefers a pair of workers not tried yet."""
        tried: set[str] = set()
        attempts = self.retry.attempts_max
        pairs = self.pd.pairs
        for attempt in range(attempts):
            pair = pairs.select(model, routing, exclude=tried)
            tried.update((pair.prefill.id, pair.decode.id))
            try:
                if self.tracing is None or not self.tracing.active():
                    return await pair_fn(pair)
                with self.tracing.client_span("engine.generate", {
                        "smg.worker.id": pair.decode.id, "smg.worker.url": pair.decode.url,
                        "smg.pd.prefill.id": pair.prefill.id, "smg.attempt": attempt + 1,
                        "smg.policy": pairs.decode_policy.name, "gen_ai.request.model": model}):
                    return await pair_fn(pair)
            except AttemptFailed as failed:
                await trio.sleep(self._backoff_after(failed, attempt, request_id,
                                                     f"prefill {pair.prefill.id} / decode {pair.decode.id}"))
        raise AssertionError("unreachable: the last attempt raises")

    def _backoff_after(self, failed: AttemptFailed, attempt: int, request_id: str, where: str) -> float:
        """The wait before the attempt after ``attempt`` (from 0); the engine's error when there is none."""
        error = failed.error
        if not error.retryable or attempt == self.retry.attempts_max - 1:
            raise error from None
        self.metrics.retries.labels(error.code).inc()
        delay = backoff_s(self.retry, attempt, self._rng)
        log.info("request %s: attempt %d on %s failed (%s); retrying in %.3fs", request_id, attempt + 1, where, error,
                 delay)
        return delay

    def _trace_metadata(self) -> "tuple[tuple[bytes, bytes], ...]":
        """The attempt's W3C traceparent (and the client's tracestate) for the engine's gRPC metadata, inside a
        traced request."""
        tracing = self.tracing
        if tracing is None or not tracing.active():
            return ()
        return tuple(tracing.context_headers())

    async def _attempt(self, worker: Worker, plan: GenerationPlan, tokenizer: TokenizerService,
                       sink: TextSink | None, handover: "Handover | None" = None,
                       on_first_token: "Callable[[], None] | None" = None) -> GenerationResult:
        """One attempt on ``worker``; a disaggregated request's decode leg carries its ``handover`` and learns of
        its first token (the KV arrived) through ``on_first_token``."""
        progress = _Progress(plan, tokenizer, worker.id, sink, on_first_token=on_first_token)
        # Stream from the engine when the client streams, when stop strings may end it early, and when the
        # answer carries logprobs: held whole it is bounded as it arrives (answer_bytes_max), which one final
        # message of every token's alternatives (hundreds of MB for n = 16) would not allow.
        # A decode leg streams too: its first token says the KV arrived, which the hand-over's bound waits for.
        engine_stream = plan.stream or bool(plan.stop) or plan.logprobs is not None or handover is not None
        started_at = trio.current_time()
        with WorkerAttempt(worker) as attempt:
            try:
                async with worker.client.generate(plan.request_id, plan.input_ids, plan.sampling, engine_stream,
                                                  plan.timeout_s, self._trace_metadata(), handover,
                                                  plan.media) as batches:
                    progress.generation = batches
                    if sink is not None:
                        batches.listen(progress.on_arrival)
                    # With a listener, a batch here is what it left: [] when it only needs this task
                    # to finish its work (a flush, the end, its failure).
                    async for events in batches:
                        if progress.failure is not None:
                            raise progress.failure
                        if progress.flush_due:
                            progress.flush_due = False
                            await sink.flush()
                        if events and progress.result is None:
                            text = progress.step(events)
                            if text and sink is not None:
                                await sink(text)
                                progress.delivered = True
                        if progress.result is not None:
                            break
                if progress.result is None:
                    raise EngineCallError("UNAVAILABLE", "the engine closed the stream without finishing")
            except EngineCallError as e:
                self.metrics.engine_errors.labels(worker.id, e.code).inc()
                attempt.failed(e)
                if progress.delivered:
                    raise MidStreamError(e) from None
                raise AttemptFailed(e) from None
            finally:
                if not progress.finished:
                    reason = "stop_string" if progress.result is not None else "cancelled_or_failed"
                    self.metrics.aborts.labels(reason).inc()
                    self._nursery.start_soon(self._abort, worker, plan.request_id)
        result = progress.result
        first_token_at = progress.first_token_at
        if self.tracing is not None and self.tracing.active():
            self.tracing.annotate({"gen_ai.usage.output_tokens": result.completion_tokens,
                                   "gen_ai.usage.input_tokens": result.prompt_tokens,
                                   "smg.cached_tokens": result.cached_tokens,  # the routing's cache hit
                                   **({"smg.ttft_s": first_token_at - started_at} if first_token_at is not None
                                      else {})})
        if first_token_at is not None and engine_stream:
            metrics, model = self.metrics, plan.model
            metrics.child(metrics.ttft, model).observe(first_token_at - started_at)
            if result.completion_tokens > 1:
                metrics.child(metrics.tpot, model).observe(
                    (trio.current_time() - first_token_at) / (result.completion_tokens - 1))
        return result

    async def _attempt_choices(self, worker: Worker, plan: GenerationPlan, tokenizer: TokenizerService,
                               sink: "ChoiceSink | None", handover: "Handover | None" = None,
                               on_first_token: "Callable[[], None] | None" = None) -> list[GenerationResult]:
        """``_attempt`` for n > 1: the request's task steps every answer (no listener: the answers share
        one response, whose writes it orders)."""
        records = plan.choice_logprobs
        progresses = [_Progress(plan, tokenizer, worker.id, None, records[i] if records else None)
                      for i in range(plan.sampling.n)]
        delivered = False
        with WorkerAttempt(worker) as attempt:
            try:
                # as in _attempt
                engine_stream = plan.stream or bool(plan.stop) or records is not None or handover is not None
                async with worker.client.generate(plan.request_id, plan.input_ids, plan.sampling, engine_stream,
                                                  plan.timeout_s, self._trace_metadata(), handover,
                                                  plan.media) as batches:
                    async for events in batches:
                        if on_first_token is not None and events:
                            on_first_token()
                            on_first_token = None
                        for index, own in _by_index(events, len(progresses)):
                            progress = progresses[index]
                            if progress.result is not None:
                                continue
                            text = progress.step(own)
                            if text and sink is not None:
                                await sink(index, text)
                                delivered = True
                        if all(p.result is not None for p in progresses):
                            break
                if any(p.result is None for p in progresses):
                    raise EngineCallError("UNAVAILABLE", "the engine closed the stream before every answer finished")
            except EngineCallError as e:
                self.metrics.engine_errors.labels(worker.id, e.code).inc()
                attempt.failed(e)
                if delivered:
                    raise MidStreamError(e) from None
                raise AttemptFailed(e) from None
            finally:
                if not all(p.finished for p in progresses):
                    self.metrics.aborts.labels("stop_string" if all(p.result for p in progresses)
                                               else "cancelled_or_failed").inc()
                    self._nursery.start_soon(self._abort, worker, plan.request_id)
        if records:  # the prompt's logprobs come once, with whichever answer the engine put them
            prompt = next((record.prompt for record in records if record.prompt), None)
            for record in records:
                record.prompt = record.prompt or prompt
        return [p.result for p in progresses]

    async def _abort(self, worker: Worker, request_id: str) -> None:
        await abort_quietly(worker, request_id, ABORT_TIMEOUT_S)


class _Progress:
    """One attempt's way through the engine's events: ids to text, stop strings, the result.

    Stepped by the request's task, and on a streamed response also by ``on_arrival``, which
    the engine connection's reading task calls when events arrive while the request's task
    waits for them: it decodes them and writes their text itself, so a token costs no trip
    through the scheduler to wake the request's task (~15 % of a streamed request's CPU).
    The first text goes too, with the response head, where the sink can start the response
    synchronously (the native server). What it cannot finish (the engine's last message; a
    write the socket did not take whole; the end by a stop string; a failure) it leaves to
    the request's task, in order: it steps nothing while something of its own is left for
    that task.
    """

    __slots__ = ("plan", "logprobs", "worker_id", "sink", "generation", "decoder", "matcher", "output_ids",
                 "text_parts", "first_token_at", "result", "finished", "delivered", "flush_due", "failure",
                 "on_first_token")

    def __init__(self, plan: GenerationPlan, tokenizer: TokenizerService, worker_id: str,
                 sink: TextSink | None, logprobs: LogprobRecord | None = None,
                 on_first_token: "Callable[[], None] | None" = None) -> None:
        self.plan = plan
        self.logprobs = logprobs if logprobs is not None else plan.logprobs
        self.worker_id = worker_id
        self.sink = sink
        self.generation: Any = None  # the engine call, once on_arrival listens to it
        self.decoder = tokenizer.new_decode_stream(plan.skip_special_tokens, plan.kept_special)
        self.matcher = StopMatcher(plan.stop, plan.include_stop_str)
        self.output_ids: list[int] = []
        self.text_parts: list[str] = []
        self.first_token_at: float | None = None
        self.result: GenerationResult | None = None
        self.finished = False  # the engine finished the generation (no abort due)
        self.delivered = False  # text reached the sink: no retry from here on
        self.flush_due = False  # send_now left bytes for the request's task to write
        self.failure: BaseException | None = None  # raised in on_arrival, for the request's task
        self.on_first_token = on_first_token  # a decode leg's: its KV arrived (gateway/serving/disaggregation.py)
        if self.logprobs is not None:
            self.logprobs.reset()  # a new attempt: what an earlier one received is not this answer's

    def step(self, events: list) -> str:
        """Take a batch of events; the text they decide (maybe ""). Sets ``result`` at the end."""
        new_ids: list[int] = []
        for event in events:
            new_ids.extend(event.token_ids)
        last = events[-1]
        record = self.logprobs
        plan = self.plan
        if record is not None:
            for event in events:
                if event.logprobs:
                    record.tokens.extend(event.logprobs)
                    if plan.answer_bytes_max:
                        plan.answer_bytes += LOGPROB_ENTRY_BYTES * sum(1 + len(e[2]) for e in event.logprobs)
                if event.prompt_logprobs:
                    record.prompt = event.prompt_logprobs
        if new_ids and self.first_token_at is None:
            self.first_token_at = trio.current_time()
            if self.on_first_token is not None:
                self.on_first_token()
        matcher = self.matcher
        if len(new_ids) > 1 and matcher.stops:
            decided, counted = self._match_each(new_ids)
            new_ids = new_ids[:counted]  # the tokens after the one that completed a stop string do not count
        else:
            decided = matcher.feed(self.decoder.step(new_ids))
        self.output_ids.extend(new_ids)
        plan.usage.completion_tokens += len(new_ids)  # every attempt's tokens were generated
        text = decided.text
        finish_reason = last.finish_reason
        if finish_reason is not None and decided.matched is None:
            if finish_reason == "abort":
                raise EngineCallError("ABORTED", "the engine aborted the generation")
            text += matcher.flush()
        if text:
            self.text_parts.append(text)
        if plan.answer_bytes_max:
            plan.answer_bytes += 8 * len(new_ids)
            if plan.answer_bytes > plan.answer_bytes_max:
                raise AnswerTooLarge(plan.answer_bytes_max)
        if decided.matched is not None or finish_reason is not None:
            self.finished = finish_reason is not None
            if decided.matched is not None:
                reason, matched = "stop", decided.matched
            else:
                reason, matched = finish_reason, last.matched_token_id
            output_ids = self.output_ids
            self.result = GenerationResult(
                text="".join(self.text_parts), output_ids=output_ids, finish_reason=reason, matched_stop=matched,
                prompt_tokens=last.prompt_tokens or len(plan.input_ids), completion_tokens=len(output_ids),
                cached_tokens=last.cached_tokens, worker_id=self.worker_id)
            if last.cached_tokens > plan.usage.cached_tokens:  # the prompt read from the engine's prefix cache
                plan.usage.cached_tokens = last.cached_tokens
        return text

    def _match_each(self, ids: list[int]) -> tuple[StopResult, int]:
        """The stop strings matched one token at a time: (what was decided, how many tokens up to and
        including the one that completed a stop, else all). Batched, the same answer counted the tokens the
        engine sent after the stop (2, 3 or 22 as batches fell: vLLM says 2); this way the count is the same
        however the tokens arrive, streamed or not."""
        step, feed = self.decoder.step, self.matcher.feed
        parts = []
        for index, token_id in enumerate(ids):
            decided = feed(step((token_id,)))
            parts.append(decided.text)
            if decided.matched is not None:
                return StopResult("".join(parts), decided.matched), index + 1
        return StopResult("".join(parts)), len(ids)

    def on_arrival(self) -> bool:
        """Events arrived while the request's task waits: True when they were handled here entirely.

        False leaves the rest to the request's task, which is woken: the events themselves (taken
        only when they can be handled here), or a flush, the end, or a failure recorded here.
        """
        if self.flush_due or self.failure is not None or self.result is not None:
            return False
        sink = self.sink
        try:
            if not sink.ready_now():
                return False
            events = self.generation.take_now()
            if events is None:
                return False
            if not events:
                return True
            text = self.step(events)
            if text:
                self.delivered = True
                self.flush_due = not sink.send_now(text)
        except Exception as e:
            # Raised again in the request's task, as if it had stepped these events itself: an
            # aborted generation stays the engine's error, anything else is the gateway's (never
            # let out into the engine connection, which would fail the call as the engine's fault).
            self.failure = e
            return False
        return self.result is None and not self.flush_due

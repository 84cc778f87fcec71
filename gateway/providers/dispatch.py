"""Calling one provider target: the request sent with the node's HTTP client, the answer read within its bounds
and its time, every outcome counted by target.

``ProviderCalls.whole`` returns a ``ProviderAnswer``; ``ProviderCalls.stream`` opens a ``ProviderStream`` whose
``deltas()`` yields the typed deltas as the provider sends them and whose ``end`` holds the finish reason and usage
after. Either raises ``ProviderError`` before anything was answered: the route (``gateway/api/routed.py``) then
tries its next target when the route's ``fallback_on`` names the error's kind. A failure after a stream's first
delta is the client's, in its API's error event.

Time: a whole answer must come within the target's ``timeout_s``; a stream's first byte too, and then each next
piece within the same time (a provider that stops sending mid-answer is a timeout, not a stuck request).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
import trio

from ..net.http_client import HttpClient, HttpClientError
from ..observe.metrics import counter
from ..serving.chat import ChatRequest, Delta
from .base import (CONNECT, SERVER, TIMEOUT, CallAbandoned, HttpCall, Provider, ProviderAnswer, ProviderError,
                   StreamEnd, Target, joined, wire_of)
from .credentials import CredentialError, Secrets

log = logging.getLogger("gateway.providers")


GAP_SLACK_S = 0.5  # (ProviderStream.relay)


@dataclasses.dataclass(frozen=True)
class CallBounds:
    # A whole answer's body, read before it is parsed: the largest chat answer a provider sends is its longest
    # output (~64k tokens of JSON, a few MiB) with logprobs at most; 32 MiB is the node's own bound for an answer
    # held whole (--max-answer-bytes' default).
    answer_bytes_max: int = 32 * 1024 * 1024
    # An error answer's body: a message, not a document.
    error_bytes_max: int = 64 * 1024


class ProviderCalls:
    """The node's calls to provider targets (one per process: its connections are the process's)."""

    def __init__(self, http: HttpClient, secrets: Secrets | None = None, bounds: CallBounds = CallBounds(),
                 tracing: Any = None) -> None:
        self.http = http
        self.secrets = secrets or Secrets()
        self.bounds = bounds
        self.tracing = tracing
        # Per target: outcomes, seconds, tokens.
        self.outcomes: dict[tuple[str, str], int] = {}
        self.seconds: dict[str, float] = {}
        self.tokens: dict[tuple[str, str], int] = {}

    async def _secret(self, target: Target) -> Any:
        credential = target.credential
        try:
            if credential is not None and credential.kind == "aws" and not self.secrets.aws_ready(credential.ref):
                return await trio.to_thread.run_sync(self.secrets.resolve, credential)  # the chain's first lookup
            return self.secrets.resolve(credential)
        except CredentialError as e:
            raise ProviderError("auth", 503, f"the target {target.name}'s credential: {e}") from None

    async def _send(self, target: Target, build: "Callable[[Provider, Any], HttpCall]") -> Any:
        """``build(provider, secret)``'s request sent; the provider and its answer's head (a refusal raised)."""
        provider = wire_of(target)
        call = build(provider, await self._secret(target))
        try:
            answer = await self.http.request(call.method, call.url, call.headers, call.body)
        except HttpClientError as e:
            raise ProviderError(CONNECT if e.kind == "connect" else SERVER, 502,
                                f"the target {target.name} did not answer: {e}") from None
        if answer.status != 200:
            try:
                body = await answer.read(self.bounds.error_bytes_max)
            except HttpClientError:
                body = b""
            finally:
                await answer.aclose()
            raise provider.error(answer.status, answer.headers, body)
        return provider, answer

    def span(self, target: Target, stream: bool) -> Any:
        """The provider attempt's client span, a context manager (None without tracing; its value None outside a
        sampled request): the target, its provider and model; its usage and outcome are set when it ends."""
        if self.tracing is None:
            return None
        return self.tracing.client_span("provider.call", {"smg.target": target.name, "smg.provider": target.provider,
                                                          "gen_ai.request.model": target.model, "smg.stream": stream})

    async def whole(self, chat: ChatRequest, target: Target, watch: Any = None) -> ProviderAnswer:
        """``chat`` answered whole by ``target``; ``watch`` (api/http.DisconnectWatch, or None) makes the client's
        going away end the call (CallAbandoned)."""
        tracing = self.span(target, False)
        if tracing is None:
            return await self._whole(chat, target, watch)
        with tracing as span:
            result = await self._whole(chat, target, watch)
            if span is not None:
                span.set_attributes(_usage_attributes(result.usage))
            return result

    async def _whole(self, chat: ChatRequest, target: Target, watch: Any) -> ProviderAnswer:
        result = await self._exchange(target, lambda provider, secret: provider.call(chat, target, False, secret),
                                      lambda provider, body: provider.answer(body), watch)
        self._count_tokens(target, result.usage)
        return result

    async def embeddings(self, body: "dict[str, Any]", target: Target) -> "tuple[list[Any], int]":
        """An embeddings request (OpenAI's body) answered by ``target``: the answer's ``data`` (as OpenAI shapes it)
        and the prompt tokens it counted; ProviderError as for a chat call."""
        request = {**body, "model": target.model}
        data, tokens = await self._exchange(
            target, lambda provider, secret: provider.embeddings_call(request, target, secret),
            lambda provider, raw: _embeddings_of(raw, target))
        if tokens:
            self.tokens[(target.name, "prompt")] = self.tokens.get((target.name, "prompt"), 0) + tokens
        return data, tokens

    async def _exchange(self, target: Target, build: "Callable[[Provider, Any], HttpCall]",
                        parse: "Callable[[Provider, bytes], Any]", watch: Any = None) -> Any:
        """One whole request and answer: sent, read within the bounds and the target's time, parsed, counted."""
        started = time.monotonic()
        try:
            # A scope of its own rather than trio.fail_after (a generator-based manager: more per call), which the
            # client's going away cancels too (``watch``).
            with trio.CancelScope(deadline=trio.current_time() + target.timeout_s) as scope:
                if watch is not None:
                    watch.watch(scope)
                try:
                    provider, answer = await self._send(target, build)
                    try:
                        body = await answer.read(self.bounds.answer_bytes_max)
                    finally:
                        await answer.aclose()
                finally:
                    if watch is not None:
                        watch.unwatch(scope)
            if scope.cancelled_caught:
                if watch is not None and watch.gone:
                    raise CallAbandoned()
                raise _timed_out(target)
            result = parse(provider, body)
        except HttpClientError as e:
            self._count(target, SERVER, started)
            raise ProviderError(SERVER, 502, f"the target {target.name}'s answer broke off: {e}") from None
        except ProviderError as e:
            self._count(target, e.kind, started)
            raise
        self._count(target, "ok", started)
        return result

    def stream(self, chat: ChatRequest, target: Target, watch: Any = None, passing: bool = False
               ) -> "ProviderStream":
        """A streamed call (``ProviderStream``); ``watch`` as for ``whole``; ``passing``: its deltas are the
        provider's own events (``Provider.passing_stream``), for a client of the provider's API."""
        return ProviderStream(self, chat, target, watch, passing)

    def _count(self, target: Target, outcome: str, started: float) -> None:
        key = (target.name, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        self.seconds[target.name] = self.seconds.get(target.name, 0.0) + time.monotonic() - started

    def _count_tokens(self, target: Target, usage: Any) -> None:
        for kind, n in (("prompt", usage.prompt_tokens), ("completion", usage.completion_tokens),
                        ("cached", usage.cached_tokens), ("reasoning", usage.reasoning_tokens)):
            if n:
                self.tokens[(target.name, kind)] = self.tokens.get((target.name, kind), 0) + n

    def metric_families(self) -> Iterator[Any]:
        yield counter("smg_provider_requests", "Calls to provider targets, by target and outcome (ok, or the "
                      "failure's kind)", ["target", "outcome"],
                      [([t, o], float(n)) for (t, o), n in sorted(self.outcomes.items())])
        yield counter("smg_provider_request_seconds", "Time spent in calls to provider targets", ["target"],
                      [([t], s) for t, s in sorted(self.seconds.items())])
        yield counter("smg_provider_tokens", "Tokens provider targets counted, by kind (prompt, completion, cached, "
                      "reasoning)", ["target", "kind"],
                      [([t, k], float(n)) for (t, k), n in sorted(self.tokens.items())])


def _usage_attributes(usage: Any) -> dict[str, int]:
    return {"gen_ai.usage.input_tokens": usage.prompt_tokens, "gen_ai.usage.output_tokens": usage.completion_tokens,
            "smg.cached_tokens": usage.cached_tokens}


class ProviderStream:
    """A streamed call: ``async with`` it (its span), then ``relay``, which sends the request and hands on the
    answer's deltas (a ProviderError before the first means the target refused or failed before answering: the
    route may move on); ``end`` after the last."""

    def __init__(self, calls: ProviderCalls, chat: ChatRequest, target: Target, watch: Any = None,
                 passing: bool = False) -> None:
        self._calls = calls
        self._chat = chat
        self.target = target
        self._watch = watch
        self.passing = passing
        self.end: StreamEnd | None = None
        self._answer: Any = None
        self._started = 0.0
        self._span: Any = None  # the span's context manager, entered (with tracing)
        self._span_value: Any = None

    async def __aenter__(self) -> "ProviderStream":
        self._started = time.monotonic()
        span = self._calls.span(self.target, True)
        if span is not None:
            self._span_value = span.__enter__()
            self._span = span
        return self

    async def relay(self, each: "Callable[[list[Delta]], Awaitable[None]]") -> None:
        """Sends the request, then hands ``each`` the deltas of every piece of the answer that completes some, as
        the pieces arrive; no answer within the target's timeout, a gap as long between pieces, and an answer that
        breaks off are ProviderErrors; ``end`` after the last. (A loop with a callback rather than an async
        generator: trio registers each of those for finalization, a cost per stream.)"""
        target, calls = self.target, self._calls
        timeout_s = target.timeout_s
        # Moving a scope's deadline costs a few microseconds (trio re-registers it): a piece moves it only when that
        # gains this much, so a stream of many pieces moves it a few times a second rather than once a token, and
        # a gap is bounded to within 5 % below the timeout.
        slack_s = min(GAP_SLACK_S, timeout_s / 20)
        try:
            # One scope for the whole call, its deadline moved on by the pieces (a scope per piece cost more than
            # the piece's own reading). It covers ``each`` too: a client that stops reading holds the provider's
            # connection no longer than a provider that stops sending would.
            watch = self._watch
            with trio.CancelScope(deadline=trio.current_time() + timeout_s) as gap:
                if watch is not None:  # the client's going away cancels it too
                    watch.watch(gap)
                try:
                    provider, answer = await calls._send(
                        target, lambda provider, secret: provider.call(self._chat, target, True, secret))
                    self._answer = answer
                    reader = provider.passing_stream(self._chat) if self.passing else provider.stream()
                    while True:
                        piece = await answer.next_piece()
                        if piece is None:
                            break
                        deadline = trio.current_time() + timeout_s
                        if deadline - gap.deadline > slack_s:
                            gap.deadline = deadline
                        deltas = reader.feed(piece)
                        if deltas:
                            await each(joined(deltas))
                finally:
                    if watch is not None:
                        watch.unwatch(gap)
            if gap.cancelled_caught:
                if watch is not None and watch.gone:
                    raise CallAbandoned()
                if self._answer is None:
                    raise _timed_out(target)
                raise ProviderError(TIMEOUT, 504, f"the target {target.name} stopped sending for {timeout_s:g} s")
            self.end = reader.finish()
        except HttpClientError as e:
            calls._count(target, SERVER, self._started)
            raise ProviderError(SERVER, 502, f"the target {target.name}'s stream broke off: {e}") from None
        except ProviderError as e:
            calls._count(target, e.kind, self._started)
            raise
        calls._count(target, "ok", self._started)
        calls._count_tokens(target, self.end.usage)

    @property
    def complete(self) -> bool:
        """The provider's whole answer has arrived: the rest of the deltas come without waiting."""
        return self._answer is not None and self._answer.complete

    async def __aexit__(self, *exc: Any) -> None:
        try:
            if self._answer is not None:
                await self._answer.aclose()
        finally:
            span, self._span = self._span, None
            if span is not None:
                if self._span_value is not None and self.end is not None:
                    self._span_value.set_attributes(_usage_attributes(self.end.usage))
                span.__exit__(*exc)


def _timed_out(target: Target) -> ProviderError:
    return ProviderError(TIMEOUT, 504, f"the target {target.name} did not answer within {target.timeout_s:g} s")


def _embeddings_of(raw: bytes, target: Target) -> "tuple[list[Any], int]":
    """An OpenAI embeddings answer's ``data`` and prompt tokens; a 502 when it is not one."""
    try:
        value = orjson.loads(raw)
        data = value["data"]
        tokens = int((value.get("usage") or {}).get("prompt_tokens") or 0)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        data, tokens = None, 0
    if not isinstance(data, list):
        raise ProviderError(SERVER, 502, f"the target {target.name}'s answer is not an embeddings list")
    return data, tokens

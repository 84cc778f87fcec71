"""A request for a routed model (``gateway/providers/routes.py``): its targets tried in order, each a hosted provider
or a pool of the fleet's workers, until one answers; the answer rendered in the client's API as any other.

    answer_routed     the route's loop: a target cooling down is skipped, a pool past its overflow threshold too;
                      an attempt that fails before anything was sent, with a kind the route's ``fallback_on`` names,
                      moves to the next target (counted); any other failure, or the last, is the client's answer
    answer_provider   one provider target's answer in a renderer's shape (``pipeline.ChatRenderer``), whole or
                      streamed, with ``keep`` and ``finish`` as ``pipeline.answer_chat`` takes them (the Responses
                      API stores through them)

A provider's failure is the client's answer in its API's error shape: the provider's status (a 429 with its
retry-after) and message, the target named. A feature the target cannot do is a 400 naming the model and the
feature, before anything is sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
import contextlib
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio

from ..providers import ProviderError, Route, Target, Unsupported
from ..providers.base import CONNECT, CONTEXT_LENGTH, QUOTA, CallAbandoned, wire_of
from ..providers.quotas import take
from ..providers.overflow import saturated
from ..serving.chat import Call, ChatAnswer, ChatRequest
from ..serving.generation import GenerationResult, UsageTally
from .errors import ApiError, BadRequest, TooManyRequests, UpstreamError, UpstreamTimeout
from .http import SSE_HEADERS, Request
from .pipeline import end_sse, model_not_found, send_whole
from .ratelimits import NOTHING_TO_CHECK, rate_limited
from .state import GatewayState


def route_of(state: GatewayState, model: str, request: Request) -> Route | None:
    """The route a request's model names, if one does; a tenant the route does not allow is told the model does
    not exist (as for any model it may not use)."""
    providers = getattr(state, "providers", None)
    route = providers.route(model) if providers is not None else None
    if route is not None and not (route.allows(request.principal.tenant) and request.principal.may_use(model)):
        raise model_not_found(state, model, request.principal)
    return route


def pool_body(raw: bytes, body: "dict[str, Any]", model: str, pool: str) -> bytes:
    """A routed request's body as a pool target's workers get it: the pool's own model named in it (the body as it
    came when the route and the pool share the name)."""
    return raw if pool == model else orjson.dumps({**body, "model": pool})


async def answer_routed(state: GatewayState, request: Request, route: Route,
                        pool: Callable[[str], Awaitable[None]],
                        provider: Callable[[Target], Awaitable[None]],
                        prompt_chars: int = 0) -> None:
    """Try ``route``'s targets in order: ``pool(model)`` runs the fleet's path for a pool target, ``provider(target)``
    a provider's. ``prompt_chars``: the prompt's size, to skip targets whose stated window cannot hold it."""
    providers = state.providers
    last: ApiError | None = None
    tried = 0
    for entry in providers.plan(route):
        target = entry.target
        if target is not None:
            now = providers.now()
            if not providers.cooldowns.available(entry.name, now):
                providers.count(route, entry, "cooling")
                continue
            if target.context_tokens is not None and prompt_chars > target.context_tokens * 4:  # surely too long
                providers.count(route, entry, "context")
                continue
            probing = providers.cooldowns.probe(entry.name, now)
        else:
            probing = False
            if route.overflow is not None and saturated(
                    state.registry.candidates(entry.pool, trio.current_time()), route.overflow):
                providers.count(route, entry, "overflow")
                continue
        tried += 1
        request.target = entry.name
        request.route = route.name
        judged = False  # the attempt said something of the target (it answered, or failed as the target fails)
        try:
            if target is not None:
                await provider(target)
            else:
                await pool(entry.pool)
            judged = True
        except ProviderError as e:
            if e.kind == QUOTA:  # past the account's quota: not sent, the next target answers
                providers.count(route, entry, "quota")
                last = provider_api_error(e, route.name, target)
                continue
            judged = True
            providers.failed(entry, e.kind, e.retry_after_s)
            error = provider_api_error(e, route.name, target)
            if request.response_started or e.kind not in route.fallback_on:
                raise error from None
            providers.count(route, entry, "fallback")
            last = error
            continue
        except ApiError as e:
            if target is None and not request.response_started and _pool_failure(e) in route.fallback_on:
                providers.count(route, entry, "fallback")
                last = e
                continue
            raise
        finally:
            if probing and not judged:  # not the target's doing (the request's, the client's): another request probes
                providers.cooldowns.release(entry.name)
        providers.succeeded(entry)
        providers.count(route, entry, "answered")
        return
    if last is not None:
        raise last
    raise TooManyRequests(f"every target of the model '{route.name}' is cooling down or full; retry later"
                          if tried == 0 else f"no target of the model '{route.name}' could answer",
                          code="no_target_available", retry_after_s=_soonest(state, route))


def _pool_failure(error: ApiError) -> str:
    """The fallback kind of a pool's failure before its first byte (gateway/api/errors.py's answers to engines)."""
    if error.code in ("engine_unavailable", "no_healthy_worker", "engine_overloaded", "no_decode_worker",
                      "no_prefill_worker", "no_compatible_pd_pair"):
        return "server"
    if error.code in ("engine_timeout", "request_timeout"):
        return "timeout"
    if error.code == "context_length_exceeded":
        return CONTEXT_LENGTH
    # A 429 is the client's own (its rate limits, its tenant's share of the node): another target would refuse it
    # the same way, or let it past its limits.
    return "bad_request"


def _soonest(state: GatewayState, route: Route) -> int:
    now = state.providers.now()
    waits = [state.providers.cooldowns.cooling(e.name, now) for e in route.targets if e.target is not None]
    return max(1, int(min(waits, default=1.0) + 0.999))


def provider_api_error(error: ProviderError, model: str, target: Target | None) -> ApiError:
    """A provider's failure as the client's answer: its status and message, the target named (never its
    credential or URL)."""
    name = target.name if target is not None else "?"
    message = f"the model '{model}' (target {name}) failed: {error.message}"
    retry = int(error.retry_after_s + 0.999) if error.retry_after_s is not None else None
    if error.status == 429:
        return TooManyRequests(message, code=error.code or "rate_limited", retry_after_s=retry or 1)
    if error.kind == "timeout":
        return UpstreamTimeout(message, code="provider_timeout")
    if error.kind == CONTEXT_LENGTH:
        return BadRequest(message, code="context_length_exceeded", param="messages")
    if 400 <= error.status < 500:
        answer = ApiError(message, code=error.code or error.kind)
        answer.status = error.status
        answer.error_type = "invalid_request_error"
        return answer
    answer = UpstreamError(message, code=error.code or f"provider_{error.kind}", retry_after_s=retry)
    answer.status = error.status if 500 <= error.status < 600 else 502
    return answer


def account_quota(state: GatewayState, target: Target, estimate: int, usage: UsageTally
                  ) -> "contextlib.AbstractAsyncContextManager[None]":
    """The target's account quota (if it has one) charged ``estimate`` tokens before the call, refused with the
    quota's 429 when spent, and settled with what ``usage`` counted once the call is over, however it ended; a
    call that found no connection gives its request back."""
    quota = state.providers.quota(target.name)
    if quota is None or state.rate_limiter is None:
        return NOTHING_TO_CHECK
    return _account_quota(state, target, estimate, usage, quota)


@asynccontextmanager
async def _account_quota(state: GatewayState, target: Target, estimate: int, usage: UsageTally, quota: Any
                         ) -> AsyncIterator[None]:
    verdict = await take(state.rate_limiter, quota, estimate)
    if not verdict.allowed:
        raise quota_refused(verdict, target)
    sent = True
    try:
        yield
    except ProviderError as e:
        sent = e.kind != CONNECT  # no connection: the provider never saw it, the account's minute did not count it
        raise
    finally:
        state.rate_limiter.settle(verdict, usage.total())
        if not sent:
            state.rate_limiter.refund_requests(verdict)


def quota_refused(verdict: Any, target: Target) -> ProviderError:
    """A target's account quota refusing a request: the route moves to its next target."""
    wait = verdict.denied_by.decision.retry_after_s
    return ProviderError(QUOTA, 429, f"the account's quota of target {target.name} is used up for now",
                         wait if wait < float("inf") else None, "quota_exceeded")


def unsupported(e: Unsupported, model: str, target: Target) -> BadRequest:
    return BadRequest(f"the model '{model}' (target {target.name}, {target.provider}) does not support {e.feature}",
                      param=e.param, code="unsupported_feature")


def _result(answer_text: str, finish_reason: str, usage: Any, target: Target,
            stop_sequence: str | None = None) -> GenerationResult:
    return GenerationResult(text=answer_text, output_ids=[], finish_reason=finish_reason,
                            matched_stop=stop_sequence, prompt_tokens=usage.prompt_tokens,
                            completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens,
                            worker_id=target.name)


def usage_of(tally: UsageTally, usage: Any) -> None:
    """A provider's usage (OpenAI's meaning: cached of the prompt, reasoning of the completion) into the tally."""
    tally.prompt_tokens, tally.completion_tokens = usage.prompt_tokens, usage.completion_tokens
    tally.cached_tokens, tally.reasoning_tokens = usage.cached_tokens, usage.reasoning_tokens


def _estimate_tokens(chat: ChatRequest) -> int:
    """The tokens a provider request may use, for the rate limits' reservation (settled with the real usage):
    ~4 characters a token of its messages (OpenAI's rule of thumb), and its max_tokens for each of its n answers."""
    size = len(orjson.dumps(chat.messages)) + (len(orjson.dumps(chat.tools)) if chat.tools else 0)
    return max(1, size // 4) + (chat.sampling.max_tokens or 0) * chat.sampling.n


async def answer_provider(state: GatewayState, request: Request, chat: ChatRequest, target: Target, model: str,
                          renderer: Any, keep: "Callable[[dict[str, Any]], Awaitable[bytes | None]] | None" = None,
                          finish: "Callable[[], Awaitable[bytes]] | None" = None) -> None:
    """``chat`` answered by ``target`` in ``renderer``'s shape (the module's docstring); ``model``: the route's
    public name, which the client's answer and the rate limits carry."""
    try:
        wire = wire_of(target)
        # A client of the provider's own API gets the provider's answer as it wrote it (Provider.relays).
        passing = wire.relays == renderer.api
        if passing:
            wire.check_relayed(chat, target)
        else:
            wire.check(chat, target)
        await _answer_provider(state, request, chat, target, model, renderer, keep, finish, passing)
    except Unsupported as e:  # from the check, or from building the call (an image a wire cannot carry)
        raise unsupported(e, model, target) from None


async def _answer_provider(state: GatewayState, request: Request, chat: ChatRequest, target: Target, model: str,
                           renderer: Any, keep: "Callable[[dict[str, Any]], Awaitable[bytes | None]] | None",
                           finish: "Callable[[], Awaitable[bytes]] | None", passing: bool) -> None:
    usage = request.usage = UsageTally()  # this attempt's: what the answer's cost is counted from (gateway/spend)
    request.model = model
    estimate = _estimate_tokens(chat)
    async with account_quota(state, target, estimate, usage):
        await _call_provider(state, request, chat, target, model, renderer, keep, finish, usage, estimate, passing)


async def _call_provider(state: GatewayState, request: Request, chat: ChatRequest, target: Target, model: str,
                         renderer: Any, keep: "Callable[[dict[str, Any]], Awaitable[bytes | None]] | None",
                         finish: "Callable[[], Awaitable[bytes]] | None", usage: UsageTally, estimate: int,
                         passing: bool) -> None:
    async with rate_limited(state, request, model, usage, estimate, prompt_tokens=estimate - (
            chat.sampling.max_tokens or 0) * chat.sampling.n), state.admission.slot(request.tenant_key):
        calls = state.providers.calls
        # The call's own scope (its timeout) is the one a disconnect cancels: one scope, not a second around it.
        watch = request.disconnect_watch()
        if not chat.stream:
            try:
                answer = await calls.whole(chat, target, watch)
            except CallAbandoned:
                return  # the client went away: nothing to answer
            usage_of(usage, answer.usage)
            result = _result(answer.content or "", answer.finish_reason, answer.usage, target, answer.stop_sequence)
            state.count_tokens(model, result)
            if passing and answer.passed is not None:  # (a renderer of an API some wire relays: passed_whole)
                await send_whole(request, renderer.passed_whole(answer.passed), keep)
                return
            await send_whole(request, renderer.whole(ChatAnswer(
                result, answer.finish_reason, bool(answer.calls), answer.usage.reasoning_tokens, answer.content,
                answer.reasoning, tuple(answer.calls), separates_reasoning=answer.reasoning is not None,
                reasoning_signature=answer.reasoning_signature, thinking_blocks=answer.thinking_blocks)), keep)
            return
        try:
            await _stream(state, request, calls.stream(chat, target, watch, passing), model, renderer, usage,
                          finish)
        except CallAbandoned:
            return


async def _stream(state: GatewayState, request: Request, stream: Any, model: str, renderer: Any, usage: UsageTally,
                  finish: "Callable[[], Awaitable[bytes]] | None") -> None:
    """A provider's stream in the renderer's events (or the provider's own, passed on: ``stream.passing``): the
    head with the first deltas (a failure before them is the route's to fall back from), the last deltas and the
    end after."""
    passing = stream.passing
    started = False
    error: ApiError | None = None
    called = False
    held: list[bytes] = []  # events made once the whole answer was in: they go out with the end, in one write

    async def each(deltas: "list[Any]") -> None:
        nonlocal started, called
        if passing:
            events = renderer.passed(deltas[0])  # (a passing reader's piece is one Passed)
        else:
            if not called:
                for delta in deltas:
                    if type(delta) is Call:
                        called = True
            events = renderer.delta_events(deltas, not started)
        started = True
        if stream.complete:
            held.append(events)
            return
        if not request.response_started:
            await request.start_stream(200, SSE_HEADERS)
        await request.send_chunk(b"".join(held) + events if held else events)
        held.clear()

    async with stream:
        try:
            await stream.relay(each)
        except ProviderError as e:
            if not request.response_started:
                raise
            error = provider_api_error(e, model, stream.target)
        if request.disconnected:
            return
        end = b"".join(held)
        if not started:
            end = renderer.delta_events([], True)
        if not request.response_started:
            await request.start_stream(200, SSE_HEADERS)
        if error is None:
            last = stream.end
            usage_of(usage, last.usage)
            called = called or any(type(d) is Call for d in last.deltas)
            result = _result("", last.finish_reason, last.usage, stream.target, last.stop_sequence)
            state.count_tokens(model, result)
            if not passing:  # (a passed stream's end was the provider's own)
                end += renderer.final_events(last.deltas, ChatAnswer(result, last.finish_reason, called,
                                                                     last.usage.reasoning_tokens))
        await end_sse(request, end, error, finish, renderer.error_event, renderer.done)


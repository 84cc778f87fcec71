"""The response cache at the HTTP boundary (gateway/cache): a cacheable request answered from the cluster's cache
when an equal one was answered before, else answered as usual and its answer kept.

Chat completions, completions and Anthropic Messages, streamed or not. A hit is replayed as the answer was sent
(the same bytes: a stream's events, whole) with ``x-smg-cache: hit``; it counts as one request against the
caller's rate limits, costs what ``--response-cache-hit-price`` says, and never reaches an engine or a provider.
A miss is answered by the usual path with ``x-smg-cache: miss``, and kept only when it ended well: a 200 whole,
or a stream that ended as streams end (OpenAI's ``[DONE]``, Anthropic's ``message_stop``) with no error event in
it, its client still there. An answer of a model the caller may not use is never served: the usual path says so.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..cache import Entry, cache_key, cacheable
from ..serving.generation import UsageTally
from .http import SSE_HEADERS, Request
from .ratelimits import counted_write
from .state import GatewayState

# The routes the cache answers, and the API each is (the key's first part).
CACHED_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/messages": "messages"}


async def answer_cached(state: GatewayState, request: Request, api: str, handler: Any) -> None:
    cache = state.cache
    raw = await request.body()  # kept by the request: the handler reads it again
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not request.principal.may_use(model):
        await handler(state, request)  # says what is wrong with it
        return
    providers = getattr(state, "providers", None)
    route = providers.route(model) if providers is not None else None
    if route is not None and not route.allows(request.principal.tenant):
        await handler(state, request)
        return
    model_default = route.cache if route is not None else None
    if model_default is False or not cacheable(body, request.header("cache-control"), model_default is True):
        await handler(state, request)
        return
    partition = request.owner
    key = cache_key(api, partition, body)
    tenant = request.principal.tenant
    entry = await cache.lookup(key, partition)
    if entry is not None:
        async with counted_write(state, request):
            request.cache_status = b"hit"
            request.usage = UsageTally(*entry.usage)
            request.model = model
            request.target = "cache"
            if entry.streamed:
                await request.start_stream(200, [(b"content-type", entry.content_type), *SSE_HEADERS[1:]])
                await request.end_stream(entry.body)
            else:
                await request.send_bytes(200, entry.body, [(b"content-type", entry.content_type)])
        cache.count(model, tenant, "hit")
        return
    cache.count(model, tenant, "miss")
    request.cache_status = b"miss"
    recording = request.recording = []
    request.recording_bytes_left = cache.config.entry_bytes_max
    await handler(state, request)
    request.recording = None
    if request.recording_overflowed:
        cache.store.stats.refused_large += 1
        return
    answer = b"".join(recording)
    content_type = request.recorded_type or b""
    streamed = content_type.startswith(b"text/event-stream")
    if request.status != 200 or request.disconnected or not _ended_well(api, answer, streamed):
        return
    usage = request.usage or UsageTally()
    ttl_s = route.cache_ttl_s if route is not None and route.cache_ttl_s is not None else cache.config.ttl_s
    cache.keep(key, Entry(partition, content_type, answer, streamed, (
        usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.reasoning_tokens),
        cache.clock() + ttl_s))
    cache.count(model, tenant, "stored")


def _ended_well(api: str, answer: bytes, streamed: bool) -> bool:
    if not streamed:
        return bool(answer)
    if api == "messages":
        return b"event: message_stop" in answer[-256:] and b"event: error" not in answer
    return answer.rstrip().endswith(b"data: [DONE]") and b'data: {"error"' not in answer

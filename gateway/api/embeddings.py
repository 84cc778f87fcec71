"""POST /v1/embeddings: OpenAI's embeddings API over the engines' ``Embed`` (``gateway/serving/embeddings.py`` says how).

    input            a string, a list of strings, a list of token ids, or a list of lists of token ids
    model            an embedding model (/v1/models lists its tasks: "embed")
    encoding_format  float (default) or base64 (float32 little-endian)
    dimensions       the size to cut each vector to: matryoshka models only, as vLLM allows it
    user             accepted (OpenAI's end-user id); not stored

The answer is OpenAI's list: ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
"model", "usage": {"prompt_tokens", "total_tokens"}}``, in the inputs' order. Strings are tokenized here
with the model's special tokens (as the model's own server does); token ids are checked against the
vocabulary. Refused with a 400 naming the input: an empty input, more inputs or tokens than the node's
bounds, an input longer than the context. Rate limits count the inputs' tokens; the request holds one
admission slot while its inputs are embedded. A model served by OpenAI-compatible HTTP workers is
proxied as it is. A routed model (``gateway/providers/routes.py``) tries its targets in order as chat does: a pool
answers as above, a provider with embeddings (OpenAI, Azure, OpenAI-compatible) is sent the body as it came with
the target's model; a provider without them is a 400 naming the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import trio

from ..providers import Target, Unsupported
from ..providers.base import wire_of
from ..serving.embeddings import EncodedAnswer, dimensions_problem
from ..engine.errors import EngineCallError
from ..serving.generation import UsageTally
from ..serving.models import ModelEntry
from ..routing.policies import RoutingRequest
from ..tokenizer.service import TokenizerService
from .errors import BadRequest, ContextLengthExceeded, from_engine_error
from .http import JSON_HEADERS, Request
from .pipeline import check_prompt_ids, encode_text, ready_model_entry, timeout_error
from .protocol import UINT32_MAX, field, parse_json_body, positive_int
from .ratelimits import rate_limited
from .routed import account_quota, answer_routed, pool_body, route_of, unsupported
from .state import GatewayState

ENCODING_FORMATS = ("float", "base64")
USER_CHARS_MAX = 256


def _inputs(raw: Any, inputs_max: int) -> "list[tuple[str, str | tuple[int, ...]]]":
    """The request's inputs: strings, or token id sequences (OpenAI's four forms), each non-empty, with the name
    errors give it (``input`` for one string or one list of ids, else ``input[i]``)."""
    single = isinstance(raw, str) or (isinstance(raw, list) and raw and all(
        isinstance(t, int) and not isinstance(t, bool) for t in raw))
    if single:
        items: list[Any] = [raw]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise BadRequest("'input' must be a string, a list of strings, a list of token ids or a list of lists of "
                         "token ids, and not empty", param="input", code="invalid_type")
    if len(items) > inputs_max:
        raise BadRequest(f"'input' has {len(items)} entries; at most {inputs_max} in one request",
                         param="input", code="too_many_inputs")
    inputs: list[tuple[str, str | tuple[int, ...]]] = []
    for i, item in enumerate(items):
        where = "input" if single else f"input[{i}]"
        if isinstance(item, str):
            if not item:
                raise BadRequest(f"{where} is an empty string", param=where, code="invalid_value")
            inputs.append((where, item))
        elif isinstance(item, list) and item and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= UINT32_MAX for t in item):
            inputs.append((where, tuple(item)))
        else:
            raise BadRequest(f"{where} must be a non-empty string or a non-empty list of token ids", param=where,
                             code="invalid_type")
    return inputs


async def ids_of_inputs(entry: ModelEntry, tokenizer: TokenizerService,
                  inputs: "list[tuple[str, str | tuple[int, ...]]]", tokens_max: int) -> list[list[int]]:
    """Each input's token ids, each checked against the context, all against the request's token bound."""
    context = entry.max_context_tokens
    all_ids: list[list[int]] = []
    total = 0
    for where, item in inputs:
        if isinstance(item, str):
            ids = await encode_text(entry, tokenizer, item, where)
        else:
            check_prompt_ids(item, entry, where)
            ids = list(item)
        if context and len(ids) > context:  # a pooling prompt needs no room for an output token: all of it fits
            raise ContextLengthExceeded(f"This model's maximum context length is {context} tokens, however you "
                                        f"requested {len(ids)} tokens in {where}. Please reduce your input.",
                                        param=where)
        total += len(ids)
        if total > tokens_max:
            raise BadRequest(f"the inputs hold more than {tokens_max} tokens; send fewer in one request",
                             param="input", code="too_many_tokens")
        all_ids.append(ids)
    return all_ids


async def embeddings(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    body = parse_json_body(raw)
    model = field(body, "model", str)
    encoding_format = field(body, "encoding_format", str, "float")
    if encoding_format not in ENCODING_FORMATS:
        raise BadRequest(f"'encoding_format' must be one of {', '.join(ENCODING_FORMATS)}, got {encoding_format!r}",
                         param="encoding_format", code="invalid_value")
    dimensions = positive_int(body, "dimensions")
    user = field(body, "user", str, None)
    if user is not None and len(user) > USER_CHARS_MAX:
        raise BadRequest(f"'user' is longer than {USER_CHARS_MAX} characters", param="user", code="invalid_value")
    bounds = state.config.embeddings
    inputs = _inputs(body.get("input"), bounds.inputs_max)
    route = route_of(state, model, request)
    if route is None:
        await _embed_on_pool(state, request, raw, model, inputs, dimensions, encoding_format)
        return

    async def on_pool(pool: str) -> None:
        await _embed_on_pool(state, request, pool_body(raw, body, model, pool), pool, inputs, dimensions,
                             encoding_format)

    await answer_routed(state, request, route, on_pool,
                        lambda target: _embed_on_provider(state, request, body, inputs, target, route.name), len(raw))


async def _embed_on_provider(state: GatewayState, request: Request, body: "dict[str, Any]",
                             inputs: "list[tuple[str, str | tuple[int, ...]]]", target: Target, model: str) -> None:
    """The request answered by a provider target: its body sent as it came (the target's model in it), the answer's
    vectors as the provider made them (base64 too), in OpenAI's list with the provider's usage."""
    if not wire_of(target).embeds:
        raise unsupported(Unsupported("embeddings", "model"), model, target)
    # ~4 characters a token (OpenAI's rule of thumb) for the reservation; settled with the provider's count.
    estimate = max(1, sum(len(item) // 4 if isinstance(item, str) else len(item) for _, item in inputs))
    usage = request.usage = UsageTally()
    request.model = model
    async with account_quota(state, target, estimate, usage), \
            rate_limited(state, request, model, usage, estimate), \
            state.admission.slot(request.tenant_key), request.cancel_on_disconnect():
        data, tokens = await state.providers.calls.embeddings(body, target)
        usage.prompt_tokens = tokens
    if request.disconnected:
        return
    metrics = state.metrics
    metrics.child(metrics.tokens, model, "prompt").inc(usage.prompt_tokens)
    await request.send_bytes(200, orjson.dumps({"object": "list", "data": data, "model": target.model, "usage": {
        "prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens}}), JSON_HEADERS)


async def _embed_on_pool(state: GatewayState, request: Request, raw: bytes, model: str,
                         inputs: "list[tuple[str, str | tuple[int, ...]]]", dimensions: int | None,
                         encoding_format: str) -> None:
    """The request answered by the fleet's workers serving ``model`` (an HTTP worker's, relayed as it is)."""
    bounds = state.config.embeddings
    entry = await ready_model_entry(state, model, request.principal)
    if entry.tokenizer is None:  # an OpenAI-compatible HTTP worker's model: relayed as it is
        text = " ".join(item for _, item in inputs if isinstance(item, str))
        routing = RoutingRequest(text=text, routing_key=request.header(state.config.routing_key_header))
        await state.proxy.forward(request, raw, entry.name, "/v1/embeddings", False, routing)
        return
    if entry.adapter is not None:
        raise BadRequest(f"'{entry.name}' is a LoRA adapter: adapters answer generations, not embeddings",
                         param="model", code="model_not_embedding")
    if not entry.embeds:
        raise BadRequest(f"the model '{entry.name}' is a generation model: it does not make embeddings (use an "
                         "embedding model; /v1/models lists each model's tasks)", param="model",
                         code="model_not_embedding")
    if dimensions is not None:
        problem = dimensions_problem(entry.name, entry.matryoshka_dimensions(), dimensions, entry.embedding_size())
        if problem is not None:
            raise BadRequest(problem, param="dimensions", code="unsupported_dimensions")
    answer = EncodedAnswer(state.config.answer_bytes_max, dimensions, encoding_format, len(inputs))
    size = dimensions or entry.embedding_size()
    if size is not None:
        answer.check_floor(size)
    ids = await ids_of_inputs(entry, entry.tokenizer, inputs, bounds.tokens_max)
    total = sum(map(len, ids))
    usage = request.usage = UsageTally(prompt_tokens=total)
    request.model = entry.name
    timeout_s = state.config.admission.request_timeout_s
    async with rate_limited(state, request, entry.name, usage, total), \
            state.admission.slot(request.tenant_key):
        async with request.cancel_on_disconnect():
            with trio.move_on_after(timeout_s or float("inf")) as deadline:
                await embed_all(state, entry.name, ids, answer.keep, bounds.calls_at_once, timeout_s)
    if request.disconnected:
        return
    if deadline.cancelled_caught:
        raise timeout_error()
    metrics = state.metrics
    metrics.child(metrics.tokens, entry.name, "prompt").inc(total)
    pieces, size = answer.body({"model": entry.name, "usage": {"prompt_tokens": total, "total_tokens": total}})
    await request.send_pieces(200, pieces, size, JSON_HEADERS)


async def embed_all(state: GatewayState, model: str, ids: "list[list[int]]", keep: Callable[[int, Any], None],
                     at_once: int, timeout_s: float | None) -> None:
    """Every input's vector to ``keep`` (with its index), at most ``at_once`` engine calls in flight; the first
    failure (after its retries, or ``keep``'s refusal) ends the others and is the answer."""
    limiter = trio.CapacityLimiter(at_once)
    failures: list[Exception] = []

    async def one(index: int, nursery: trio.Nursery) -> None:
        async with limiter:
            try:
                answer = await state.generator.embed(model, ids[index], state.new_engine_request_id(), timeout_s)
            except EngineCallError as e:  # mapped here, where the model is known: the answer names it
                failures.append(from_engine_error(e, model))
            except Exception as e:  # no worker for it, a core error: the request's answer
                failures.append(e)
            else:
                try:
                    keep(index, answer.vector)
                    return
                except Exception as e:  # past the answer's bound
                    failures.append(e)
        nursery.cancel_scope.cancel()  # one input's failure is the request's: the others stop

    async with trio.open_nursery() as nursery:
        for index in range(len(ids)):
            nursery.start_soon(one, index, nursery)
    if failures:
        raise failures[0]

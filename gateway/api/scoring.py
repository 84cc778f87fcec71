"""POST /v1/score and /v1/rerank (also /score, /rerank, /v2/rerank, as vLLM serves them) over an embedding model.

    /v1/score    model; the pairs as ``queries`` and ``documents`` (or vLLM's other spellings: ``queries`` and
                 ``items``, ``data_1`` and ``data_2``, ``text_1`` and ``text_2``), each a string or a list of strings:
                 one query against every document, or as many queries as documents, pairwise
                 -> {"id", "object": "list", "created", "model", "data": [{"index", "object": "score", "score"}],
                     "usage": {"prompt_tokens", "total_tokens", "completion_tokens": 0}}
    /v1/rerank   model, ``query`` (a string), ``documents`` (strings, or Cohere's {"text": ...} objects), ``top_n``
                 (0 or absent: every document), ``return_documents`` (Cohere's; default true)
                 -> {"id", "model", "usage": {"prompt_tokens", "total_tokens"},
                     "results": [{"index", "document": {"text"}, "relevance_score"}]} from the most relevant

Scores are the cosine similarities of the engines' vectors (gateway/serving/scoring.py says how, as vLLM's own
server computes them for an embedding model); every text is embedded once, tokenized here with the model's
special tokens, bounded as /v1/embeddings' inputs (count, tokens, context), and the usage counts each text's
tokens once. A generation model is refused with a 400 (vLLM's cross-encoder and classifier models cannot be served
over the gRPC contract: its Embed asks the engine for an embedding, which a sequence-classification model has not;
docs/operations.md says so). A model of OpenAI-compatible HTTP workers is relayed as it is; a routed model's pool
targets answer as above, its provider targets are refused (no provider wire scores).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import trio

from ..base.ids import new_id
from ..providers import Target, Unsupported
from ..routing.policies import RoutingRequest
from ..serving.generation import UsageTally
from ..serving.scoring import pair_scores, pairs_problem, ranked
from .embeddings import embed_all, ids_of_inputs
from .errors import BadRequest
from .http import JSON_HEADERS, Request
from .pipeline import ready_model_entry, timeout_error
from .protocol import field, parse_json_body, positive_int
from .ratelimits import rate_limited
from .routed import answer_routed, pool_body, route_of, unsupported
from .state import GatewayState

# vLLM's spellings of a score request's two sides, in the order it tries them.
SCORE_SIDES = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))
# Pairs scored on the event loop: ~5 us each for 1,024 values; more go to a thread so that a 2,048-document rerank
# does not hold the loop for ~10 ms.
SCORES_INLINE_MAX = 64
# Fields vLLM takes that change which tokens are scored; refused rather than ignored (a silently different score).
UNSUPPORTED_FIELDS = ("truncate_prompt_tokens", "max_tokens_per_query", "max_tokens_per_doc", "instruction",
                      "chat_template_kwargs")


def _texts(value: Any, name: str, allow_objects: bool = False) -> "list[str]":
    """A side of the pairs: a string or a list of strings (Cohere's {"text": ...} objects too when allowed)."""
    items = value if isinstance(value, list) else [value]
    texts: list[str] = []
    for i, item in enumerate(items):
        where = name if not isinstance(value, list) else f"{name}[{i}]"
        if allow_objects and isinstance(item, dict) and isinstance(item.get("text"), str):
            item = item["text"]
        if not isinstance(item, str):
            kinds = "a string or an object with a 'text' string" if allow_objects else "a string"
            raise BadRequest(f"{where} must be {kinds} (images are not scored here)", param=where,
                             code="invalid_type")
        if not item:
            raise BadRequest(f"{where} is an empty string", param=where, code="invalid_value")
        texts.append(item)
    return texts


def _refuse_unsupported(body: "dict[str, Any]") -> None:
    for name in UNSUPPORTED_FIELDS:
        if body.get(name) not in (None, 0, {}):
            raise BadRequest(f"'{name}' is not supported here: the texts are scored whole", param=name,
                             code="unsupported_parameter")


async def score(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    body = parse_json_body(raw)
    model = field(body, "model", str)
    _refuse_unsupported(body)
    sides = next(((a, b) for a, b in SCORE_SIDES if a in body and b in body), None)
    if sides is None:
        raise BadRequest("a score request names its pairs as 'queries' and 'documents' (or 'text_1' and 'text_2')",
                         param="queries", code="missing_required_parameter")
    queries, documents = _texts(body[sides[0]], sides[0]), _texts(body[sides[1]], sides[1])

    def answer(scores: "list[float]", tokens: int, model_name: str) -> bytes:
        return orjson.dumps({"id": new_id("score"), "object": "list", "created": int(time.time()), "model": model_name,
                             "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})

    await _scored(state, request, raw, body, model, queries, documents, sides, "/v1/score", answer)


async def rerank(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    body = parse_json_body(raw)
    model = field(body, "model", str)
    _refuse_unsupported(body)
    query = field(body, "query", str)
    if not query:
        raise BadRequest("'query' is an empty string", param="query", code="invalid_value")
    documents = _texts(field(body, "documents", (str, list)), "documents", allow_objects=True)
    top_n = positive_int(body, "top_n", 0, minimum=0)
    with_documents = field(body, "return_documents", bool, True)

    def answer(scores: "list[float]", tokens: int, model_name: str) -> bytes:
        results = []
        for i in ranked(scores, top_n):
            result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if with_documents:
                result["document"] = {"text": documents[i]}
            results.append(result)
        return orjson.dumps({"id": new_id("rerank"), "model": model_name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results})

    await _scored(state, request, raw, body, model, [query], documents, ("query", "documents"), "/v1/rerank", answer)


async def _scored(state: GatewayState, request: Request, raw: bytes, body: "dict[str, Any]", model: str,
                  queries: "list[str]", documents: "list[str]", params: "tuple[str, str]", path: str,
                  answer: Any) -> None:
    """Either API's pairs scored and answered by ``answer(scores, tokens, model)``; ``params``: the names of the
    request's two sides, for errors."""
    documents_param = params[1]
    problem = pairs_problem(len(queries), len(documents))
    if problem is not None:
        raise BadRequest(problem, param=documents_param, code="invalid_value")
    bounds = state.config.embeddings
    if len(queries) + len(documents) > bounds.inputs_max:
        raise BadRequest(f"{len(queries) + len(documents)} texts to embed; at most {bounds.inputs_max} in one "
                         "request", param=documents_param, code="too_many_inputs")
    route = route_of(state, model, request)
    if route is None:
        await _on_pool(state, request, raw, model, queries, documents, params, path, answer)
        return

    async def on_pool(pool: str) -> None:
        await _on_pool(state, request, pool_body(raw, body, model, pool), pool, queries, documents, params, path,
                       answer)

    async def on_provider(target: Target) -> None:
        raise unsupported(Unsupported("scoring", "model"), route.name, target)

    await answer_routed(state, request, route, on_pool, on_provider, len(raw))


async def _on_pool(state: GatewayState, request: Request, raw: bytes, model: str, queries: "list[str]",
                   documents: "list[str]", params: "tuple[str, str]", path: str, answer: Any) -> None:
    entry = await ready_model_entry(state, model, request.principal)
    if entry.tokenizer is None:  # an OpenAI-compatible HTTP worker's model: relayed as it is
        routing = RoutingRequest(text=" ".join(queries[:1]), routing_key=request.header(
            state.config.routing_key_header))
        await state.proxy.forward(request, raw, entry.name, path, False, routing)
        return
    if not entry.embeds or entry.adapter is not None:
        raise BadRequest(f"the model '{entry.name}' is a generation model: scores come from an embedding model's "
                         "vectors (/v1/models lists each model's tasks)", param="model", code="model_not_embedding")
    texts = [*queries, *documents]
    where = [*(f"{params[0]}[{i}]" for i in range(len(queries))), *(f"{params[1]}[{i}]" for i in range(len(documents)))]
    ids = await ids_of_inputs(entry, entry.tokenizer, list(zip(where, texts)), state.config.embeddings.tokens_max)
    total = sum(map(len, ids))
    usage = request.usage = UsageTally(prompt_tokens=total)
    request.model = entry.name
    vectors: list[Any] = [None] * len(ids)
    timeout_s = state.config.admission.request_timeout_s
    async with rate_limited(state, request, entry.name, usage, total), state.admission.slot(request.tenant_key):
        async with request.cancel_on_disconnect():
            with trio.move_on_after(timeout_s or float("inf")) as deadline:
                await embed_all(state, entry.name, ids, vectors.__setitem__, state.config.embeddings.calls_at_once,
                                timeout_s)
    if request.disconnected:
        return
    if deadline.cancelled_caught:
        raise timeout_error()
    of_queries, of_documents = vectors[:len(queries)], vectors[len(queries):]
    scores = await trio.to_thread.run_sync(pair_scores, of_queries, of_documents) \
        if len(documents) > SCORES_INLINE_MAX else pair_scores(of_queries, of_documents)
    metrics = state.metrics
    metrics.child(metrics.tokens, entry.name, "prompt").inc(total)
    await request.send_bytes(200, answer(scores, total, entry.name), JSON_HEADERS)

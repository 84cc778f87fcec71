"""POST /v1/classify and /classify: a sequence-classification model's labels and probabilities for each input, as vLLM's
own server answers them (at /classify: vLLM 0.32 serves no /v1/classify; the node answers to both names).

Served by OpenAI-compatible HTTP workers (vLLM's own server in front of a classifier), relayed as they are, so a
fleet can put its classifiers behind the node beside its embedders and generators. A model of gRPC engines is a 400
saying why: the contract cannot ask an engine for a classification (vLLM's servicer's Embed runs
``PoolingParams(task="embed")``, which a classification model has not; docs/apis.md), and an answer computed
otherwise (an embedding's vector) would not be the model's labels. A routed model's provider targets are refused
too (no provider wire classifies).
"""

from __future__ import annotations

from typing import Any

from ..providers import Target, Unsupported
from ..routing.policies import RoutingRequest
from .errors import BadRequest
from .http import Request
from .pipeline import ready_model_entry
from .protocol import field, parse_json_body
from .routed import answer_routed, pool_body, route_of, unsupported
from .state import GatewayState

PATH = "/classify"  # where vLLM's server answers (0.32: not under /v1)


async def classify(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    body = parse_json_body(raw)
    model = field(body, "model", str)
    text = _routing_text(body.get("input"))
    route = route_of(state, model, request)
    if route is None:
        await _on_pool(state, request, raw, model, text)
        return

    async def on_provider(target: Target) -> None:
        raise unsupported(Unsupported("classification", "model"), route.name, target)

    async def on_pool(pool: str) -> None:
        await _on_pool(state, request, pool_body(raw, body, model, pool), pool, text)

    await answer_routed(state, request, route, on_pool, on_provider, len(raw))


def _routing_text(value: Any) -> str:
    """What a prefix-aware policy routes by: the first input when it is text (vLLM takes a string or a list)."""
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, str) else ""


async def _on_pool(state: GatewayState, request: Request, raw: bytes, model: str, text: str) -> None:
    entry = await ready_model_entry(state, model, request.principal)
    if entry.tokenizer is not None:  # a model of gRPC engines
        raise BadRequest(f"the model '{entry.name}' is served by gRPC engines, which cannot be asked for a "
                         "classification (their contract's Embed asks for an embedding); serve a classifier as an "
                         "OpenAI-compatible HTTP worker (vLLM's own server) and /v1/classify is relayed to it",
                         param="model", code="classification_not_supported")
    routing = RoutingRequest(text=text, routing_key=request.header(state.config.routing_key_header))
    await state.proxy.forward(request, raw, entry.name, PATH, False, routing)

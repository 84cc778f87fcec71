"""Hosted providers beside the fleet: one module per wire format (``PROVIDERS``), models as routes with ordered
targets, fallbacks and cooldowns, the calls made with the node's own HTTP client.

    base.py         what a provider is (request built, answer and stream read, errors kinded), ``PROVIDERS``
    openai.py       OpenAI's chat completions wire: openai, azure, openai_compatible
    openai_responses.py  the same three on OpenAI's Responses API (a target's api = "responses")
    anthropic.py    Anthropic's Messages wire
    gemini.py       Google Gemini's generateContent wire
    bedrock.py      AWS Bedrock's Converse wire, SigV4-signed
    eventstream.py  AWS's binary event stream, read as it arrives
    sse.py          server-sent events, read as they arrive, bounded
    credentials.py  credentials by reference (env:, file:, aws), resolved when a call is made
    routes.py       the models config: targets, routes, fallback kinds, quotas, overflow
    cooldowns.py    which targets cool down, and the probe that ends a cooldown
    dispatch.py     one call to one target: sent, read within its bounds and time, counted
    service.py      the routes in use, their reload, what each route did
    subsystem.py    the node's registration

The front APIs reach them through ``gateway/api/routed.py``.
"""

from . import anthropic, bedrock, gemini, openai, openai_responses  # noqa: F401  (each registers its wire formats)
from .base import PROVIDERS, ProviderAnswer, ProviderError, StreamEnd, Target, Unsupported, Usage
from .routes import Route, Routes, RouteTarget, RoutesError

__all__ = ["PROVIDERS", "ProviderAnswer", "ProviderError", "Route", "RouteTarget", "Routes", "RoutesError",
           "StreamEnd", "Target", "Unsupported", "Usage"]

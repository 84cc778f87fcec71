"""Which requests the response cache may answer, and the key two equal requests share. No I/O.

A request is cacheable when it asks for an answer that does not depend on chance: ``temperature`` 0, or a
``seed``; or when it opts in (``"cache": true`` in its body, the OpenAI SDK's ``extra_body``), or its model's route
says ``cache = true`` (gateway/providers/routes.py). It is never cached when it opts out (``"cache": false``, or
``Cache-Control: no-cache`` / ``no-store``).

Two requests share a key when they ask the same thing: the same API, the same caller's partition (its tenant, else
its key: an answer is never served across tenants), and the same body once normalized: key order does not matter,
fields that do not change the answer (``user``, ``metadata``, ``store``, the ``cache`` extension itself) are left
out, sampling fields equal to their defaults are left out, and numbers are compared as numbers (``0`` is ``0.0``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

APIS = ("chat", "completions", "messages")
# Fields that do not change what the model answers.
_IGNORED = frozenset({"user", "metadata", "store", "cache", "service_tier", "prompt_cache_key", "safety_identifier"})
# Sampling fields at their default: the same request whether sent or not.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "chat": {"n": 1, "temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
             "stream": False, "logprobs": False, "echo": False},
    "completions": {"n": 1, "temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                    "stream": False, "echo": False, "best_of": 1},
    "messages": {"temperature": 1.0, "stream": False},
}
_NUMBERS = frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"})


def cacheable(body: dict[str, Any], cache_control: str | None, model_default: bool) -> bool:
    """Whether the response cache may answer (and keep the answer of) this request."""
    opted = body.get("cache")
    if opted is False or (cache_control is not None and ("no-cache" in cache_control or "no-store" in cache_control)):
        return False
    if opted is True or model_default:
        return True
    temperature = body.get("temperature")
    deterministic = (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
                     and temperature == 0)
    seed = body.get("seed")
    return deterministic or (isinstance(seed, int) and not isinstance(seed, bool))


def normalized(api: str, body: dict[str, Any]) -> dict[str, Any]:
    defaults = _DEFAULTS[api]
    out = {}
    for name, value in body.items():
        if name in _IGNORED:
            continue
        if name in _NUMBERS and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
        if name in defaults:
            default = defaults[name]
            if value == default and isinstance(value, bool) == isinstance(default, bool):  # True is not n = 1
                continue
        out[name] = value
    return out


def cache_key(api: str, partition: str, body: dict[str, Any]) -> str:
    """The key of this request's answer: the API, the partition and a digest of the normalized body."""
    canonical = orjson.dumps(normalized(api, body), option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(api.encode() + b"\0" + partition.encode("utf-8", "surrogateescape") + b"\0" + canonical)
    return f"{api}:{digest.hexdigest()}"

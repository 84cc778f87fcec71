"""The gateway: a node's HTTP API, tokenizer, engines, routing, rate limits, and the ``smg-node`` CLI.

What other packages (the chaos harness, deploy tooling) may use is listed here, by the module that
defines it; tests/unit/test_layers.py fails on an import of anything else from outside. Names load
when first used. Inside the gateway each subpackage's ``__init__`` says what it offers the others.

    rate limits          RateLimiter, RateLimitConfig, LimitSet, parse_limit_set, Identity
    the demo tokenizer   default_tokenizer_dir
    ports                port_holder (who holds a port the harness wants)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RateLimiter": "ratelimit", "RateLimitConfig": "ratelimit", "LimitSet": "ratelimit",
    "parse_limit_set": "ratelimit", "Identity": "ratelimit",
    "default_tokenizer_dir": "tokenizer.bundled",
    "port_holder": "node.ports",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gateway.{_EXPORTS[name]}"), name)

"""Which tracer, if any, the current task's request is traced by: a context variable, so that a step deep
in the pipeline (a parser, a store) can open its span without the tracer being handed down to it.

Imports nothing of OpenTelemetry: reading it costs one context-variable lookup when nothing is traced.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any

# Set inside a traced request's task (and the tasks it starts) to the node's Tracing.
CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("smg_tracing", default=None)
_NOTHING = contextlib.nullcontext()


def step(name: str, attributes: "dict[str, Any] | None" = None) -> Any:
    """``with step("parse"):`` a span of the current traced request; nothing when it is not traced."""
    tracing = CURRENT.get()
    return _NOTHING if tracing is None else tracing.span(name, attributes=attributes)

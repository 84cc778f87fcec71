"""Requests between members over the mesh's sealed streams, routed by their first byte.

Each subsystem that answers peers registers its mark once (``register``): the rate limiter
``R`` (``ratelimit/peer.py``), KV sharing ``K`` (``kv_sharing.py``). A frame is the mark then the
subsystem's own payload; the handler gets the payload and returns its answer. A frame with an
unknown mark, or none, is answered empty and counted: a peer of another version, or garbage.

A request made inside a traced client request carries its trace: ``T``, the 55 bytes of a W3C
traceparent, then the frame. The answering node, tracing too, handles the frame in a server span
that is the child of the caller's (``Tracing.peer_span``); a node not tracing handles it as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("gateway.cluster")

Handler = Callable[[bytes], Awaitable[bytes]]
TRACE_MARK = b"T"
TRACEPARENT_BYTES = 55  # "00-" + 32 hex (trace id) + "-" + 16 hex (parent span id) + "-" + 2 hex (flags)


class PeerRequests:
    def __init__(self) -> None:
        self._handlers: dict[int, Handler] = {}
        self.unrouted = 0
        self.tracing: Any = None  # gateway.tracing.tracer.Tracing when this node traces

    def use_tracing(self, tracing: Any) -> None:
        """Trace peers' requests with the node's tracer. Given once at start, after construction: the cluster's state
        is made before the gateway (the mesh needs it to join), the tracer by the gateway's tracing subsystem."""
        self.tracing = tracing

    def register(self, mark: bytes, handler: Handler) -> None:
        if len(mark) != 1:
            raise ValueError("a mark is one byte")
        if mark[0] in self._handlers:
            raise ValueError(f"the mark {mark!r} is taken")
        self._handlers[mark[0]] = handler

    async def handle(self, frame: bytes) -> bytes:
        if frame[:1] == TRACE_MARK:
            traceparent, frame = frame[1:1 + TRACEPARENT_BYTES], frame[1 + TRACEPARENT_BYTES:]
            tracing = self.tracing
            if tracing is not None and frame:
                with tracing.peer_span(traceparent, frame[:1].decode("latin-1")):
                    return await self._route(frame)
        return await self._route(frame)

    async def _route(self, frame: bytes) -> bytes:
        handler = self._handlers.get(frame[0]) if frame else None
        if handler is None:
            self.unrouted += 1
            log.debug("a peer's request with no handler for its mark %r", frame[:1])
            return b""
        return await handler(frame[1:])

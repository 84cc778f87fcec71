"""Requests between members over the mesh's sealed streams, routed by their first byte.

Each subsystem that answers peers registers its mark once (``register``): the rate limiter
``R`` (``ratelimit/peer.py``), KV sharing ``K`` (``kv_sharing.py``). A frame is the mark then the
subsystem's own payload; the handler gets the payload and returns its answer. A frame with an
unknown mark, or none, is answered empty and counted: a peer of another version, or garbage.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("gateway.cluster")

Handler = Callable[[bytes], Awaitable[bytes]]


class PeerRequests:
    def __init__(self) -> None:
        self._handlers: dict[int, Handler] = {}
        self.unrouted = 0

    def register(self, mark: bytes, handler: Handler) -> None:
        if len(mark) != 1:
            raise ValueError("a mark is one byte")
        if mark[0] in self._handlers:
            raise ValueError(f"the mark {mark!r} is taken")
        self._handlers[mark[0]] = handler

    async def handle(self, frame: bytes) -> bytes:
        handler = self._handlers.get(frame[0]) if frame else None
        if handler is None:
            self.unrouted += 1
            log.debug("a peer's request with no handler for its mark %r", frame[:1])
            return b""
        return await handler(frame[1:])

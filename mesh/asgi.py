"""ASGI pieces shared by every HTTP app of the node (the mesh's admin endpoint, the gateway's apps)."""

from __future__ import annotations

from typing import Any


async def answer_lifespan(receive: Any, send: Any) -> None:
    """The ASGI lifespan protocol for apps with nothing to set up (hypercorn requires an answer)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

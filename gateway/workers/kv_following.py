"""When this node follows an engine's KV events: only while routing needs them, and (in a cluster)
only on the engine's ring owners, whose followers forward what they apply to the other nodes.

``kv_events.follow_kv_events`` does the following itself (subscribe, apply, resubscribe);
this module starts and stops it as the conditions change: a second engine serving the same
model joins or leaves, the ring moves, the worker drains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from ..routing.kv_index import KvIndex
from .kv_events import follow_kv_events
from .worker import Worker


async def follow_while_needed(worker: Worker, index: KvIndex, should_follow: Callable[[Worker], bool],
                              announcers: Callable[[], "list[trio.Event]"], on_applied: Any = None) -> None:
    """Follow ``worker``'s KV events into ``index`` whenever ``should_follow(worker)``; re-read it each
    time one of ``announcers()`` (events set on a change, replaced after) fires. Runs until cancelled,
    or until the engine says it has no KV events (UNIMPLEMENTED: never asked again)."""
    with trio.CancelScope() as scope:
        worker.kv_scope = scope
        while not worker.kv_events_unsupported:
            # The events announcing a change are taken before the conditions are read, with no
            # checkpoint between, so no change can slip between a check and the wait.
            waiting_on = announcers()
            if not should_follow(worker):
                await first_set(waiting_on)
                continue
            worker.kv_following = True
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_follow_until_unsupported, worker, index, nursery.cancel_scope, on_applied)
                    while should_follow(worker):
                        await first_set(announcers())
                    nursery.cancel_scope.cancel()
            finally:
                worker.kv_following = False


async def _follow_until_unsupported(worker: Worker, index: KvIndex, done: trio.CancelScope, on_applied: Any) -> None:
    await follow_kv_events(worker, index, on_applied)
    # It returns only when the engine answers UNIMPLEMENTED: never ask again.
    worker.kv_events_unsupported = True
    done.cancel()


async def first_set(events: "list[trio.Event]") -> None:
    """Wait until one of ``events`` is set."""
    async with trio.open_nursery() as nursery:
        async def wait_then_stop(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        for event in events:
            nursery.start_soon(wait_then_stop, event)

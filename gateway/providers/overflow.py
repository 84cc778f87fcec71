"""When a route's pool counts as saturated, so that new requests go to the route's next target instead of waiting
(and come back as soon as the pool has room). No I/O: the workers' loads are what the node already receives
(each engine's ``GetLoads`` polls: requests running and waiting, the KV cache's use).

A pool is saturated when it has workers that can take requests and **every one of them** is past the route's
threshold: ``waiting`` or more requests waiting in its engine (its last poll's count, plus the requests this node
sent it since), or its KV cache used at ``kv_usage`` or more. A worker that has not reported its load (an HTTP
worker; the polls pause on a node that routed nothing for 10 s and resume with its next request) counts as having
room: overflow moves traffic only on evidence. A pool with no worker able to serve is not "saturated": its attempt
fails as it would without a route (503 naming the model), and the route's fallback decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .routes import Overflow


def saturated(workers: "Iterable[Any]", overflow: Overflow) -> bool:
    """Whether every worker of ``workers`` (``gateway/workers/worker.py`` Workers that can take requests now) is past
    ``overflow``'s thresholds."""
    seen = False
    for worker in workers:
        seen = True
        load = worker.engine_load
        if load is None:
            return False
        waiting = load.waiting + max(0, worker.in_flight - worker.in_flight_at_poll)
        full = (overflow.waiting is not None and waiting >= overflow.waiting) or \
            (overflow.kv_usage is not None and load.token_usage >= overflow.kv_usage)
        if not full:
            return False
    return seen

"""A provider account's quota (requests and tokens per minute, ``rpm`` and ``tpm`` of a target in the models config),
held by the whole cluster with the counters the rate limiter already owns by consistent hashing
(``gateway/ratelimit/limiter.py``): each target's counter is decided by its owner on the ring and replicated to the
next owners, so N nodes together admit the account's quota, not N times it.

A request that would pass a target's quota is not sent to it: the route tries its next target instead of earning
the provider's 429 (``gateway/api/routed.py``). Tokens are reserved at the estimate (the prompt's characters / 4
and max_tokens) and settled with the usage the provider reports.

Overshoot: the limiter's bounds, with L the quota per second (rpm / 60), B its burst (a minute's quota: the
provider's own window), S the limiter's sync interval: an owner's crash L*S + B; a partition's side without the
owner (k of N nodes) (k/N)*L*(D + F) + B before detection (D detection, F forward timeout), its share after
(the proportional policy). The provider enforces its own limit besides: an overshoot is a 429 the route falls
back from, never an error the client sees while another target can answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..ratelimit.algorithms import Algorithm, Rate
from ..ratelimit.limits import LimitSpec, Scope, Unit
from .routes import Quota

WINDOW_S = 60.0  # rpm and tpm are per minute, as the providers count them


@dataclasses.dataclass(frozen=True)
class QuotaCounters:
    """The limiter's counters for one target's quota: (spec, key) for its requests and its tokens."""

    requests: "tuple[LimitSpec, str] | None"
    tokens: "tuple[LimitSpec, str] | None"


def counters(target: str, quota: Quota) -> QuotaCounters:
    def counter(unit: Unit, per_minute: int | None, kind: str) -> "tuple[LimitSpec, str] | None":
        if per_minute is None:
            return None
        name = f"provider-quota-{kind}"
        # A sliding window of a minute, the whole minute's quota available at once (the provider's own count).
        rate = Rate(Algorithm.SLIDING_WINDOW, float(per_minute), WINDOW_S, float(per_minute))
        return LimitSpec(name, Scope.GLOBAL, unit, rate), f"{name}:{target}"

    return QuotaCounters(counter(Unit.REQUESTS, quota.requests_per_minute, "rpm"),
                         counter(Unit.TOKENS, quota.tokens_per_minute, "tpm"))


async def take(limiter: Any, quota: QuotaCounters, estimated_tokens: int) -> Any:
    """Reserve one request and ``estimated_tokens`` of the target's quota: the verdict (``allowed``; ``settle`` it
    with the tokens used when the call ends, or give the request back with 0 if it was never sent)."""
    wanted = []
    if quota.requests is not None:
        wanted.append((*quota.requests, 1.0))
    if quota.tokens is not None:
        wanted.append((*quota.tokens, float(max(1, estimated_tokens))))
    return await limiter.check_keys(wanted)

"""Rate limits at the HTTP boundary: check before generating, settle after, OpenAI's headers.

Every answer of a rate-limited request carries, per unit (requests, tokens),
the most restrictive limit that applied: ``x-ratelimit-limit-*``,
``x-ratelimit-remaining-*`` and ``x-ratelimit-reset-*`` (time until the full
allowance is back, as OpenAI writes it: ``20ms``, ``1s``, ``6m0s``). A denied
request gets 429 with an OpenAI error body (``type: rate_limit_error``,
``code: rate_limit_exceeded``) and ``Retry-After`` in whole seconds.

Token limits reserve the prompt plus ``max_tokens`` at admission; when the
request ends (finished, failed, or aborted by a client that went away) the
reservation is replaced by the tokens really used.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator

from ..serving.generation import UsageTally
from ..ratelimit.limiter import KeyOutcome, RateLimiter, Verdict
from ..ratelimit.limits import Unit
from .errors import TooManyRequests
from .http import Request
from .state import GatewayState


def format_reset(seconds: float) -> str:
    """OpenAI's reset format: ``20ms`` below a second, else ``1s``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes >= 1:
        return f"{int(minutes)}m{text}"
    return text


def _tightest(outcomes: list[KeyOutcome], unit: Unit) -> KeyOutcome | None:
    of_unit = [o for o in outcomes if o.spec.unit is unit]
    if not of_unit:
        return None
    return min(of_unit, key=lambda o: (o.decision.allowed, o.decision.remaining))


def rate_limit_headers(verdict: Verdict) -> list[tuple[bytes, bytes]]:
    headers = []
    for unit in Unit:
        outcome = _tightest(verdict.outcomes, unit)
        if outcome is None:
            continue
        d = outcome.decision
        name = unit.value
        headers += [(f"x-ratelimit-limit-{name}".encode(), str(int(outcome.spec.rate.limit)).encode()),
                    (f"x-ratelimit-remaining-{name}".encode(), str(int(d.remaining)).encode()),
                    (f"x-ratelimit-reset-{name}".encode(), format_reset(d.reset_after_s).encode())]
    return headers


def rate_limit_error(verdict: Verdict) -> TooManyRequests:
    denied = verdict.denied_by
    assert denied is not None
    spec, d = denied.spec, denied.decision
    unit = spec.unit.value
    window = format_reset(spec.rate.window_s)
    if verdict.owner_unreachable:
        return TooManyRequests(f"Rate limit '{spec.name}' cannot be checked right now (its owner node is "
                               f"unreachable and the cluster's policy is closed). Please try again shortly.",
                               code="rate_limit_exceeded", retry_after_s=max(1, math.ceil(d.retry_after_s)))
    if math.isinf(d.retry_after_s):
        return TooManyRequests(f"Request too large for rate limit '{spec.name}': it needs {int(denied.hits)} {unit} "
                               f"and the limit allows at most {int(spec.rate.capacity)} {unit} per {window}.",
                               code="rate_limit_exceeded")
    return TooManyRequests(f"Rate limit reached for {unit} (limit '{spec.name}': {int(spec.rate.limit)} {unit} per "
                           f"{window}). Please try again in {format_reset(d.retry_after_s)}.",
                           code="rate_limit_exceeded", retry_after_s=max(1, math.ceil(d.retry_after_s)))


@contextlib.asynccontextmanager
async def rate_limited(limiter: RateLimiter | None, request: Request, model: str | None,
                       usage: UsageTally, estimated_tokens: int) -> AsyncIterator[None]:
    """Admit the request under every limit that applies (or raise 429); settle its tokens when it ends."""
    if limiter is None or not limiter.active:
        yield
        return
    principal = request.principal
    if principal.authenticated:  # keyed by the credential, never by headers the client picks
        identity = limiter.principal_identity(principal.key_id, principal.tenant, model)
    else:
        identity = limiter.identity(request.header("authorization"), request.header(limiter.config.tenant_header),
                                    model)
    verdict = await limiter.check(identity, estimated_tokens)
    request.extra_headers = rate_limit_headers(verdict)
    if not verdict.allowed:
        raise rate_limit_error(verdict)
    try:
        yield
    finally:
        limiter.settle(verdict, usage.total())


def counted_write(state: GatewayState, request: Request) -> contextlib.AbstractAsyncContextManager[None]:
    """A write that stores without generating (a conversation, its items, a deletion, a cancel): one request
    against the caller's limits, no tokens. A denied one changes nothing."""
    return rate_limited(state.rate_limiter, request, None, UsageTally(), 0)


@contextlib.asynccontextmanager
async def counted_tokens(state: GatewayState, request: Request, body_bytes: int, model: str | None,
                         usage: UsageTally) -> AsyncIterator[None]:
    """Work measured in tokens without a generation (tokenize, count_tokens): a request against the caller's
    limits, and its tokens, estimated from the body (OpenAI's 4 bytes a token) before the work and settled
    with ``usage`` (the tokens counted) after. A caller at its limit is refused before any tokenizing."""
    async with rate_limited(state.rate_limiter, request, model, usage, max(1, body_bytes // 4)):
        yield

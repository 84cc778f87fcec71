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
import time
from collections.abc import AsyncIterator
from typing import Any

from ..serving.generation import UsageTally
from ..ratelimit.limiter import KeyOutcome, RateLimiter, Verdict
from ..ratelimit.limits import Unit
from .errors import ApiError, TooManyRequests, Unavailable
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
    for unit in (Unit.REQUESTS, Unit.TOKENS):  # a budget's money has headers of its own (gateway/spend)
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


def checks_anything(limiter: RateLimiter | None, spend: Any) -> bool:
    """Whether a request has limits or budgets to pass (else nothing is asked of anyone)."""
    return (limiter is not None and limiter.active) or (spend is not None and spend.budgets_active)


# What ``rate_limited`` gives when no limit or budget is set: one shared manager that does nothing (a generator-based
# one would cost a generator, its wrapper and trio's async-generator hooks on every request, for nothing).
NOTHING_TO_CHECK = contextlib.nullcontext()


def rate_limited(state: Any, request: Request, model: str | None, usage: UsageTally, estimated_tokens: int,
                 prompt_tokens: int | None = None) -> "contextlib.AbstractAsyncContextManager[None]":
    """Admit the request under every limit and budget that applies (or raise 429); settle its tokens and cost when
    it ends. ``state``: what holds the node's ``rate_limiter`` and ``spend``; ``prompt_tokens``: of the estimate,
    the prompt's (a budget reserves them at the input price, the rest at the output price)."""
    limiter, spend = state.rate_limiter, getattr(state, "spend", None)
    if not checks_anything(limiter, spend):
        return NOTHING_TO_CHECK
    return _rate_limited(request, model, usage, estimated_tokens, prompt_tokens, limiter, spend)


@contextlib.asynccontextmanager
async def _rate_limited(request: Request, model: str | None, usage: UsageTally, estimated_tokens: int,
                        prompt_tokens: int | None, limiter: RateLimiter, spend: Any) -> AsyncIterator[None]:
    principal = request.principal
    if principal.authenticated:  # keyed by the credential, never by headers the client picks
        identity = limiter.principal_identity(principal.key_id, principal.tenant, model)
    else:
        identity = limiter.identity(request.header("authorization"), request.header(limiter.config.tenant_header),
                                    model)
    price = None
    wanted = limiter.wanted(identity, estimated_tokens)
    if spend is not None and spend.budgets_active:
        price = spend.price(model, request.route, request.target)
        if price.free:  # costs nothing: no budget to ask (a stored conversation's write, a free model)
            price = None
        else:
            prompt = estimated_tokens if prompt_tokens is None else prompt_tokens
            wanted += spend.budget_counters(principal, price.estimate_usd(prompt, max(0, estimated_tokens - prompt)))
    verdict = await limiter.check_keys(wanted) if wanted else NOTHING_CHECKED
    request.extra_headers = rate_limit_headers(verdict)
    if price is not None:
        observe_budgets(spend, verdict)
    if not verdict.allowed:
        if verdict.denied_by.spec.unit is Unit.USD:
            raise budget_error(spend, verdict)
        raise rate_limit_error(verdict)
    try:
        yield
    finally:
        cost = 0.0
        if price is not None:
            cost = price.cost_usd(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens,
                                  usage.reasoning_tokens)
        limiter.settle(verdict, usage.total(), cost)


NOTHING_CHECKED = Verdict(True, [])


def observe_budgets(spend: Any, verdict: Verdict) -> None:
    """Each budget's decision: its spend seen here, its thresholds crossed, a budget header."""
    for outcome in verdict.outcomes:
        if outcome.spec.unit is not Unit.USD:
            continue
        budget = spend.budget_of(outcome.spec.name, outcome.key)
        if budget is None:
            continue
        decision = outcome.decision
        spent = max(0.0, decision.limit - decision.remaining)
        spend.observe(budget, spent, outcome.hits if decision.allowed else 0.0)


def budget_error(spend: Any, verdict: Verdict) -> ApiError:
    """A hard budget refusing a request: which budget, what is spent, when it is whole again (429
    budget_exceeded); or that its owner cannot be reached (503 budget_unavailable)."""
    denied = verdict.denied_by
    assert denied is not None
    budget = spend.budget_of(denied.spec.name, denied.key)
    scope = denied.spec.name.removeprefix("budget-")
    who = f"{scope} '{budget.name}'" if budget is not None else scope
    spend.refused[scope] = spend.refused.get(scope, 0) + 1
    if verdict.owner_unreachable:
        return Unavailable(f"The budget of {who} cannot be checked right now (the node that holds it is unreachable)."
                           " Please try again shortly.", code="budget_unavailable", retry_after_s=1)
    d = denied.decision
    spent = max(0.0, d.limit - d.remaining)
    amount = budget.describe() if budget is not None else f"${d.limit:,.2f}"
    if math.isinf(d.retry_after_s):
        return TooManyRequests(f"Request too large for the budget of {who}: it may cost up to ${denied.hits:,.4f} "
                               f"and the budget is {amount}. Lower max_tokens.", code="budget_exceeded")
    resets = ""
    retry = max(1, math.ceil(d.retry_after_s))
    if budget is not None and budget.period != "rolling":
        ends = budget.counter(spend.clock())[2]
        if ends is not None:
            resets = f" It resets at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(ends.ends_s))}."
            retry = max(1, math.ceil(ends.ends_s - spend.clock()))
    error = TooManyRequests(f"Budget exceeded for {who}: {amount}, ${spent:,.4f} spent, and this request may cost "
                            f"up to ${denied.hits:,.4f}.{resets}", code="budget_exceeded", retry_after_s=retry)
    error.error_type = "insufficient_quota"  # OpenAI's type for a spent quota
    return error


def counted_write(state: GatewayState, request: Request) -> contextlib.AbstractAsyncContextManager[None]:
    """A write that stores without generating (a conversation, its items, a deletion, a cancel): one request
    against the caller's limits, no tokens. A denied one changes nothing."""
    return rate_limited(state, request, None, UsageTally(), 0)


@contextlib.asynccontextmanager
async def counted_tokens(state: GatewayState, request: Request, body_bytes: int, model: str | None,
                         usage: UsageTally) -> AsyncIterator[None]:
    """Work measured in tokens without a generation (tokenize, count_tokens): a request against the caller's
    limits, and its tokens, estimated from the body (OpenAI's 4 bytes a token) before the work and settled
    with ``usage`` (the tokens counted) after. A caller at its limit is refused before any tokenizing."""
    async with rate_limited(state, request, model, usage, max(1, body_bytes // 4)):
        yield

"""What is limited: limit specs, the rate-limit config, and the keys a request counts against.

A limit file (TOML, ``--rate-limits FILE``; the same shape as JSON through
``PUT /admin/rate-limits``)::

    failure_policy = "proportional"   # or "open", "closed"

    [[limits]]
    name = "per-key"                  # unique; part of every key it makes
    scope = "api_key"                 # "global", "api_key", "tenant" or "model"
    unit = "requests"                 # or "tokens" (prompt + completion)
    limit = 100                       # units per window
    window_s = 1                      # default 1 second
    burst = 100                       # token bucket capacity; default = limit
    algorithm = "token_bucket"        # or "sliding_window"
    match = "gpt-x"                   # optional: only this model / tenant / key hash
    local_first = false               # answer from a local share, sync hits to the owner

``smg-node serve --global-rate-limit N`` adds ``{name = "global", scope =
"global", unit = "requests", limit = N}``: N requests per second for the whole
cluster, whichever node receives them.

A request's identity: its API key (``Authorization: Bearer ...``, hashed:
keys never leave the node in clear), its tenant (a header, ``x-smg-tenant`` by
default) and its model. Requests without a key count as ``anonymous``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
from typing import Any

from .algorithms import Algorithm, Rate

RATE_LIMITS_SETTING = "rate_limits"  # the name of the cluster-wide setting holding the LimitSet
LIMITS_MAX = 256
NAME_CHARS_MAX = 64
MATCH_CHARS_MAX = 256
IDENTITY_CHARS_MAX = 256  # a tenant header longer than this is cut (it is only a key)


class LimitConfigError(ValueError):
    """A limit file or admin update that cannot be used; the message says which field."""


class Scope(enum.Enum):
    GLOBAL = "global"
    API_KEY = "api_key"
    TENANT = "tenant"
    MODEL = "model"


class Unit(enum.Enum):
    REQUESTS = "requests"
    TOKENS = "tokens"
    USD = "usd"  # a budget's money (gateway/spend/budgets.py); never a rate limit's unit


class FailurePolicy(enum.Enum):
    """What a node does for a key whose owner it cannot reach (see limiter.py for the bounds)."""

    PROPORTIONAL = "proportional"  # admit up to this node's share of the limit
    OPEN = "open"  # admit everything (and count it locally)
    CLOSED = "closed"  # deny


@dataclasses.dataclass(frozen=True)
class LimitSpec:
    name: str
    scope: Scope
    unit: Unit
    rate: Rate
    match: str | None = None
    local_first: bool = False
    # A soft budget's counter: every hit is counted (FORCE), none is refused.
    counts_only: bool = False
    # When the key's owner cannot be reached: this instead of the limit set's policy (a hard budget refuses).
    failure_policy: "FailurePolicy | None" = None

    def key_for(self, identity: "Identity") -> str | None:
        """The counter this limit uses for ``identity``; None when the limit does not apply."""
        if self.scope is Scope.GLOBAL:
            value = "*"
        else:
            value = getattr(identity, self.scope.value)
            if value is None:
                return None
        if self.match is not None and value != self.match:
            return None
        return f"{self.name}:{value}"

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "scope": self.scope.value, "unit": self.unit.value, "limit": self.rate.limit,
               "window_s": self.rate.window_s, "burst": self.rate.burst, "algorithm": self.rate.algorithm.value,
               "local_first": self.local_first}
        if self.match is not None:
            out["match"] = self.match
        return out


@dataclasses.dataclass(frozen=True)
class Identity:
    api_key: str  # a hash of the bearer key, or "anonymous"
    tenant: str | None
    model: str | None

    @staticmethod
    def hash_api_key(authorization: str | None) -> str:
        if not authorization:
            return "anonymous"
        scheme, _, token = authorization.partition(" ")
        secret = token.strip() if scheme.lower() == "bearer" else authorization.strip()
        if not secret:
            return "anonymous"
        return hashlib.blake2b(secret.encode("utf-8", "replace"), digest_size=12).hexdigest()


@dataclasses.dataclass(frozen=True)
class LimitSet:
    """The limits in force, and the policy for unreachable owners. Replaced whole on a change."""

    limits: tuple[LimitSpec, ...] = ()
    failure_policy: FailurePolicy = FailurePolicy.PROPORTIONAL

    def to_dict(self) -> dict[str, Any]:
        return {"failure_policy": self.failure_policy.value, "limits": [spec.to_dict() for spec in self.limits]}

    def with_global_limit(self, requests_per_s: float) -> "LimitSet":
        spec = LimitSpec("global", Scope.GLOBAL, Unit.REQUESTS,
                         Rate(Algorithm.TOKEN_BUCKET, float(requests_per_s), 1.0, float(requests_per_s)))
        return dataclasses.replace(self, limits=(*[s for s in self.limits if s.name != "global"], spec))


def _enum(kind: type[enum.Enum], value: Any, field: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        raise LimitConfigError(f"{field}: {value!r} is not one of {choices}") from None


def _number(raw: dict[str, Any], field: str, where: str, default: float | None = None) -> float:
    value = raw.get(field, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LimitConfigError(f"{where}.{field}: must be a positive number, not {value!r}")
    return float(value)


def parse_limit(raw: Any, where: str) -> LimitSpec:
    if not isinstance(raw, dict):
        raise LimitConfigError(f"{where}: must be a table/object")
    known = {"name", "scope", "unit", "limit", "window_s", "burst", "algorithm", "match", "local_first"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise LimitConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name or len(name) > NAME_CHARS_MAX or ":" in name:
        raise LimitConfigError(f"{where}.name: a non-empty string without ':' of at most {NAME_CHARS_MAX} chars")
    scope = _enum(Scope, raw.get("scope", "global"), f"{where}.scope")
    unit = _enum(Unit, raw.get("unit", "requests"), f"{where}.unit")
    algorithm = _enum(Algorithm, raw.get("algorithm", "token_bucket"), f"{where}.algorithm")
    if algorithm is Algorithm.FIXED_PERIOD:  # a budget's counter: its key names the period, a limit's does not
        raise LimitConfigError(f"{where}.algorithm: fixed_period is a budget's (see budgets), not a rate limit's")
    if unit is Unit.USD:
        raise LimitConfigError(f"{where}.unit: money is limited by budgets, not rate limits")
    limit = _number(raw, "limit", where)
    window_s = _number(raw, "window_s", where, 1.0)
    burst = _number(raw, "burst", where, limit)
    match = raw.get("match")
    if match is not None and (not isinstance(match, str) or len(match) > MATCH_CHARS_MAX):
        raise LimitConfigError(f"{where}.match: a string of at most {MATCH_CHARS_MAX} chars")
    if match is not None and scope is Scope.GLOBAL:
        raise LimitConfigError(f"{where}.match: a global limit matches everything")
    local_first = raw.get("local_first", False)
    if not isinstance(local_first, bool):
        raise LimitConfigError(f"{where}.local_first: true or false")
    return LimitSpec(name, scope, unit, Rate(algorithm, limit, window_s, burst), match, local_first)


def parse_limit_set(raw: Any) -> LimitSet:
    """A ``LimitSet`` from a parsed TOML/JSON document; LimitConfigError says what is wrong."""
    if not isinstance(raw, dict):
        raise LimitConfigError("the rate-limit config must be a table/object")
    unknown = sorted(set(raw) - {"failure_policy", "limits"})
    if unknown:
        raise LimitConfigError(f"unknown field(s) {', '.join(unknown)}")
    policy = _enum(FailurePolicy, raw.get("failure_policy", "proportional"), "failure_policy")
    items = raw.get("limits", [])
    if not isinstance(items, list):
        raise LimitConfigError("limits: must be a list")
    if len(items) > LIMITS_MAX:
        raise LimitConfigError(f"limits: at most {LIMITS_MAX}")
    limits = tuple(parse_limit(item, f"limits[{i}]") for i, item in enumerate(items))
    names = [spec.name for spec in limits]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise LimitConfigError(f"limits: the name {duplicate!r} is used twice")
    return LimitSet(limits, policy)

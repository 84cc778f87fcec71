"""Models as routes: a public model name and the ordered targets that answer it, read from the models config
(``--models-config``: TOML, or YAML for ``.yaml``/``.yml``; re-read on SIGHUP and replaced through
``PUT /admin/models``).

    [targets.sonnet]                       # a provider model, named for metrics, logs, cooldowns and quotas
    provider = "anthropic"                 # a PROVIDERS name: openai, azure, openai_compatible, anthropic, ...
    model = "claude-sonnet-4-5"            # the provider's model id (Azure: the deployment)
    credential = "env:ANTHROPIC_API_KEY"   # a reference, never the key (credentials.py)
    base_url = "https://api.anthropic.com" # optional where the provider has a public one
    timeout_secs = 120                     # a whole answer, or a stream's first byte and each gap after
    context_tokens = 200000                # optional: its window (a longer prompt goes to the next target)
    rpm = 4000                             # optional: the account's quota, held by the whole cluster
    tpm = 400000                           #   (requests and tokens per minute; past it: the next target)
    headers = { "anthropic-beta" = "..." } # optional: sent with every call
    price_usd_per_mtok = { input = 3.0, cached_input = 0.3, output = 15.0 }  # optional (gateway/spend/prices.py)
    # and the provider's own: api_version, auth (azure), region (bedrock), anthropic_version; api = "responses"
    # and reasoning_summary (openai, azure, openai_compatible: OpenAI's Responses API instead of chat completions)

    [models.smart]                         # the public name clients ask for
    targets = [                            # tried by priority (lower first); weights split within a priority
      { target = "sonnet", weight = 3 },
      { target = "gpt", weight = 1 },
      { pool = "Qwen/Qwen3-8B", priority = 1 },   # the fleet's workers serving that model
    ]
    fallback_on = ["connect", "timeout", "server", "rate_limited", "overloaded", "context_length"]  # the default
    tenants = ["team-a"]                   # optional: who may use it (others are told it does not exist)
    overflow = { waiting = 8, kv_usage = 0.95 }   # optional: a pool target past either, on every worker, is
                                                  # skipped for the next target (``overflow.py``)
    price_usd_per_mtok = { input = 0.1, output = 0.4 }  # optional: what its pool targets cost (and targets
                                                        # without a price of their own); zero when unsaid
    cache = true                           # optional, with --response-cache: answer repeats from the cache even
    cache_ttl_secs = 600                   #   when sampled (false: never); how long its answers are kept

A model the config does not name is served as before, by the workers that serve it. A route may name its own pool
(``[models."Qwen/Qwen3-8B"]`` with ``{ pool = "Qwen/Qwen3-8B" }`` first and a provider after: overflow and
fallback for a self-hosted model).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import (AUTH, BAD_REQUEST, CONNECT, CONTEXT_LENGTH, NOT_FOUND, OVERLOADED, PROVIDERS, RATE_LIMITED, SERVER,
                   TIMEOUT, Target)
from ..spend.prices import FREE, Price, PriceError, parse_price
from .credentials import Credential

FALLBACK_KINDS = (CONNECT, TIMEOUT, SERVER, RATE_LIMITED, OVERLOADED, CONTEXT_LENGTH, AUTH, NOT_FOUND, BAD_REQUEST)
# Failures another target may well not have; a request the provider refused as such (bad_request), or a
# credential or model that is wrong (auth, not_found), fails the same way on the next and is said to the client,
# unless the operator lists those too.
DEFAULT_FALLBACK_ON = frozenset({CONNECT, TIMEOUT, SERVER, RATE_LIMITED, OVERLOADED, CONTEXT_LENGTH})
# Where each provider answers when the target does not say (Azure's, Bedrock's and compatible servers' depend on
# the account: they must be given).
DEFAULT_BASE_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com",
                     "gemini": "https://generativelanguage.googleapis.com"}
_PRICE_KEYS = frozenset({"price_usd_per_mtok", "price_usd_per_request"})
_TARGET_KEYS = frozenset({"provider", "model", "credential", "base_url", "timeout_secs", "context_tokens", "rpm",
                          "tpm", "headers"}) | _PRICE_KEYS
# What each provider reads of its own (anything else is refused: a typo would otherwise be silently ignored).
_OPENAI_APIS = frozenset({"api", "reasoning_summary"})  # api = "chat" (the default) or "responses"
PROVIDER_OPTIONS = {"azure": frozenset({"api_version", "auth"}) | _OPENAI_APIS, "bedrock": frozenset({"region"}),
                    "anthropic": frozenset({"anthropic_version"}),
                    "openai": frozenset({"organization", "project"}) | _OPENAI_APIS,
                    "openai_compatible": _OPENAI_APIS}
_OPTION_VALUES = {"api": ("chat", "responses"), "reasoning_summary": ("auto", "concise", "detailed"),
                  "auth": ("key", "bearer")}
TARGETS_MAX = 256
ROUTES_MAX = 1024


class RoutesError(ValueError):
    """The models config cannot be used (one line naming the entry): at start the node refuses it; on a reload
    the routes in use stay."""


@dataclasses.dataclass(frozen=True)
class Quota:
    """An account's quota for one target, held cluster-wide (``quotas.py``)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclasses.dataclass(frozen=True)
class Overflow:
    """When a route's pool counts as saturated: every worker serving it has at least ``waiting`` requests waiting,
    or its KV cache used past ``kv_usage`` (``overflow.py``)."""

    waiting: int | None = None
    kv_usage: float | None = None


@dataclasses.dataclass(frozen=True)
class RouteTarget:
    """One entry of a route: a provider target, or the pool of workers serving ``pool``."""

    target: Target | None
    pool: str | None
    weight: float = 1.0
    priority: int = 0

    @property
    def name(self) -> str:
        return self.target.name if self.target is not None else f"pool:{self.pool}"


@dataclasses.dataclass(frozen=True)
class Route:
    name: str
    targets: tuple[RouteTarget, ...]
    fallback_on: frozenset[str] = DEFAULT_FALLBACK_ON
    tenants: frozenset[str] | None = None  # None: everyone
    overflow: Overflow | None = None
    price: Price | None = None
    # The response cache (gateway/cache): True answers every request of this model from it (with
    # --response-cache), not only deterministic ones; False, none; None, the deterministic ones.
    cache: bool | None = None
    cache_ttl_s: float | None = None

    def price_of(self, entry_name: str | None, targets: "Mapping[str, Target]") -> Price:
        """What an answer of the target named ``entry_name`` (a RouteTarget's name) costs: the target's price, else
        the route's, else nothing."""
        target = targets.get(entry_name) if entry_name is not None else None
        if target is not None and target.price is not None:
            return target.price
        return self.price or FREE

    def allows(self, tenant: str | None) -> bool:
        return self.tenants is None or (tenant is not None and tenant in self.tenants)

    def ordered(self, rng: random.Random) -> list[RouteTarget]:
        """The targets in the order a request tries them: by priority, and within one by a draw weighted by
        ``weight`` (each next one drawn among the rest: Efraimidis and Spirakis' keys, u ** (1 / w))."""
        by_priority: dict[int, list[RouteTarget]] = {}
        for entry in self.targets:
            by_priority.setdefault(entry.priority, []).append(entry)
        order: list[RouteTarget] = []
        for priority in sorted(by_priority):
            group = by_priority[priority]
            if len(group) == 1:
                order += group
            else:
                order += sorted(group, key=lambda e: -(rng.random() ** (1.0 / e.weight)))
        return order


@dataclasses.dataclass(frozen=True)
class Routes:
    routes: Mapping[str, Route]
    targets: Mapping[str, Target]
    quotas: Mapping[str, Quota]  # by target name, those with one
    loaded_at: float = 0.0  # when the config was read (its routes' "created" in /v1/models)

    def get(self, model: str) -> Route | None:
        return self.routes.get(model)

    def describe(self, cooling: "dict[str, float]") -> dict[str, Any]:
        """What the routes are, for the admin API and ``smg-node models``: every route's targets in order and every
        target's provider, model, credential reference (never the secret), quota and cooldown left."""
        targets = {}
        for name, target in self.targets.items():
            quota = self.quotas.get(name)
            targets[name] = {"provider": target.provider, "model": target.model, "base_url": target.base_url,
                             "credential": str(target.credential) if target.credential is not None else None,
                             "timeout_s": target.timeout_s, "context_tokens": target.context_tokens,
                             "rpm": quota.requests_per_minute if quota else None,
                             "tpm": quota.tokens_per_minute if quota else None,
                             "cooldown_s": round(cooling.get(name, 0.0), 1),
                             **(target.price.to_dict() if target.price is not None else {})}
        routes = {name: {"targets": [entry_of(entry) for entry in route.targets],
                         "fallback_on": sorted(route.fallback_on),
                         "tenants": sorted(route.tenants) if route.tenants is not None else None,
                         "overflow": dataclasses.asdict(route.overflow) if route.overflow is not None else None,
                         **(route.price.to_dict() if route.price is not None else {})}
                  for name, route in self.routes.items()}
        return {"routes": routes, "targets": targets}


def entry_of(entry: RouteTarget) -> dict[str, Any]:
    out: dict[str, Any] = {"target": entry.target.name} if entry.target is not None else {"pool": entry.pool}
    if entry.weight != 1.0:
        out["weight"] = entry.weight
    if entry.priority:
        out["priority"] = entry.priority
    return out


NO_ROUTES = Routes({}, {}, {})


def load_routes(path: "str | Path") -> Routes:
    """The routes of the models config at ``path``: TOML, or YAML for .yaml/.yml."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RoutesError(f"--models-config {path}: {e.strerror}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text) or {}
        else:
            raw = tomllib.loads(text)
    except Exception as e:  # tomllib's and yaml's own errors: the line they name
        raise RoutesError(f"--models-config {path}: {e}") from None
    return parse_routes(raw)


def parse_routes(raw: Any) -> Routes:
    """The routes of a models config already read (a file, or ``PUT /admin/models``'s body)."""
    if not isinstance(raw, dict):
        raise RoutesError("the models config is a table of 'targets' and 'models'")
    unknown = set(raw) - {"targets", "models"}
    if unknown:
        raise RoutesError(f"the models config has unknown sections: {', '.join(sorted(unknown))}")
    raw_targets = raw.get("targets") or {}
    raw_models = raw.get("models") or {}
    if not isinstance(raw_targets, dict) or not isinstance(raw_models, dict):
        raise RoutesError("'targets' and 'models' are tables, by name")
    if len(raw_targets) > TARGETS_MAX or len(raw_models) > ROUTES_MAX:
        raise RoutesError(f"at most {TARGETS_MAX} targets and {ROUTES_MAX} models")
    targets, quotas = {}, {}
    for name, spec in raw_targets.items():
        targets[name], quota = _target(str(name), spec)
        if quota is not None:
            quotas[name] = quota
    routes = {str(name): _route(str(name), spec, targets) for name, spec in raw_models.items()}
    return Routes(routes, targets, quotas, time.time())


def _target(name: str, spec: Any) -> "tuple[Target, Quota | None]":
    where = f"targets.{name}"
    if not isinstance(spec, dict):
        raise RoutesError(f"{where} is a table")
    provider = spec.get("provider")
    if provider not in PROVIDERS:
        raise RoutesError(f"{where}.provider must be one of {PROVIDERS.choices()}, got {provider!r}")
    own = PROVIDER_OPTIONS.get(provider, frozenset())
    unknown = set(spec) - _TARGET_KEYS - own
    if unknown:
        raise RoutesError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
    model = spec.get("model")
    if not isinstance(model, str) or not model:
        raise RoutesError(f"{where}.model is the provider's model id")
    base_url = spec.get("base_url") or DEFAULT_BASE_URLS.get(provider)
    if provider == "bedrock" and not base_url:
        region = spec.get("region")
        if not isinstance(region, str) or not region:
            raise RoutesError(f"{where}: a bedrock target needs its region (or a base_url)")
        base_url = f"https://bedrock-runtime.{region}.amazonaws.com"
    if not isinstance(base_url, str) or not base_url.startswith(("https://", "http://")):
        raise RoutesError(f"{where}.base_url must be an http(s) URL" + ("" if base_url else " (this provider has "
                                                                             "no default)"))
    credential = None
    if spec.get("credential") is not None:
        try:
            credential = Credential.parse(spec["credential"], f"{where}.credential")
        except ValueError as e:
            raise RoutesError(str(e)) from None
    elif provider == "bedrock":
        credential = Credential("aws", "")
    timeout_s = _positive(spec, "timeout_secs", where, 120.0)
    context = spec.get("context_tokens")
    if context is not None and (not isinstance(context, int) or isinstance(context, bool) or context < 1):
        raise RoutesError(f"{where}.context_tokens must be a positive integer")
    headers = spec.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) and k.isascii()
                                                and "\n" not in k + v and "\r" not in k + v
                                                for k, v in headers.items()):
        raise RoutesError(f"{where}.headers is a table of header names to strings")
    if any(k.lower() in ("authorization", "x-api-key", "api-key", "x-goog-api-key", "host", "content-length")
           for k in headers):
        raise RoutesError(f"{where}.headers may not set credentials or framing: the credential is a reference")
    if provider == "openai":
        headers = {**headers, **({"OpenAI-Organization": spec["organization"]} if spec.get("organization") else {}),
                   **({"OpenAI-Project": spec["project"]} if spec.get("project") else {})}
    options = {key: spec[key] for key in own if key in spec}
    for key, allowed in _OPTION_VALUES.items():
        if key in options and options[key] not in allowed:
            raise RoutesError(f"{where}.{key} must be one of {', '.join(allowed)}, got {options[key]!r}")
    quota = None
    if spec.get("rpm") is not None or spec.get("tpm") is not None:
        quota = Quota(_count(spec, "rpm", where), _count(spec, "tpm", where))
    return Target(name, provider, model, base_url, credential, tuple(headers.items()), timeout_s, context,
                  options, _price(spec, where)), quota


def _price(spec: dict[str, Any], where: str) -> Price | None:
    try:
        return parse_price(spec, where)
    except PriceError as e:
        raise RoutesError(str(e)) from None


def _route(name: str, spec: Any, targets: Mapping[str, Target]) -> Route:
    where = f"models.{name}"
    if not isinstance(spec, dict):
        raise RoutesError(f"{where} is a table")
    unknown = set(spec) - {"targets", "fallback_on", "tenants", "overflow", "cache", "cache_ttl_secs"} - _PRICE_KEYS
    if unknown:
        raise RoutesError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
    raw = spec.get("targets")
    if not isinstance(raw, list) or not raw:
        raise RoutesError(f"{where}.targets is a non-empty list")
    entries = []
    for i, entry in enumerate(raw):
        at = f"{where}.targets[{i}]"
        if isinstance(entry, str):
            entry = {"target": entry}
        if not isinstance(entry, dict) or ("target" in entry) == ("pool" in entry):
            raise RoutesError(f"{at} names a target or a pool: {{ target = NAME }} or {{ pool = MODEL }}")
        unknown = set(entry) - {"target", "pool", "weight", "priority"}
        if unknown:
            raise RoutesError(f"{at} has unknown keys: {', '.join(sorted(unknown))}")
        weight = entry.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
            raise RoutesError(f"{at}.weight must be a positive number")
        priority = entry.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise RoutesError(f"{at}.priority must be a whole number from 0")
        if "target" in entry:
            if entry["target"] not in targets:
                raise RoutesError(f"{at}: no target named {entry['target']!r}")
            entries.append(RouteTarget(targets[entry["target"]], None, float(weight), priority))
        else:
            if not isinstance(entry["pool"], str) or not entry["pool"]:
                raise RoutesError(f"{at}.pool is the model id its workers serve")
            entries.append(RouteTarget(None, entry["pool"], float(weight), priority))
    fallback_on = DEFAULT_FALLBACK_ON
    if spec.get("fallback_on") is not None:
        kinds = spec["fallback_on"]
        if not isinstance(kinds, list) or not all(kind in FALLBACK_KINDS for kind in kinds):
            raise RoutesError(f"{where}.fallback_on lists failure kinds: {', '.join(FALLBACK_KINDS)}")
        fallback_on = frozenset(kinds)
    tenants = None
    if spec.get("tenants") is not None:
        if not isinstance(spec["tenants"], list) or not all(isinstance(t, str) for t in spec["tenants"]):
            raise RoutesError(f"{where}.tenants is a list of tenant names")
        tenants = frozenset(spec["tenants"])
    overflow = None
    if spec.get("overflow") is not None:
        raw_overflow = spec["overflow"]
        if not isinstance(raw_overflow, dict) or set(raw_overflow) - {"waiting", "kv_usage"} or not raw_overflow:
            raise RoutesError(f"{where}.overflow is {{ waiting = N, kv_usage = FRACTION }} (either or both)")
        waiting = raw_overflow.get("waiting")
        if waiting is not None and (isinstance(waiting, bool) or not isinstance(waiting, int) or waiting < 0):
            raise RoutesError(f"{where}.overflow.waiting is a whole number of waiting requests")
        kv = raw_overflow.get("kv_usage")
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, (int, float)) or not 0 < kv <= 1):
            raise RoutesError(f"{where}.overflow.kv_usage is a fraction of the KV cache, above 0 and at most 1")
        if not any(entry.pool for entry in entries):
            raise RoutesError(f"{where}.overflow applies to a pool target, and the route has none")
        overflow = Overflow(waiting, float(kv) if kv is not None else None)
    cache = spec.get("cache")
    if cache is not None and not isinstance(cache, bool):
        raise RoutesError(f"{where}.cache is true (answer its requests from the response cache) or false")
    cache_ttl_s = _positive(spec, "cache_ttl_secs", where, 0.0) if spec.get("cache_ttl_secs") is not None else None
    return Route(name, tuple(entries), fallback_on, tenants, overflow, _price(spec, where), cache, cache_ttl_s)


def _positive(spec: dict[str, Any], key: str, where: str, default: float) -> float:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise RoutesError(f"{where}.{key} must be a positive number")
    return float(value)


def _count(spec: dict[str, Any], key: str, where: str) -> int | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RoutesError(f"{where}.{key} must be a positive whole number")
    return value

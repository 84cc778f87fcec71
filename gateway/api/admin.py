"""GET /v1/models, health endpoints, /metrics, worker management (/workers), rate limits (/admin/rate-limits),
API keys (/admin/api-keys)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

import trio

from ..auth import Role
from ..providers import RoutesError
from ..auth.key_store import SETTING_PREFIX as KEY_SETTING_PREFIX, KeyStoreError, StoredKey
from ..ratelimit.limits import RATE_LIMITS_SETTING, LimitConfigError, parse_limit_set
from ..spend import BudgetError, parse_budget
from ..workers.pairing import PREFILL, REGULAR, ROLES
from .errors import BadRequest, NotFound, Unavailable
from .http import Request
from .protocol import parse_json_body
from .state import GatewayState

log = logging.getLogger("gateway.api")

WORKER_LABELS_MAX = 32


def _model_object(state: GatewayState, name: str) -> dict:
    entry = state.catalog.get(name)
    return {"id": name, "object": "model", "created": entry.created, "owned_by": "smg-node",
            "max_model_len": entry.max_context_tokens, "tasks": entry.tasks}


def _route_object(state: GatewayState, route: Any) -> dict:
    """A routed model as /v1/models shows it: what serves it (its targets in order: a provider's model, or the
    fleet's pool), and the pool's facts when its first target is one."""
    pool = next((entry.pool for entry in route.targets if entry.pool is not None), None)
    entry = state.catalog.get(pool) if pool is not None else None
    base = _model_object(state, pool) if entry is not None else {"created": int(state.providers.routes.loaded_at),
                                                                  "max_model_len": None, "tasks": ["generate"]}
    served_by = [{"target": e.target.name, "provider": e.target.provider, "model": e.target.model}
                 if e.target is not None else {"pool": e.pool} for e in route.targets]
    return {**base, "id": route.name, "object": "model", "owned_by": "smg-node", "served_by": served_by}


def _visible_models(state: GatewayState, request: Request) -> "dict[str, dict]":
    """Every model this caller may use, by name: the fleet's, and the routed ones (which win a shared name)."""
    principal = request.principal
    models = {name: _model_object(state, name) for name in state.catalog.names() if principal.may_use(name)}
    providers = getattr(state, "providers", None)
    if providers is not None:
        for name, route in providers.routes.routes.items():
            if principal.may_use(name) and route.allows(principal.tenant):
                models[name] = _route_object(state, route)
    for spec in state.adapters.specs.values():  # as vLLM lists its LoRA modules: root the weights, parent the base
        if spec.name not in models and spec.base in models and principal.may_use(spec.name):
            models[spec.name] = {**models[spec.base], "id": spec.name, "root": spec.path, "parent": spec.base}
    return models


async def list_models(state: GatewayState, request: Request) -> None:
    # A key limited to some models sees only those; a tenant, the routes open to it.
    await request.send_json(200, {"object": "list", "data": list(_visible_models(state, request).values())})


async def retrieve_model(state: GatewayState, request: Request) -> None:
    """GET /v1/models/{model} (the SDK's models.retrieve): a model this caller may use, or OpenAI's 404."""
    name = request.path_params["model"]
    model = _visible_models(state, request).get(name)
    if model is None:
        raise NotFound(f"The model `{name}` does not exist or you do not have access to it.", code="model_not_found")
    await request.send_json(200, model)


async def get_models_config(state: GatewayState, request: Request) -> None:
    """GET /admin/models: the routes and targets in use, with each target's cooldown left (smg-node models)."""
    providers = state.providers
    await request.send_json(200, providers.routes.describe(providers.cooldowns.cooling_targets(providers.now())))


async def put_models_config(state: GatewayState, request: Request) -> None:
    """PUT /admin/models: a models config whole (the file's structure, as JSON), checked, then in force on every
    node of the cluster (its document keeps it)."""
    try:
        routes = state.providers.publish_models(parse_json_body(await request.body()))
    except RoutesError as e:
        raise BadRequest(f"models config: {e}", code="invalid_models_config") from None
    await request.send_json(200, routes.describe({}))


async def liveness(state: GatewayState, request: Request) -> None:
    await request.send_json(200, {"status": "alive"})


async def readiness(state: GatewayState, request: Request) -> None:
    """Ready: not shutting down, and joined the mesh with the cluster's registry received (or running
    alone). What is wrong with the node, never with an engine or a model: engines' health is the
    cluster's (each engine is checked by one owner and gossiped), so a dead engine is dead for every
    node at once. Taking nodes out for it would take them all out, the models that still have engines
    with them, and have the balancer answer what the node says better (503 naming the model)."""
    now = trio.current_time()
    healthy = sum(1 for w in state.registry.all() if w.available(now))
    reason = None
    if state.status.shutting_down:
        reason = "shutting down"
    elif state.cluster is not None and not state.cluster.registry_received:
        reason = "not joined to the cluster yet (no worker registry received)"
    if reason is not None:
        raise Unavailable(f"not ready: {reason}", code="not_ready", retry_after_s=1)
    await request.send_json(200, {"status": "ready", "healthy_workers": healthy})


async def health(state: GatewayState, request: Request) -> None:
    now = trio.current_time()
    workers = state.registry.all()
    healthy = sum(1 for w in workers if w.available(now))
    status = 200 if healthy and not state.status.shutting_down else 503
    await request.send_json(status, {"status": "ok" if status == 200 else "degraded", "workers": len(workers),
                                     "healthy_workers": healthy,
                                     # Which process of the node answered (--workers N share the port).
                                     "process": {"pid": os.getpid(), "index": state.config.worker_index}})


async def metrics(state: GatewayState, request: Request) -> None:
    await request.send_bytes(200, state.metrics.render(), [(b"content-type", b"text/plain; version=0.0.4")])


async def list_workers(state: GatewayState, request: Request) -> None:
    now = trio.current_time()
    await request.send_json(200, {"workers": [state.registry.describe(w, now) for w in state.registry.all()]})


async def get_worker(state: GatewayState, request: Request) -> None:
    worker = state.registry.get(request.path_params["worker_id"])
    if worker is None:
        raise NotFound(f"no worker {request.path_params['worker_id']}", code="worker_not_found")
    await request.send_json(200, state.registry.describe(worker, trio.current_time()))


def _labels(body: dict[str, Any]) -> dict[str, str]:
    labels = body.get("labels") or {}
    if not isinstance(labels, dict) or len(labels) > WORKER_LABELS_MAX or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 256 for k, v in labels.items()):
        raise BadRequest(f"'labels' must be an object of at most {WORKER_LABELS_MAX} short strings", param="labels")
    return labels


def _role(body: dict[str, Any]) -> "tuple[str, int | None]":
    """(worker_type, bootstrap_port): prefill/decode disaggregation (gateway/workers/pairing.py)."""
    role = body.get("worker_type", REGULAR)
    if role not in ROLES:
        raise BadRequest(f"'worker_type' must be one of {', '.join(ROLES)}", param="worker_type")
    port = body.get("bootstrap_port")
    if port is not None and (type(port) is not int or not 0 < port < 65536):
        raise BadRequest("'bootstrap_port' must be a port number (1-65535)", param="bootstrap_port")
    if port is not None and role != PREFILL:
        raise BadRequest("'bootstrap_port' belongs to prefill workers", param="bootstrap_port")
    return role, port


async def add_worker(state: GatewayState, request: Request) -> None:
    body = parse_json_body(await request.body())
    url = body.get("url")
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise BadRequest("'url' (grpc://host:port, http://host:port or https://host:port) is required",
                         param="url")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    api_key = body.get("api_key")  # the worker's own key (OpenAI-compatible HTTP workers); never shown
    if api_key is not None and (not isinstance(api_key, str) or not 0 < len(api_key) <= 4096):
        raise BadRequest("'api_key' must be a non-empty string", param="api_key")
    if _is_this_node(state, request, url):
        raise BadRequest(f"'{url}' is this node's own address, not an engine's: name the engine's URL (a node "
                         "registered as its own worker would send its requests to itself)", param="url",
                         code="worker_is_this_node")
    role, bootstrap_port = _role(body)
    worker = await state.registry.add(url, _labels(body), model, api_key=api_key, role=role,
                                      bootstrap_port=bootstrap_port)
    await state.catalog.ensure(worker, int(worker.registered_at))
    await request.send_json(201, worker.describe(trio.current_time()))


_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"})


def _is_this_node(state: GatewayState, request: Request, url: str) -> bool:
    """``url`` is where this node serves HTTP: the address the admin request came to (its Host), or the node's
    port on a loopback name. (A gRPC URL is never the node: it serves no gRPC.)"""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False  # not a port at all: the registry refuses it with its own words
    host = parts.hostname.lower()
    asked = request.header("host")
    if asked:
        try:
            reached = urlsplit("//" + asked)
            if (reached.hostname or "").lower() == host and (reached.port or 80) == port:
                return True
        except ValueError:
            pass  # a Host no URL can have: only the port check below
    own = state.status.own_url
    if own is None:
        return False
    own_parts = urlsplit(own)
    return own_parts.port == port and (host in _LOOPBACK_HOSTS or host == (own_parts.hostname or "").lower())


async def remove_worker(state: GatewayState, request: Request) -> None:
    worker = await state.registry.remove(request.path_params["worker_id"])
    await request.send_json(202, {"id": worker.id, "status": "draining", "in_flight": worker.in_flight})


async def get_rate_limits(state: GatewayState, request: Request) -> None:
    limiter = state.rate_limiter
    if limiter is None:
        raise NotFound("rate limits are not available on this node", code="not_found")
    await request.send_json(200, {**limiter.limits.to_dict(), "node": limiter.statistics()})


async def put_rate_limits(state: GatewayState, request: Request) -> None:
    """Replace the limits in force; in a cluster the change reaches every node through the shared document."""
    limiter = state.rate_limiter
    if limiter is None:
        raise NotFound("rate limits are not available on this node", code="not_found")
    try:
        limits = parse_limit_set(parse_json_body(await request.body()))
    except LimitConfigError as e:
        raise BadRequest(f"rate limits: {e}", code="invalid_rate_limits") from None
    limiter.set_limits(limits)
    state.settings.set_setting(RATE_LIMITS_SETTING, limits.to_dict())  # every node's, and kept on disk
    await request.send_json(200, limits.to_dict())


async def create_api_key(state: GatewayState, request: Request) -> None:
    """A new key; its secret is in this answer only. In a cluster every node knows it within the bound
    of gateway/auth/key_store.py."""
    body = parse_json_body(await request.body())
    name, tenant, models, expires = body.get("name"), body.get("tenant"), body.get("models"), body.get("expires_in_s")
    budget = body.get("budget")  # {amount_usd, period, mode, ...}: the key's own budget (gateway/spend/budgets.py)
    if budget is not None:
        if not isinstance(budget, dict):
            raise BadRequest("'budget' is an object: {amount_usd, period, mode, ...}", param="budget")
        try:
            # Checked before the key exists (its fields, and room for one more budget).
            state.spend.budgets.with_budget(parse_budget({**budget, "key": "0"}, "budget"))
        except BudgetError as e:
            raise BadRequest(str(e), param="budget", code="invalid_budgets") from None
    try:
        role = Role(body.get("role", "user"))
    except ValueError:
        raise BadRequest("'role' must be admin or user", param="role") from None
    if not isinstance(name, str) or (tenant is not None and not isinstance(tenant, str)) or (
            models is not None and not isinstance(models, list)) or (
            expires is not None and (isinstance(expires, bool) or not isinstance(expires, (int, float)))):
        raise BadRequest("'name' (a string) is required; 'tenant' is a string, 'models' a list of names, "
                         "'expires_in_s' a number", param="name")
    try:
        key, secret = state.key_store.create(name, role, time.time(), tenant, models,
                                             float(expires) if expires is not None else None)
    except KeyStoreError as e:
        raise BadRequest(str(e), code="invalid_api_key_request") from None
    _replicate_key(state, key)
    answer = {**key.public(time.time()), "key": secret}
    if budget is not None:
        own = parse_budget({**budget, "key": key.id}, "budget")
        state.spend.publish_budgets(state.spend.budgets.with_budget(own))
        answer["budget"] = own.to_dict()
    await request.send_json(201, answer)


async def list_api_keys(state: GatewayState, request: Request) -> None:
    now = time.time()
    await request.send_json(200, {"keys": [k.public(now) for k in state.key_store.all()]})


async def revoke_api_key(state: GatewayState, request: Request) -> None:
    key_id = request.path_params["key_id"]
    try:
        key = state.key_store.revoke(key_id)
    except KeyError:
        raise NotFound(f"no API key {key_id}", code="api_key_not_found") from None
    _replicate_key(state, key)
    await request.send_json(200, key.public(time.time()))


def _data_status(state: GatewayState) -> dict:
    settings = state.settings
    journal = settings.journal
    return {"data_dir": str(settings.data_dir) if settings.data_dir is not None else None,
            "set_aside": [str(p) for p in journal.set_aside()] if journal is not None else [],
            "keys_may_be_lost": settings.keys_may_be_lost}


async def data_status(state: GatewayState, request: Request) -> None:
    """Where the node keeps its state (gateway/node/data_dir.py), and what it could not read back."""
    await request.send_json(200, _data_status(state))


async def accept_data_loss(state: GatewayState, request: Request) -> None:
    """The operator accepts what a start could not read back: a node that knows no key serves inference again."""
    accepted = state.settings.accept_loss()
    state.authenticator.keys_unknown = None
    log.warning("data directory: the loss of what could not be read back was accepted (%d files set aside)",
                len(accepted))
    await request.send_json(200, {"accepted": [str(p) for p in accepted],
                                  "data_plane_open": state.authenticator.data_plane_open})


def _replicate_key(state: GatewayState, key: StoredKey) -> None:
    """Write the record (never the secret) to the settings document: every node of the cluster applies it, and
    with a data directory it is on disk before the key is shown."""
    state.settings.set_setting(KEY_SETTING_PREFIX + key.id, key.to_record())

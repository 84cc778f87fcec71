"""The workers as subsystems of the node (gateway/base/subsystem.py): health checks' section and flags, where
workers may be registered, the registry (which workers exist, their health, the cluster's worker document) and the
router (a worker for one attempt, by the routing policy)."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from ..engine.engine_tls import client_context
from ..net.http_client import HttpClient, HttpClientConfig
from ..routing.policies import make_policy
from . import health, origin
from .health import HealthConfig
from .origin import WorkerAllowlist
from .registry import WorkerRegistry
from .router import Router

# Kept-alive connections per HTTP worker: one process's requests in flight to one worker at high load (the
# library client this replaced kept 256 across all workers).
RELAY_IDLE_PER_WORKER = 256


def _check(config: Any) -> None:
    try:
        WorkerAllowlist(config.worker_allowed_hosts)
    except ValueError as e:
        raise ConfigProblem(str(e)) from None


async def _start_registry(context: StartContext) -> WorkerRegistry:
    config = context.config
    # https:// workers verified with the engines' CA (else the system's), shown our client certificate.
    relay = HttpClient(HttpClientConfig(idle_per_origin=RELAY_IDLE_PER_WORKER),
                       client_context(config.engine_tls, ["http/1.1"]))
    return WorkerRegistry(context.need("engine_bridge"), context.need("http_client"), config.health, config.breaker,
                          context.nursery, context.need("kv_index"), context.need("cluster"), config.kv_events_always,
                          WorkerAllowlist(config.worker_allowed_hosts), context.need("kv_sharing"), relay=relay,
                          encoders=context.need("encode"))


async def _start_router(context: StartContext) -> Router:
    return Router(context.need("registry"), make_policy(context.config.policy, context.need("kv_index")),
                  context.need("adapters"))


HEALTH = Subsystem("health", HealthConfig(), (*health.OPTIONS, *origin.OPTIONS), _check)
# The KV sharing starts before any worker registers: an engine's KV stream is then followed by its ring owners only.
REGISTRY = Subsystem("registry", start=_start_registry,
                     needs=("engine_bridge", "http_client", "kv_index", "cluster", "kv_sharing", "encode"))
ROUTER = Subsystem("router", start=_start_router, needs=("registry", "kv_index", "adapters"))

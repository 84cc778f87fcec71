"""The workers as subsystems of the node (gateway/base/subsystem.py): health checks' section and flags, where
workers may be registered, the registry (which workers exist, their health, the cluster's worker document) and the
router (a worker for one attempt, by the routing policy)."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from ..engine import encode_workers
from ..engine.encode_workers import DEFAULT_BOOTSTRAP_PORT, EncodeConfig, EncodePool, EncodeWorker
from ..engine.engine_tls import client_context
from ..net.http_client import HttpClient, HttpClientConfig
from ..routing.policies import make_policy
from . import health, origin
from .health import HealthConfig
from .origin import WorkerAllowlist, WorkerUrlError, parse_worker_origin
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


def _check_encode(config: Any) -> None:
    if not config.encode.timeout_s > 0:
        raise ConfigProblem("--encode-timeout-secs must be positive")
    for url, _ in config.encode.workers:
        try:
            if parse_worker_origin(url).kind != "grpc":
                raise WorkerUrlError("not a gRPC URL")
        except WorkerUrlError as e:
            raise ConfigProblem(f"--encode {url}: an encode worker is a gRPC engine (grpc://host:port): {e}") from None


def encode_pool(bridge: Any, config: EncodeConfig, counted: Any = None) -> "EncodePool | None":
    """TokenSpeed's encode workers of --encode (engine/encode_workers.py): each one's gRPC target and the host and
    port of its bootstrap server; None without any."""
    if not config.workers:
        return None
    workers = []
    for url, port in config.workers:
        origin = parse_worker_origin(url)
        workers.append(EncodeWorker(origin.grpc_target, origin.host,
                                    port if port is not None else DEFAULT_BOOTSTRAP_PORT))
    return EncodePool(bridge, workers, config.timeout_s, counted)


async def _start_encode(context: StartContext) -> "EncodePool | None":
    return encode_pool(context.need("engine_bridge"), context.config.encode,
                       context.need("metrics").epd_images_encoded)


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


# None without --encode: prefills encode their own images. The registry hands it to the engines that take it.
ENCODE = Subsystem("encode", EncodeConfig(), encode_workers.OPTIONS, _check_encode, _start_encode,
                   needs=("engine_bridge", "metrics"))
HEALTH = Subsystem("health", HealthConfig(), (*health.OPTIONS, *origin.OPTIONS), _check)
# The KV sharing starts before any worker registers: an engine's KV stream is then followed by its ring owners only.
REGISTRY = Subsystem("registry", start=_start_registry,
                     needs=("engine_bridge", "http_client", "kv_index", "cluster", "kv_sharing", "encode"))
ROUTER = Subsystem("router", start=_start_router, needs=("registry", "kv_index", "adapters"))

"""The node's subsystems: the one registration of each (gateway/base/subsystem.py says what one declares).

The config's sections, flags and checks (``gateway/node/config.py``), the server's start-up and the request
context (``gateway/node/server.py``, ``GatewayState``) loop over ``SUBSYSTEMS`` and name none of them. Adding a
subsystem is its own package (its config, its flags, its ``Subsystem``) and one line here. The order is --help's
within a section, and the start order where ``needs`` leaves a choice.

The node's own resources, which no subsystem starts, are ``NODE_RESOURCES``: its config, its metrics, the cluster's
state (None without a mesh), the settings document (the cluster's, or a lone node's own), the HTTP client of workers
and issuers, and the engines' gRPC client.
"""

from __future__ import annotations

from ..adapters import subsystem as adapters
from ..api import subsystem as api
from ..auth import subsystem as auth
from ..base.subsystem import StartContext, Subsystem
from ..cache import subsystem as cache
from ..cluster import subsystem as cluster
from ..discovery import subsystem as discovery
from ..engine import subsystem as engine
from ..history import subsystem as history
from ..mcp import subsystem as mcp
from ..media import subsystem as media
from ..net import tls
from ..observe.loop_lag import LoopLagMonitor
from ..parsers import subsystem as parsers
from ..providers import subsystem as providers
from ..ratelimit import subsystem as ratelimit
from ..routing import subsystem as routing
from ..serving import subsystem as serving
from ..spend import subsystem as spend
from ..tokenizer import subsystem as tokenizer
from ..tracing import subsystem as tracing
from ..workers import subsystem as workers

NODE_RESOURCES = ("config", "metrics", "cluster", "settings", "http_client", "engine_bridge")


async def _start_loop_lag(context: StartContext) -> LoopLagMonitor:
    """How late the event loop runs what asked to wake up, and its collector's pauses; counted as busy while
    requests run or wait."""
    metrics, admission = context.need("metrics"), context.need("admission")
    monitor = LoopLagMonitor(metrics.loop_lag, gc_pauses=metrics.gc_pauses,
                             busy=lambda: admission.running > 0 or admission.waiting > 0)
    context.nursery.start_soon(monitor.run)
    return monitor


LOOP_LAG = Subsystem("loop_lag", start=_start_loop_lag, needs=("metrics", "admission"))

SUBSYSTEMS: tuple[Subsystem, ...] = (
    parsers.SUBSYSTEM,
    serving.ADMISSION,
    routing.POLICY,
    routing.KV_INDEX,
    routing.RETRY,
    routing.BREAKER,
    workers.HEALTH,
    engine.ENGINE_TLS,
    engine.ENGINE_H2,
    workers.ENCODE,
    tokenizer.SUBSYSTEM,
    serving.EMBEDDINGS,
    media.SUBSYSTEM,
    mcp.SUBSYSTEM,
    providers.SUBSYSTEM,
    history.SUBSYSTEM,
    serving.PD,
    discovery.SUBSYSTEM,
    tracing.SUBSYSTEM,
    cluster.MESH,
    ratelimit.RATE_LIMIT,
    spend.SUBSYSTEM,
    cache.SUBSYSTEM,
    auth.AUTH,
    tls.SUBSYSTEM,
    # Services only: what every request stands on.
    cluster.KV_SHARING,
    workers.REGISTRY,
    adapters.SUBSYSTEM,
    workers.ROUTER,
    serving.CATALOG,
    serving.GENERATOR,
    ratelimit.RATE_LIMITER,
    auth.KEY_STORE,
    auth.AUTHENTICATOR,
    api.PROXY,
    api.BACKGROUND,
    LOOP_LAG,
)

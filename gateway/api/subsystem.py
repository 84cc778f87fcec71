"""The API's own services as subsystems of the node (gateway/base/subsystem.py): the relay to OpenAI-compatible
HTTP workers, and the background responses generating on this node (their runs, cancels from any node, their live
streams)."""

from __future__ import annotations

from ..base.subsystem import StartContext, Subsystem
from ..history import HISTORY_BACKENDS
from .background import BackgroundRuns
from .proxy import HttpProxy


async def _start_proxy(context: StartContext) -> HttpProxy:
    return HttpProxy(context.need("generator"), context.need("admission"),
                     context.config.admission.request_timeout_s, context.need("rate_limiter"))


async def _start_background(context: StartContext) -> BackgroundRuns:
    """Their own nursery, and cancels from any node; only a store shared without a mesh leaves them to look at the
    store for cancels."""
    cluster = context.need("cluster")
    runs = BackgroundRuns(cluster, poll_store=cluster is None and HISTORY_BACKENDS[context.config.history_backend].shared)
    await context.nursery.start(runs.serve)
    return runs


PROXY = Subsystem("proxy", start=_start_proxy, needs=("generator", "admission", "rate_limiter"))
BACKGROUND = Subsystem("background", start=_start_background, needs=("cluster",))

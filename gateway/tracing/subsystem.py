"""Tracing as a subsystem of the node (gateway/base/subsystem.py): its section, flags and checks, and the tracer
(None unless --enable-trace; OpenTelemetry is loaded only then). The tracer follows peers' requests too, and its
last spans are exported off the event loop when the node stops."""

from __future__ import annotations

import socket
from typing import Any

import trio

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from .config import OPTIONS, TracingConfig


def _check(config: Any) -> None:
    tracing = config.tracing
    if not 0.0 <= tracing.sample_ratio <= 1.0 or tracing.export_timeout_s <= 0 or not tracing.endpoint:
        raise ConfigProblem("--trace-sample-ratio must be from 0 to 1, --trace-export-timeout-secs positive, and "
                            "--otlp-traces-endpoint given")


async def _start(context: StartContext) -> Any:
    config = context.config
    if not config.tracing.enabled:
        return None
    from .tracer import Tracing  # OpenTelemetry, loaded only when tracing is on (the CLI starts at once)
    cluster = context.need("cluster")
    tracing = Tracing.start(config.tracing, cluster.node_name if cluster is not None else socket.gethostname())
    if cluster is not None:  # peers' requests in a traced request's trace, both ways
        cluster.peer_requests.use_tracing(tracing)
    context.nursery.start_soon(_export_the_last_spans, tracing)
    return tracing


async def _export_the_last_spans(tracing: Any) -> None:
    """Waits for the node to stop; then the last spans out, off the loop (bounded by the export timeout)."""
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(tracing.shutdown)


SUBSYSTEM = Subsystem("tracing", TracingConfig(), OPTIONS, _check, _start, needs=("cluster",))

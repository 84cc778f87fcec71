"""Tracing's settings (``--enable-trace`` and the flags beside it)."""

from __future__ import annotations

import dataclasses
from ..base.options import Option


@dataclasses.dataclass(frozen=True)
class TracingConfig:
    enabled: bool = False
    # smg's flag and default: host:port is OTLP/gRPC; an http(s):// URL is OTLP/HTTP protobuf, posted as given.
    endpoint: str = "localhost:4317"
    grpc_tls: bool = False  # OTLP/gRPC over TLS (collectors on a local network usually listen in plain text)
    # Of the traces that start here (a client's sampled traceparent is followed as it is): 1.0 keeps every
    # one; a busy node may keep a percent and still see its slow requests' shape.
    sample_ratio: float = 1.0
    service_name: str = "smg-node"
    # The export queue: spans waiting for the exporter's thread. Full, new spans are dropped and counted:
    # a collector that is down costs spans, never request time. 2,048 spans are some 200 requests' worth.
    queue_spans_max: int = 2048
    batch_spans_max: int = 512  # per export call (OTLP collectors take far more)
    export_interval_s: float = 1.0  # how late a span may reach the collector when few are made
    export_timeout_s: float = 10.0  # one export call, the exporter's retries included


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--enable-trace", "tracing.enabled", "bool", "export traces of requests over OTLP (OpenTelemetry)",
           "tracing"),
    Option("--otlp-traces-endpoint", "tracing.endpoint", str, "where traces go: host:port is OTLP/gRPC (default "
           "localhost:4317), an http(s):// URL is OTLP/HTTP protobuf, posted to it as given", "tracing"),
    Option("--trace-sample-ratio", "tracing.sample_ratio", float, "share of the traces that start here to keep, 0 "
           "to 1 (a client's sampled traceparent is always followed)", "tracing"),
    Option("--trace-export-timeout-secs", "tracing.export_timeout_s", float, "one export to the collector, its "
           "retries included; spans that cannot wait are dropped and counted", "tracing"),
)

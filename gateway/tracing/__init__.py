"""Traces of requests (OpenTelemetry, exported over OTLP), ``--enable-trace``.

    config.TracingConfig    the flags' settings, with their defaults explained
    tracer.Tracing          the node's tracer: request and step spans, W3C traceparent in and out
    export.QueuedSpanProcessor  spans leave off the event loop through a bounded, counted queue

Only the config is imported here: OpenTelemetry is loaded when tracing is on (``tracer``), not by every
process that reads a configuration (the CLI starts at once).
"""

from .config import TracingConfig

__all__ = ["TracingConfig"]

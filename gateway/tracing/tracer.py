"""The node's tracer: spans of a request's steps, their context from and to W3C ``traceparent`` headers.

Built once per process when ``--enable-trace`` is set (``Tracing.start``); the gateway holds it as
``state.tracing`` and every instrumented step reads that: None (the default) costs one attribute read,
nothing else. Spans are kept per trio task in OpenTelemetry's context (contextvars: a task started from a
request's task sees the request's span as its parent).

Sampling: parent-based, then ``sample_ratio`` of the traces that start here; a client's ``traceparent``
with the sampled flag is followed as it is (the trace is the client's).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import random
from collections.abc import Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..observe.metrics import counter
from .config import TracingConfig
from .context import CURRENT
from .export import QueuedSpanProcessor

__all__ = ["TracedCalls", "Tracing", "exporter_for"]

_PROPAGATOR = TraceContextTextMapPropagator()
# The subsystems answering peers, by their mark (gateway/cluster/peer_requests.py): a peer span's name.
PEER_KINDS = {"R": "rate_limit", "H": "history", "K": "kv"}
TRACEPARENT_CHARS_MAX = 64  # "00-" + 32 + "-" + 16 + "-" + 2 = 55; longer is not W3C's
TRACESTATE_CHARS_MAX = 512  # W3C: 32 list members of up to 256 characters; we pass on this much at most


class Tracing:
    def __init__(self, config: TracingConfig, node_name: str, exporter: Any, rng: "random.Random | None" = None
                 ) -> None:
        self.config = config
        self.processor = QueuedSpanProcessor(exporter, config.queue_spans_max, config.batch_spans_max,
                                             config.export_interval_s)
        resource = Resource.create({"service.name": config.service_name, "service.instance.id": node_name,
                                    "process.pid": os.getpid()})
        # The sampling is ours (``samples``, before any span): the SDK keeps what it is given. Its own ratio
        # sampler as well sampled ratio x ratio of the traces (a test caught 0.25 for 0.5).
        self.provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_ON))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("smg-node")
        self._rng = rng or random.Random()

    @classmethod
    def start(cls, config: TracingConfig, node_name: str) -> "Tracing":
        return cls(config, node_name, exporter_for(config))

    def shutdown(self) -> None:
        self.provider.shutdown()

    def traced(self, target: Any, prefix: str) -> "TracedCalls":
        """``target`` with a span per awaited method call inside a traced request (``{prefix}.{method}``): how
        another subsystem's service (the history store) is traced without knowing this package."""
        return TracedCalls(target, self, prefix)

    # -- spans ------------------------------------------------------------------

    def samples(self, headers: "dict[bytes, bytes]") -> bool:
        """Whether this client request is traced: its traceparent's sampled flag, else the ratio. Decided
        before the SDK is asked for anything: an unsampled request through the SDK's sampler and no-op
        spans cost a third of a plain request (BENCHMARKS.md); decided here, a few hundred instructions."""
        flag = _sampled_flag(headers.get(b"traceparent"))
        return flag if flag is not None else self._rng.random() < self.config.sample_ratio

    @staticmethod
    def active() -> bool:
        """Inside a traced request (the steps' spans are made only then)."""
        return CURRENT.get() is not None

    def request_span(self, name: str, headers: "dict[bytes, bytes]", attributes: "dict[str, Any]") -> Any:
        """The server span of a sampled client request (``samples``), the child of its ``traceparent``
        when it sent one."""
        return self._server_span(name, _extract(headers), attributes)

    @contextlib.contextmanager
    def _server_span(self, name: str, parent: Any, attributes: "dict[str, Any] | None") -> Iterator[Any]:
        """A span that starts this node's part of a trace (under ``parent``, a remote context, if any): the
        steps inside it, in this task and the tasks it starts, make their spans below it."""
        token = otel_context.attach(parent) if parent is not None else None
        traced = CURRENT.set(self)
        try:
            with self.tracer.start_as_current_span(name, kind=SpanKind.SERVER, attributes=attributes,
                                                   record_exception=False, set_status_on_exception=False) as span:
                yield span
        finally:
            CURRENT.reset(traced)
            if token is not None:
                otel_context.detach(token)

    @contextlib.contextmanager
    def span(self, name: str, kind: SpanKind = SpanKind.INTERNAL, attributes: "dict[str, Any] | None" = None
             ) -> Iterator[Any]:
        """A step of the current request: an error leaving it marks the span (its type, not its text). None
        outside a sampled request (no trace to add it to)."""
        if CURRENT.get() is None:
            yield None
            return
        with self.tracer.start_as_current_span(name, kind=kind, attributes=attributes, record_exception=False,
                                               set_status_on_exception=False) as span:
            try:
                yield span
            except Exception as e:
                span.set_status(Status(StatusCode.ERROR, type(e).__name__))
                raise

    def client_span(self, name: str, attributes: "dict[str, Any]") -> Any:
        """A call this request makes to another process (an engine, a peer)."""
        return self.span(name, SpanKind.CLIENT, attributes)

    @staticmethod
    def annotate(attributes: "dict[str, Any]") -> None:
        """Attributes for the current span, learnt as the step went (tokens, time to first token)."""
        trace.get_current_span().set_attributes(attributes)

    def record(self, name: str, start_ns: int, end_ns: int, attributes: "dict[str, Any]") -> None:
        """A step already over, made of many short pieces (a stream's parsing): one span from its first piece to
        its last, the time the pieces took in ``attributes``."""
        if CURRENT.get() is not None:
            self.tracer.start_span(name, attributes=attributes, start_time=start_ns).end(end_time=end_ns)

    def context_headers(self) -> "list[tuple[bytes, bytes]]":
        """The current span's W3C ``traceparent``, and the client's ``tracestate`` carried with it (when it sent
        one), for an engine's gRPC metadata or an HTTP worker's headers."""
        headers = [(b"traceparent", self.traceparent_bytes())]
        state = trace.get_current_span().get_span_context().trace_state
        if state:
            headers.append((b"tracestate", state.to_header().encode("latin-1")))
        return headers

    def traceparent_bytes(self) -> bytes:
        """The current span's context as a W3C traceparent (55 bytes), for a peer request's frame."""
        context = trace.get_current_span().get_span_context()
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}".encode("ascii")

    @contextlib.contextmanager
    def peer_span(self, traceparent: bytes, kind: str) -> Iterator[Any]:
        """A peer's request handled here, in its caller's trace (the frame's traceparent): a server span,
        and the steps' spans below it. A malformed traceparent is ignored (the request is served untraced)."""
        if not _sampled_flag(traceparent):
            yield None
            return
        parent = _PROPAGATOR.extract({"traceparent": traceparent.decode("ascii", "replace")})
        with self._server_span(f"peer.{PEER_KINDS.get(kind, 'request')}", parent, None) as span:
            yield span

    def metric_families(self) -> Iterator[Any]:
        processor = self.processor
        yield counter("smg_trace_spans", "Spans that ended here, by what became of them: exported, failed (the "
                      "collector refused them or did not answer in time), dropped (the export queue was full)",
                      ["outcome"], [(["exported"], processor.exported), (["failed"], processor.failed),
                                    (["dropped"], processor.dropped)])


def _sampled_flag(traceparent: "bytes | None") -> "bool | None":
    """Whether a client's W3C traceparent says its trace is sampled (the flags' lowest bit); None without
    one, or for a malformed one (ignored, as W3C says: the trace starts here, sampled by the ratio)."""
    if traceparent is None or len(traceparent) != 55 or traceparent[2:3] != b"-" or traceparent[52:53] != b"-":
        return None
    try:
        return bool(int(traceparent[53:55], 16) & 1)
    except ValueError:
        return None


def _extract(headers: "dict[bytes, bytes]") -> Any:
    raw = headers.get(b"traceparent")
    if raw is None or len(raw) > TRACEPARENT_CHARS_MAX:
        return None  # (an over-long header is not W3C's: ignored, the trace starts here)
    carrier = {"traceparent": raw.decode("latin-1")}
    state = headers.get(b"tracestate")
    if state is not None and len(state) <= TRACESTATE_CHARS_MAX:
        carrier["tracestate"] = state.decode("latin-1")
    return _PROPAGATOR.extract(carrier)


def exporter_for(config: TracingConfig) -> Any:
    """OTLP over gRPC for ``host:port`` (smg's default localhost:4317), OTLP/HTTP protobuf posted to an
    ``http(s)://`` URL as given."""
    endpoint = config.endpoint
    if endpoint.startswith(("http://", "https://")):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
        return HttpExporter(endpoint=endpoint, timeout=config.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    return GrpcExporter(endpoint=endpoint, insecure=not config.grpc_tls, timeout=config.export_timeout_s)


class TracedCalls:
    """``target`` with a span per awaited method call made inside a traced request (``{prefix}.{method}``):
    the history store's operations, whichever backend. Everything else is the target's own."""

    def __init__(self, target: Any, tracing: Tracing, prefix: str) -> None:
        self._target, self._tracing, self._prefix = target, tracing, prefix

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute
        tracing, span_name = self._tracing, f"{self._prefix}.{name}"

        async def traced(*args: Any, **kwargs: Any) -> Any:
            if not tracing.active():
                return await attribute(*args, **kwargs)
            with tracing.span(span_name):
                return await attribute(*args, **kwargs)

        return traced

"""The tracer's decisions without a collector (gateway/tracing): what is sampled, what a step's span hangs
from, and the export queue's bound. Spans land in the SDK's in-memory exporter."""

from __future__ import annotations

import random
import threading
import time

from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.tracing import TracingConfig
from gateway.tracing.tracer import Tracing

SAMPLED = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = SAMPLED[:-2] + b"00"


SEED = 7  # the sampler's random numbers: the same draws every run


def tracing(ratio: float = 1.0, exporter=None, **config) -> "tuple[Tracing, InMemorySpanExporter]":
    exporter = exporter or InMemorySpanExporter()
    return Tracing(TracingConfig(enabled=True, sample_ratio=ratio, export_interval_s=0.01, **config), "n1",
                   exporter, random.Random(SEED)), exporter


def requests(t: Tracing, headers: dict, count: int = 1) -> None:
    """As the app does: sampled or not, then the request's span and a step's."""
    for _ in range(count):
        if not t.samples(headers):
            with t.span("tokenize") as span:
                assert span is None  # no trace: no step's span either
            continue
        with t.request_span("POST /v1/chat/completions", headers, {}):
            with t.span("tokenize"):
                t.annotate({"gen_ai.usage.input_tokens": 3})


def finished(t: Tracing, exporter: InMemorySpanExporter) -> list:
    t.provider.force_flush()
    t.shutdown()
    return list(exporter.get_finished_spans())


def test_a_clients_sampled_trace_is_followed_and_an_unsampled_one_makes_no_span():
    t, exporter = tracing(ratio=0.0)  # the ratio is for traces that start here only
    requests(t, {b"traceparent": SAMPLED})
    requests(t, {b"traceparent": UNSAMPLED})
    spans = finished(t, exporter)
    assert sorted(s.name for s in spans) == ["POST /v1/chat/completions", "tokenize"]
    server = next(s for s in spans if s.name.startswith("POST"))
    assert format(server.context.trace_id, "032x") == SAMPLED[3:35].decode()
    assert format(server.parent.span_id, "016x") == SAMPLED[36:52].decode()
    child = next(s for s in spans if s.name == "tokenize")
    assert child.parent.span_id == server.context.span_id and child.attributes["gen_ai.usage.input_tokens"] == 3


def test_traces_that_start_here_follow_the_ratio_and_a_malformed_traceparent_is_ignored():
    t, exporter = tracing(ratio=1.0)
    requests(t, {b"traceparent": b"00-zz-" + b"x" * 49})  # 55 bytes, not W3C's: a trace of its own
    (server, _) = sorted(finished(t, exporter), key=lambda s: s.name)
    assert server.parent is None
    t, exporter = tracing(ratio=0.0)
    requests(t, {}, count=20)
    assert finished(t, exporter) == []
    t, exporter = tracing(ratio=0.5)
    requests(t, {}, count=400)
    kept = sum(1 for s in finished(t, exporter) if s.parent is None)
    # Binomial(400, 0.5): 200 +- 10; the SDK's own ratio sampler on top once made it 400 x 0.25.
    assert 160 < kept < 240, f"{kept} of 400 kept at 0.5 (seed {SEED})"


def test_a_step_outside_a_sampled_request_makes_no_span():
    t, exporter = tracing()
    with t.span("tokenize") as span:
        assert span is None
    assert finished(t, exporter) == []


class StuckExporter(InMemorySpanExporter):
    """A collector that does not answer: each export waits until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def export(self, spans):
        self.release.wait(10)
        return SpanExportResult.FAILURE


def test_a_full_queue_drops_and_counts_and_the_request_never_waits():
    exporter = StuckExporter()
    t, _ = tracing(exporter=exporter, queue_spans_max=10, batch_spans_max=5)
    started = time.perf_counter()
    requests(t, {b"traceparent": SAMPLED}, count=50)  # 100 spans: 5 in the stuck export, 10 queued, the rest out
    assert time.perf_counter() - started < 5  # (the export waits 10 s: nothing here waited for it)
    processor = t.processor
    assert processor.dropped >= 100 - 5 - 10
    exporter.release.set()
    t.shutdown()
    assert processor.exported == 0 and processor.failed + processor.dropped == 100


async def test_a_traced_peer_frame_is_served_in_the_callers_trace_or_as_it_is():
    from gateway.cluster import PeerRequests

    seen = []

    async def handler(payload: bytes) -> bytes:
        seen.append(payload)
        return b"ok"

    peers = PeerRequests()
    peers.register(b"H", handler)
    frame = b"T" + SAMPLED + b"H" + b"payload"
    assert await peers.handle(frame) == b"ok" and seen == [b"payload"]  # a node that does not trace
    t, exporter = tracing()
    peers.tracing = t
    assert await peers.handle(frame) == b"ok"
    assert await peers.handle(b"T" + b"x" * 55 + b"H" + b"payload") == b"ok"  # a malformed context: untraced
    (span,) = finished(t, exporter)
    assert span.name == "peer.history" and format(span.parent.span_id, "016x") == SAMPLED[36:52].decode()
    assert await peers.handle(b"T" + SAMPLED) == b"" and peers.unrouted == 1  # no frame after the context

"""Spans leave the node off the event loop, through a bounded queue: a collector that is slow or down costs
dropped, counted spans, never a slower request.

``QueuedSpanProcessor`` is an OpenTelemetry span processor: ``on_end`` (called in the request's task when a
span ends) only appends to a bounded deque; a daemon thread takes batches from it every ``interval_s`` (or
at once when a batch is full) and hands them to the OTLP exporter, whose network calls and retries happen
there. The SDK's own BatchSpanProcessor does the same but does not say how many spans it dropped; an
operator needs that number (``smg_trace_spans_total{outcome}``).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("gateway.tracing")


class QueuedSpanProcessor(SpanProcessor):
    def __init__(self, exporter: SpanExporter, queue_spans_max: int, batch_spans_max: int, interval_s: float) -> None:
        self._exporter = exporter
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._queue_spans_max = queue_spans_max
        self._batch_spans_max = batch_spans_max
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._stopping = False
        # What became of the spans that ended here (read by /metrics; written by one thread each).
        self.dropped = 0  # the queue was full: the collector does not keep up, or is away
        self.exported = 0
        self.failed = 0  # the exporter gave up on them (after its own retries)
        self._thread = threading.Thread(target=self._run, name="smg-trace-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        if len(self._queue) >= self._queue_spans_max:
            self.dropped += 1
            return
        self._queue.append(span)  # deque.append is atomic: no lock on the request's path
        if len(self._queue) >= self._batch_spans_max:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self._export_queued()
        self._export_queued()

    def _export_queued(self) -> None:
        while self._queue:
            batch = []
            while self._queue and len(batch) < self._batch_spans_max:
                batch.append(self._queue.popleft())
            try:
                result = self._exporter.export(batch)
            except Exception as e:  # an exporter must not end the thread: the next batch may go through
                log.warning("exporting %d spans failed: %s", len(batch), e)
                result = SpanExportResult.FAILURE
            if result is SpanExportResult.SUCCESS:
                self.exported += len(batch)
            else:
                self.failed += len(batch)

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=5)
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._wake.set()
        return True

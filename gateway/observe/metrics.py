"""Every Prometheus metric of the gateway, defined in one place.

Counters and histograms on the request path are updated directly, without locks
(loop_metrics.py: only the serving loop's thread updates them); state that
components already keep (tokenizer caches, worker health, circuits, queue) is
read at scrape time by a collector, so the hot path pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .loop_metrics import LoopCounter, LoopHistogram

# Event-loop lag and GC pause histograms (loop_lag.py measures them): from half a millisecond to a second.
LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_DECISION_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5)
_BATCH_ITEMS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_TOKEN_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = LoopCounter("smg_http_requests", "HTTP requests by route and status", ["route", "status"],
                                    registry=r)
        self.request_duration = LoopHistogram("smg_http_request_duration_seconds", "Request duration", ["route"],
                                              buckets=_LATENCY_BUCKETS_S, registry=r)
        self.ttft = LoopHistogram("smg_time_to_first_token_seconds", "Time to first token (streamed generations)",
                                  ["model"], buckets=_LATENCY_BUCKETS_S, registry=r)
        self.tpot = LoopHistogram("smg_time_per_output_token_seconds", "Time per output token after the first",
                                  ["model"], buckets=_TOKEN_LATENCY_BUCKETS_S, registry=r)
        self.tokens = LoopCounter("smg_tokens", "Tokens by kind: prompt, completion, cached (prompt tokens the engine "
                                  "had in its prefix cache)", ["model", "kind"], registry=r)
        self.retries = LoopCounter("smg_retries", "Generation attempts retried, by gRPC status of the failure",
                                   ["code"], registry=r)
        self.engine_errors = LoopCounter("smg_engine_errors", "Failed engine calls by worker and code",
                                         ["worker", "code"], registry=r)
        self.aborts = LoopCounter("smg_engine_aborts", "Generations aborted on the engine, by reason", ["reason"],
                                  registry=r)
        self.loop_lag = LoopHistogram("smg_event_loop_lag_seconds", "How late the event loop woke a sleeping task "
                                      "(anything holding the loop shows here)", buckets=LAG_BUCKETS_S, registry=r)
        # gc.callbacks run on whichever thread collects (the tokenizer's too): prometheus_client's locked values.
        self.gc_pauses = Histogram("smg_gc_pause_seconds", "Pauses of Python's cyclic garbage collector, by "
                                   "generation (every thread stops)", ["generation"], buckets=LAG_BUCKETS_S, registry=r)
        self.rate_limit_decisions = LoopCounter(
            "smg_rate_limit_decisions", "Rate-limit decisions by limit and outcome (allowed, denied; fallback_* when "
            "the key's owner could not be reached and the failure policy decided)", ["limit", "outcome"], registry=r)
        self.rate_limit_decision_duration = LoopHistogram(
            "smg_rate_limit_decision_seconds", "Time to a rate-limit decision, by path: local (this node owns the "
            "key or a local-first share), forwarded (asked the owner), fallback", ["path"],
            buckets=_DECISION_BUCKETS_S, registry=r)
        self.rate_limit_batch_items = LoopHistogram(
            "smg_rate_limit_forwarded_batch_items", "Items per batch forwarded to a key's owner",
            buckets=_BATCH_ITEMS_BUCKETS, registry=r)
        # Prefill/decode disaggregation (gateway/serving/disaggregation.py), smg's names: what only the gateway sees, as
        # the one component on both legs of a request.
        self.pd_pair_selections = LoopCounter("smg_pd_pair_selections", "Prefill/decode pairs chosen for an attempt",
                                              ["model"], registry=r)
        self.pd_prefill_duration = LoopHistogram("smg_pd_prefill_duration_seconds", "Prefill leg: from dispatch to the "
                                                 "prefill engine's answer", ["model", "runtime"],
                                                 buckets=_LATENCY_BUCKETS_S, registry=r)
        self.pd_kv_transfer_duration = LoopHistogram("smg_pd_kv_transfer_duration_seconds", "vLLM pairs: from the "
                                                     "prefill's answer to the decode's first token (the KV pulled)",
                                                     ["model", "runtime"], buckets=_LATENCY_BUCKETS_S, registry=r)
        self.pd_ttft = LoopHistogram("smg_pd_ttft_seconds", "End-to-end time to first token of a disaggregated "
                                     "request: from the prefill's dispatch to the decode's first token",
                                     ["model", "runtime"], buckets=_LATENCY_BUCKETS_S, registry=r)
        self.pd_bootstrap_failures = LoopCounter("smg_pd_bootstrap_failures", "Attempts whose KV hand-over failed: "
                                                 "timeout (no hand-over within --pd-bootstrap-timeout-secs), "
                                                 "prefill_failed (the prefill failed before it)", ["reason"],
                                                 registry=r)
        self.epd_images_encoded = LoopCounter("smg_epd_images_encoded", "Images sent to TokenSpeed encode workers "
                                              "(--encode), by outcome: accepted, failed (the attempt failed with it)",
                                              ["outcome"], registry=r)
        self.pd_kv_transfer_failures = LoopCounter("smg_pd_kv_transfer_failures", "vLLM pairs whose prefill returned "
                                                   "no kv_transfer_params (the decode recomputes the prompt)",
                                                   ["reason"], registry=r)
        self.pd_kv_connector_mode = LoopCounter("smg_pd_kv_connector_mode", "vLLM pairs by the prefill's KV connector "
                                                "(nixl, mooncake, passthrough)", ["mode"], registry=r)
        self._state_sources: list[Callable[[], Iterator[Any]]] = []
        self.registry.register(_StateCollector(self._state_sources))
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}

    # labels() checks and formats its arguments and takes a lock on every call (~2 us, four times a
    # request); a child lives as long as its metric (none is ever removed here), so the request path
    # keeps them by label values. Bounded in case a label ever takes outside values.
    CHILDREN_KEPT_MAX = 4096

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, kept."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*values)
            if len(self._children) < self.CHILDREN_KEPT_MAX:
                self._children[key] = child
        return child

    def add_state_source(self, source: Callable[[], Iterator[Any]]) -> None:
        """A callable yielding metric families, read at scrape time."""
        self._state_sources.append(source)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector:
    def __init__(self, sources: list[Callable[[], Iterator[Any]]]) -> None:
        self._sources = sources

    def describe(self) -> list[Any]:
        return []  # families vary with workers; describe lazily

    def collect(self) -> Iterator[Any]:
        for source in self._sources:
            yield from source()


def gauge(name: str, doc: str, labels: "list[str]", rows: "list[tuple[list[str], float]]") -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, v in rows:
        family.add_metric(values, v)
    return family


def counter(name: str, doc: str, labels: "list[str]", rows: "list[tuple[list[str], float]]") -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, v in rows:
        family.add_metric(values, v)
    return family

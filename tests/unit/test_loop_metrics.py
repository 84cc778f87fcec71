"""The serving loop's lock-free counters and histograms (gateway/observe/loop_metrics.py) export what
prometheus_client's own classes export for the same updates, and refuse what they refuse."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.observe.loop_metrics import LoopCounter, LoopHistogram
from gateway.observe.metrics import GatewayMetrics

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


def _exposition(counter_class, histogram_class, updates, monkeypatch) -> bytes:
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.0)  # the _created samples' stamps
    registry = CollectorRegistry()
    requests = counter_class("bench_requests", "requests", ["route", "status"], registry=registry)
    duration = histogram_class("bench_duration_seconds", "duration", ["route"], buckets=BUCKETS_S, registry=registry)
    plain = histogram_class("bench_lag_seconds", "lag", registry=registry)  # no labels: the metric is its own child
    for route, status, seconds in updates:
        requests.labels(route, status).inc()
        requests.labels(route, "tokens").inc(abs(seconds) * 1000)
        duration.labels(route).observe(seconds)
        plain.observe(seconds)
    return generate_latest(registry)


def test_the_exposition_is_prometheus_clients_own(monkeypatch):
    seed = random.randrange(2 ** 32)
    rng = random.Random(seed)
    bounds = [*BUCKETS_S, math.inf, 0.0, -1.0]  # on a bound (le is inclusive), past the last, zero, negative
    updates = [(rng.choice(("/v1/chat/completions", "/v1/responses")), rng.choice(("200", "429")),
                rng.choice(bounds) if rng.random() < 0.3 else rng.expovariate(5.0)) for _ in range(2_000)]
    stock = _exposition(Counter, Histogram, updates, monkeypatch)
    loop = _exposition(LoopCounter, LoopHistogram, updates, monkeypatch)
    assert loop == stock, f"seed {seed}"
    assert b'bench_duration_seconds_bucket{le="0.01",route="/v1/responses"}' in loop


def test_children_take_the_lock_free_path_and_the_stock_checks_still_apply():
    """Fails when a prometheus_client release moves what loop_metrics replaces (the stock paths would run)."""
    metrics = GatewayMetrics()
    assert metrics.child(metrics.requests, "/v1/chat/completions", "200")._loop
    assert metrics.child(metrics.request_duration, "/v1/chat/completions")._loop
    assert metrics.child(metrics.ttft, "model")._loop and metrics.loop_lag._loop
    assert not isinstance(metrics.gc_pauses, LoopHistogram)  # observed from any thread that collects
    with pytest.raises(ValueError):
        metrics.requests.inc()  # a metric with labels, not a child: prometheus_client's error
    with pytest.raises(ValueError):
        metrics.child(metrics.requests, "/v1/chat/completions", "200").inc(-1)
    with pytest.raises(ValueError):
        metrics.request_duration.observe(1.0)


def test_nan_is_counted_as_prometheus_client_counts_it(monkeypatch):
    updates = [("/v1/chat/completions", "200", math.nan), ("/v1/chat/completions", "200", 0.02)]
    assert _exposition(LoopCounter, LoopHistogram, updates[1:], monkeypatch) == \
        _exposition(Counter, Histogram, updates[1:], monkeypatch)
    registry = CollectorRegistry()
    stock = Histogram("h", "h", buckets=BUCKETS_S, registry=registry)
    loop = LoopHistogram("h2", "h", buckets=BUCKETS_S, registry=registry)
    stock.observe(math.nan)
    loop.observe(math.nan)
    buckets = lambda h: [b.get() for b in h._buckets]  # noqa: E731
    assert buckets(loop) == buckets(stock) == [0.0] * (len(BUCKETS_S) + 1)

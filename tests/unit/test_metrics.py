"""The request path's kept metric children count into the exported series, and the kept set is bounded."""

from __future__ import annotations

from gateway.observe.metrics import GatewayMetrics


def _sample(metrics: GatewayMetrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_kept_children_are_the_metrics_own_and_count_into_the_export():
    metrics = GatewayMetrics()
    first = metrics.child(metrics.requests, "/v1/chat/completions", "200")
    assert metrics.child(metrics.requests, "/v1/chat/completions", "200") is first
    assert first is metrics.requests.labels("/v1/chat/completions", "200")
    first.inc()
    metrics.child(metrics.requests, "/v1/chat/completions", "200").inc(2)
    metrics.child(metrics.requests, "/v1/chat/completions", "400").inc()
    metrics.child(metrics.tokens, "m", "prompt").inc(7)
    assert _sample(metrics, "smg_http_requests_total", {"route": "/v1/chat/completions", "status": "200"}) == 3
    assert _sample(metrics, "smg_http_requests_total", {"route": "/v1/chat/completions", "status": "400"}) == 1
    assert _sample(metrics, "smg_tokens_total", {"model": "m", "kind": "prompt"}) == 7
    assert b'smg_http_requests_total{route="/v1/chat/completions",status="200"} 3.0' in metrics.render()


def test_the_kept_set_stops_growing_at_its_bound_and_counting_goes_on():
    metrics = GatewayMetrics()
    for i in range(GatewayMetrics.CHILDREN_KEPT_MAX + 10):
        metrics.child(metrics.tokens, f"model-{i}", "prompt").inc()
    assert len(metrics._children) == GatewayMetrics.CHILDREN_KEPT_MAX
    last = f"model-{GatewayMetrics.CHILDREN_KEPT_MAX + 9}"
    metrics.child(metrics.tokens, last, "prompt").inc()
    assert _sample(metrics, "smg_tokens_total", {"model": last, "kind": "prompt"}) == 2

"""Native and operational endpoints: /generate, tokenize, health, metrics, worker management."""

from __future__ import annotations

import json

from tests.support.nodes import MODEL


def test_generate_token_level(http, predict):
    r = http.post("/generate", json={"input_ids": [9707, 11, 1879], "sampling_params": {"max_new_tokens": 6}})
    body = r.json()
    assert r.status_code == 200 and len(body["output_ids"]) == 6
    assert body["text"] == predict([9707, 11, 1879], 6)
    assert body["meta_info"]["finish_reason"] == {"type": "length"}
    assert body["meta_info"]["prompt_tokens"] == 3


def test_generate_streams_cumulative_text(http, predict):
    events = []
    with http.stream("POST", "/generate", json={"text": "Hello", "stream": True,
                                                "sampling_params": {"max_new_tokens": 5}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    assert events[-1]["meta_info"]["completion_tokens"] == 5
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative, as SGLang sends it


def test_tokenize_detokenize_round_trip(http, tokenizer):
    r = http.post("/v1/tokenize", json={"model": MODEL, "prompt": "héllo wörld 🎉"})
    body = r.json()
    assert body["tokens"] == tokenizer.encode_uncached("héllo wörld 🎉", add_special_tokens=True)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 32768
    back = http.post("/v1/detokenize", json={"model": MODEL, "tokens": body["tokens"]}).json()
    assert back["prompt"] == "héllo wörld 🎉"


def test_health_endpoints(http):
    assert http.get("/liveness").status_code == 200
    assert http.get("/readiness").json()["healthy_workers"] == 2
    assert http.get("/health").json()["status"] == "ok"


def test_metrics_cover_requests_tokens_caches_and_engines(http, client):
    list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "m"}], max_tokens=3,
                                        stream=True))
    text = http.get("/metrics").text
    for name in ("smg_http_requests_total", "smg_http_request_duration_seconds_bucket",
                 "smg_time_to_first_token_seconds_bucket", "smg_time_per_output_token_seconds_bucket",
                 'smg_tokens_total{kind="prompt"', "smg_tokenizer_cache_hits_total", "smg_worker_healthy",
                 "smg_circuit_breaker_state", "smg_retries_total", "smg_requests_running",
                 "smg_event_loop_lag_seconds_bucket", 'smg_event_loop_lag_ms{quantile="p99"}',
                 "smg_kv_index_blocks"):
        assert name.split("{")[0] in text, name
    l0_bytes = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("smg_tokenizer_cache_bytes{") and 'level="l0"' in line]
    assert l0_bytes and max(l0_bytes) > 0  # the prompt above is cached


def test_worker_management_add_get_delete(http, log_dir):
    from chaos.processes import EngineProcess
    extra = EngineProcess(["--itl-base-s", "0"], log_dir, "engine-extra")
    try:
        r = http.post("/workers", json={"url": extra.url, "labels": {"zone": "b"}})
        assert r.status_code == 201, r.text
        wid = r.json()["id"]
        assert r.json()["labels"] == {"zone": "b"} and r.json()["healthy"]
        assert http.post("/workers", json={"url": extra.url}).status_code == 409
        assert http.get(f"/workers/{wid}").json()["url"] == extra.url
        assert len(http.get("/workers").json()["workers"]) == 3
        d = http.delete(f"/workers/{wid}")
        assert d.status_code == 202 and d.json()["status"] == "draining"
        assert http.delete(f"/workers/{wid}").status_code == 404
        assert http.get("/workers/w-nonexistent").status_code == 404
        bad = http.post("/workers", json={"url": "ftp://x"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "worker_error"
    finally:
        extra.stop()


def test_removed_worker_drains_its_running_stream(log_dir):
    from chaos.processes import EngineProcess, NodeProcess
    engine = EngineProcess(["--itl-base-s", "0.01"], log_dir, "drain-engine")
    node = NodeProcess(["--worker-urls", engine.url], log_dir, "drain-node")
    try:
        import httpx2
        with httpx2.Client(base_url=node.url, timeout=30, headers=node.admin_headers) as http:
            wid = http.get("/workers").json()["workers"][0]["id"]
            body = {"model": MODEL, "messages": [{"role": "user", "content": "d"}], "max_tokens": 60, "stream": True}
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                next(lines)
                assert http.delete(f"/workers/{wid}").status_code == 202
                # No new work goes to a draining worker...
                refused = http.post("/v1/chat/completions", json={**body, "stream": False})
                assert refused.status_code == 503
                # ...but the running stream finishes.
                rest = [line for line in lines if line.startswith("data: ")]
            assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2]
            assert http.get("/workers").json()["workers"] == []
    finally:
        node.stop()
        engine.stop()


def test_json_logs_carry_the_request_id(log_dir):
    import json as json_module
    from chaos.processes import EngineProcess, NodeProcess
    engine = EngineProcess(["--zero-cost"], log_dir, "log-engine")
    node = NodeProcess(["--worker-urls", engine.url, "--log-json"], log_dir, "log-node")
    try:
        import httpx2
        httpx2.get(node.url + "/v1/models", headers={"x-request-id": "trace-me-7"})
    finally:
        node.stop()
        engine.stop()
    entries = [json_module.loads(line) for line in node.log_text().splitlines() if line.startswith("{")]
    access = [e for e in entries if e.get("request_id") == "trace-me-7"]
    assert access and access[0]["logger"] == "gateway.access" and access[0]["level"] == "info"


def test_separate_prometheus_listener(log_dir):
    import socket

    from chaos.processes import EngineProcess, NodeProcess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = EngineProcess(["--zero-cost"], log_dir, "prom-engine")
    node = NodeProcess(["--worker-urls", engine.url, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(port)],
                       log_dir, "prom-node")
    try:
        import httpx2
        r = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert r.status_code == 200 and "smg_worker_healthy" in r.text
        assert httpx2.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 404  # metrics only
    finally:
        node.stop()
        engine.stop()

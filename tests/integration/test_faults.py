"""Faults: a client that disconnects, an engine that dies mid-stream, no healthy engine."""

from __future__ import annotations

import time

import grpc
import httpx2
import openai
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg, sglang_scheduler_pb2_grpc as sg_grpc

from chaos.processes import EngineProcess, NodeProcess

from tests.support.nodes import MODEL
from tests.support.waiting import eventually, time_until

SLOW_ENGINE = ["--itl-base-s", "0.02", "--itl-per-running-s", "0"]
LONG = {"model": MODEL, "messages": [{"role": "user", "content": "go on forever"}], "max_tokens": 2000,
        "stream": True}


def engine_running(engine: EngineProcess) -> int:
    with grpc.insecure_channel(engine.target) as channel:
        loads = sg_grpc.SglangSchedulerStub(channel).GetLoads(sg.GetLoadsRequest(), timeout=5)
    return loads.loads[0].num_running_reqs


@pytest.fixture
def slow_setup(log_dir):
    engine = EngineProcess(SLOW_ENGINE, log_dir, "slow-engine")
    node = NodeProcess(["--worker-urls", engine.url, "--retry-max-retries", "2", "--retry-initial-backoff-ms", "10",
                        "--health-check-interval-secs", "0.5"], log_dir, "slow-node")
    yield engine, node
    node.stop()
    engine.stop()


def test_client_disconnect_aborts_the_generation_on_the_engine(slow_setup):
    engine, node = slow_setup
    with httpx2.Client(base_url=node.url, timeout=30, headers=node.admin_headers) as http:
        with http.stream("POST", "/v1/chat/completions", json=LONG) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert engine_running(engine) == 1
        # Leaving the block closed the connection mid-stream (2000 tokens would take 40 s).
        took = time_until(lambda: engine_running(engine) == 0, timeout_s=5)
        assert took < 5
        metrics = http.get("/metrics").text
        assert 'smg_engine_aborts_total{reason="cancelled_or_failed"} 1.0' in metrics
        assert http.get("/workers").json()["workers"][0]["in_flight"] == 0


def test_client_disconnect_under_hypercorn_aborts_too(slow_setup, log_dir):
    # hypercorn has no native disconnect hook: a watcher task waits for http.disconnect instead.
    engine, _ = slow_setup
    node = NodeProcess(["--worker-urls", engine.url, "--http-server", "hypercorn", "--workers", "1"], log_dir,
                       "hypercorn-node")
    try:
        with httpx2.Client(base_url=node.url, timeout=30, headers=node.admin_headers) as http:
            with http.stream("POST", "/v1/chat/completions", json=LONG) as r:
                lines = r.iter_lines()  # kept: a dropped iterator closes the response
                assert next(lines).startswith("data: ")
                assert engine_running(engine) == 1
            eventually(lambda: engine_running(engine) == 0, timeout_s=5)
            assert 'smg_engine_aborts_total{reason="cancelled_or_failed"} 1.0' in http.get("/metrics").text
    finally:
        node.stop()


def test_non_streaming_client_disconnect_aborts_too(slow_setup):
    engine, node = slow_setup
    with httpx2.Client(base_url=node.url, timeout=0.5) as http:
        with pytest.raises(httpx2.ReadTimeout):
            http.post("/v1/chat/completions", json={**LONG, "stream": False})
    eventually(lambda: engine_running(engine) == 0, timeout_s=5)


def test_engine_dying_mid_stream_gives_an_error_event_not_a_hang(slow_setup):
    engine, node = slow_setup
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
    stream = client.chat.completions.create(**LONG)
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    started = time.monotonic()
    engine.kill()
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            pass
    assert time.monotonic() - started < 10
    assert "engine" in str(e.value.message).lower()


def test_no_healthy_engine_is_503_with_retry_after(slow_setup):
    engine, node = slow_setup
    engine.kill()
    with httpx2.Client(base_url=node.url, timeout=30, headers=node.admin_headers) as http:
        r = http.post("/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 1})
        assert r.status_code == 503 and "retry-after" in r.headers
        assert r.json()["error"]["code"] in ("engine_unavailable", "no_healthy_worker")
        assert MODEL in r.json()["error"]["message"]  # named: in a fleet, which model is down
        # After the health checks notice, requests fail at once, naming the model. The node stays ready
        # (issue 40): the engine's outage is every node's, and a balancer that took nodes out for it would
        # take out the models that still have engines with them.
        eventually(lambda: http.post("/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 1}).json()
                 ["error"]["code"] == "no_healthy_worker", timeout_s=10)
        r = http.post("/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 1})
        assert r.status_code == 503 and MODEL in r.json()["error"]["message"] and "retry-after" in r.headers
        assert http.get("/readiness").status_code == 200


def test_a_second_engine_takes_over_by_retry(log_dir):
    dead = EngineProcess(SLOW_ENGINE, log_dir, "dead-engine")
    alive = EngineProcess(["--itl-base-s", "0"], log_dir, "alive-engine")
    node = NodeProcess(["--worker-urls", dead.url, alive.url, "--policy", "round_robin",
                        "--health-check-interval-secs", "60"], log_dir, "retry-node")
    try:
        dead.kill()
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
        for _ in range(4):  # round robin hits the dead engine every other time: retried on the other
            r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                               max_tokens=2)
            assert r.usage.completion_tokens == 2
        with httpx2.Client(base_url=node.url) as http:
            assert 'smg_retries_total{code="UNAVAILABLE"}' in http.get("/metrics").text
    finally:
        node.stop()
        alive.stop()

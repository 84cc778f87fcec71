"""A node's lifecycle: ready only once joined with the registry, SIGTERM drains, a second one stops at once."""

from __future__ import annotations

import signal
import threading
import time

import httpx2

from chaos.processes import EngineProcess, NodeProcess

from tests.support.nodes import ENGINE_ARGS, MODEL, registry_node_args as node_args
from tests.support.waiting import eventually, remains


def readiness(node: NodeProcess) -> tuple[int, str]:
    """(status, error message); (0, ...) when the node no longer accepts connections (also not ready)."""
    try:
        r = httpx2.get(node.url + "/readiness", timeout=5)
    except httpx2.TransportError as e:
        return 0, f"not ready: shutting down ({type(e).__name__})"
    return r.status_code, (r.json().get("error", {}).get("message", "") if r.status_code != 200 else "")


def test_a_request_to_a_node_not_joined_yet_waits_for_the_cluster_rather_than_fail(log_dir):
    """Issue 40: behind nginx (passive checks, no 503 counted) a restarted node must not answer 404 or 503 for
    models it does not know yet: a data-plane request waits for the cluster's registry (bounded), and says
    not_joined if it never comes."""
    engine = EngineProcess(["--zero-cost"], log_dir, "join-engine")
    nodes = []
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        nodes.append(NodeProcess(node_args(44, seed=45), log_dir, "join-alone"))  # its seed never comes
        r = httpx2.post(nodes[0].url + "/v1/chat/completions", json=chat, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_joined" and "retry-after" in r.headers
        nodes.append(NodeProcess(node_args(42, "--worker-urls", engine.url, seed=42), log_dir, "join-a"))
        nodes.append(NodeProcess(node_args(43, seed=42), log_dir, "join-b"))  # no engine of its own
        # At once, as a balancer sends to a node that just started: served once it holds the registry.
        r = httpx2.post(nodes[2].url + "/v1/chat/completions", json=chat, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    finally:
        for n in nodes:
            n.kill()
        engine.kill()


def test_ready_only_once_joined_and_the_registry_received(log_dir):
    engine = EngineProcess(["--zero-cost"], log_dir, "life-engine")
    # b has a healthy engine of its own, but its seed (a) is not up yet: not ready.
    b = NodeProcess(node_args(41, "--worker-urls", engine.url, seed=40), log_dir, "life-b")
    a = None
    try:
        eventually(lambda: b.alive and readiness(b)[1].startswith("not ready: not joined"), 15)
        remains(lambda: readiness(b)[0] == 503, 1)  # its engine is healthy meanwhile: joining is what it waits for
        a = NodeProcess(node_args(40, seed=40), log_dir, "life-a")  # the seed: ready with what b brings
        eventually(lambda: readiness(b)[0] == 200, 20)
        eventually(lambda: readiness(a)[0] == 200, 20)  # a got b's engine through the registry
    finally:
        for n in (a, b):
            if n is not None:
                n.kill()
        engine.kill()


def in_flight(node: NodeProcess) -> float:
    """Requests the node has on its engines (its metrics)."""
    text = httpx2.get(node.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("smg_worker_in_flight"))


def test_sigterm_drains_and_a_second_sigterm_stops_at_once(log_dir):
    engine = EngineProcess(ENGINE_ARGS, log_dir, "life-slow-engine")  # ~2 ms per token
    node = NodeProcess(["--worker-urls", engine.url, "--shutdown-grace-period-secs", "60"], log_dir, "life-node")
    try:
        eventually(lambda: readiness(node)[0] == 200, 15)
        answers: list[int] = []

        def long_request() -> None:
            try:
                r = httpx2.post(node.url + "/v1/completions", timeout=60,
                                json={"model": MODEL, "prompt": "go on", "max_tokens": 20000, "ignore_eos": True})
                answers.append(r.status_code)
            except httpx2.HTTPError:
                answers.append(-1)

        worker = threading.Thread(target=long_request)
        worker.start()
        eventually(lambda: in_flight(node) == 1, 15)  # the generation is running (it takes ~40 s)
        node.signal(signal.SIGTERM)
        eventually(lambda: readiness(node)[0] in (0, 503), 5)  # load balancers stop sending at once
        assert "shutting down" in readiness(node)[1]
        remains(lambda: node.alive, 1)  # still draining the in-flight request
        node.signal(signal.SIGTERM)
        started = time.monotonic()
        node.process.wait(10)
        assert time.monotonic() - started < 5  # the second signal does not wait for the drain
        worker.join(10)
        assert answers and answers[0] != 200  # cut short, not finished
    finally:
        node.kill()
        engine.kill()

"""`smg-node serve --workers 2`: two gateway processes on one port, sharing the node's state through the mesh."""

from __future__ import annotations

import os
import signal

import httpx2
import openai

from chaos.processes import EngineProcess, NodeProcess

from tests.support.nodes import MODEL
from tests.support.waiting import eventually

WAIT_S = 30.0


def answering_processes(url: str, attempts: int = 40) -> dict[int, dict]:
    """Health answers by process pid; a new connection each time, so the kernel spreads them."""
    seen: dict[int, dict] = {}
    for _ in range(attempts):
        with httpx2.Client(base_url=url, timeout=10) as fresh:
            body = fresh.get("/health").json()
        seen[body["process"]["pid"]] = body
        if len(seen) == 2:
            break
    return seen


def process_gone(pid: int) -> bool:
    """Reaped by its parent (the supervisor). Not "a zombie": the main thread becomes one while the
    process's other threads are still exiting, and its sockets close only when the last one is done."""
    return not os.path.exists(f"/proc/{pid}")


def _wait_for(check, what: str):
    return eventually(check, WAIT_S, what)


def test_two_processes_share_the_port_the_registry_and_survive_a_crash(log_dir):
    engine = EngineProcess(["--zero-cost"], log_dir, "workers-engine")
    second = EngineProcess(["--zero-cost"], log_dir, "workers-engine2")
    node = NodeProcess(["--workers", "2", "--worker-urls", engine.url], log_dir, "workers-node")
    try:
        processes = _wait_for(lambda: answering_processes(node.url) if len(answering_processes(node.url)) == 2
                             else None, "both processes answering")
        assert sorted(p["process"]["index"] for p in processes.values()) == [0, 1]
        assert all(p["healthy_workers"] == 1 for p in processes.values())

        client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0)
        for _ in range(6):
            out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3)
            assert out.usage.completion_tokens == 3

        # A worker added through one process reaches the other (the node's private mesh).
        with httpx2.Client(base_url=node.url, timeout=10, headers=node.admin_headers) as http:
            assert http.post("/workers", json={"url": second.url}).status_code in (200, 201, 202)
        _wait_for(lambda: all(p["workers"] == 2 for p in answering_processes(node.url).values())
                 and len(answering_processes(node.url)) == 2, "the added worker on both processes")

        # One process dies: the other keeps answering, the supervisor starts a new one.
        victim = next(pid for pid, p in processes.items() if p["process"]["index"] == 1)
        os.kill(victim, signal.SIGKILL)
        # Until a killed process's last thread is gone its listening socket stays in the port's
        # SO_REUSEPORT group, and connections the kernel hands it are reset when it closes: no
        # server can answer those (a load balancer retries them). Wait for the teardown to end.
        _wait_for(lambda: process_gone(victim), "the killed process's teardown")
        for _ in range(6):
            with httpx2.Client(base_url=node.url, timeout=10, headers=node.admin_headers) as fresh:
                assert fresh.get("/health").status_code == 200
        replaced = _wait_for(lambda: (lambda seen: seen if len(seen) == 2 and victim not in seen else None)(
            answering_processes(node.url)), "a new process 1")
        assert sorted(p["process"]["index"] for p in replaced.values()) == [0, 1]
        # The new process learnt the run-time worker from the mesh, not from its command line.
        _wait_for(lambda: all(p["workers"] == 2 for p in answering_processes(node.url).values()),
                 "the new process's registry")
    finally:
        code = node.stop(timeout_s=30)
        engine.stop()
        second.stop()
    assert code == 0
    port = node.url.rsplit(":", 1)[1]
    children = [line for line in os.popen("ps -eo args").read().splitlines()
                if "--worker-index" in line and f"--port {port}" in line]
    assert not children, children

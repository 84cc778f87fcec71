"""Three nodes share one worker registry over the mesh; health checks follow ring ownership."""

from __future__ import annotations

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess
from mesh.crypto import generate_key

from .conftest import MODEL
from .test_mesh_processes import eventually

BASE = 28946
KEY = generate_key()


def node_args(i: int, *extra: str) -> list[str]:
    return ["--mesh-bind", f"127.0.0.1:{BASE + i}", "--join", f"127.0.0.1:{BASE}", "--node-name", f"c{i}",
            "--encrypt", KEY, "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{BASE + 100 + i}",
            "--retry-join-interval-secs", "0.5", "--health-check-interval-secs", "0.5",
            "--health-failure-threshold", "2", *extra]


def workers(node: NodeProcess) -> dict[str, dict]:
    return {w["url"]: w for w in httpx2.get(node.url + "/workers", timeout=10).json()["workers"]}


@pytest.fixture
def cluster(log_dir):
    engines = [EngineProcess(["--itl-base-s", "0"], log_dir, f"reg-engine{i}") for i in range(2)]
    nodes = [NodeProcess(node_args(0, "--worker-urls", engines[0].url), log_dir, "reg-c0")]
    nodes += [NodeProcess(node_args(i), log_dir, f"reg-c{i}") for i in (1, 2)]
    yield engines, nodes
    for n in nodes:
        n.kill()
    for e in engines:
        e.kill()


def test_registry_is_shared_and_survives_its_registering_node(cluster):
    (e0, e1), (a, b, c) = cluster
    # A worker configured on node a serves through node c.
    eventually(lambda: all(e0.url in workers(n) for n in (a, b, c)), 30)
    client = openai.OpenAI(base_url=c.url + "/v1", api_key="x", max_retries=0)
    assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3).usage.completion_tokens == 3

    # Registration and removal through any node reach every node.
    assert httpx2.post(b.url + "/workers", json={"url": e1.url}, timeout=30).status_code == 201
    eventually(lambda: all(e1.url in workers(n) for n in (a, b, c)), 15)
    wid = workers(b)[e1.url]["id"]
    assert httpx2.delete(f"{c.url}/workers/{wid}", timeout=30).status_code == 202
    eventually(lambda: all(e1.url not in workers(n) for n in (a, b, c)), 15)

    # Exactly one node checks e0; the others show its verdict.
    checkers = {workers(n)[e0.url]["checked_by"] for n in (a, b, c)}
    assert len(checkers) == 1 and checkers.pop() in {"c0", "c1", "c2"}

    # Kill the node that registered it: the worker stays, healthy and checked by a live node.
    a.kill()
    eventually(lambda: all(workers(n)[e0.url]["checked_by"] in {"c1", "c2"} for n in (b, c)), 30)
    assert all(workers(n)[e0.url]["healthy"] for n in (b, c))
    assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "still"}],
                                          max_tokens=2).usage.completion_tokens == 2

    # The engine dies: its owner notices, and the other node learns the verdict from the document.
    e0.kill()
    eventually(lambda: not any(workers(n)[e0.url]["healthy"] for n in (b, c)), 30)

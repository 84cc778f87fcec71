"""What tests that start nodes share: the simulated engines' model, a node's tokens for some messages, and the
flags of a local three-node cluster sharing one worker registry (the cluster registry's, key store's, lifecycle's
and cluster cache's tests)."""

from __future__ import annotations

import httpx2

from chaos.processes import NodeProcess
from mesh.crypto import generate_key

MODEL = "qwen3-sim"
# Fast but not instant engines: streams take a few milliseconds per token, so a
# test can disconnect or kill mid-stream deterministically enough to observe.
ENGINE_ARGS = ["--itl-base-s", "0.002", "--itl-per-running-s", "0", "--prefill-s-per-token", "0.000001"]


def prompt_ids(http, messages):
    r = http.post("/v1/tokenize", json={"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


BASE = 28946
KEY = generate_key()


def registry_node_args(i: int, *extra: str, seed: int = 0) -> list[str]:
    return ["--mesh-bind", f"127.0.0.1:{BASE + i}", "--join", f"127.0.0.1:{BASE + seed}", "--node-name", f"c{i}",
            "--encrypt", KEY, "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{BASE + 100 + i}",
            "--retry-join-interval-secs", "0.5", "--health-check-interval-secs", "0.5",
            "--health-failure-threshold", "2", *extra]


def workers(node: NodeProcess) -> dict[str, dict]:
    answer = httpx2.get(node.url + "/workers", timeout=10, headers=node.admin_headers)
    return {w["url"]: w for w in answer.json()["workers"]}

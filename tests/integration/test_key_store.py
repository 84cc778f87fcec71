"""Keys made at run time on one node hold on every node: created and revoked with the CLI on node A,
used and refused on nodes B and C within the bound of gateway/auth/key_store.py (push_pull_interval_s:
10 s with the local preset; gossip carries it in well under a second)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx2

from chaos.processes import NodeProcess

from tests.support.nodes import MODEL
from tests.support.nodes import registry_node_args as node_args

BOUND_S = 10.0  # MeshConfig.local().push_pull_interval_s


def keys_cli(node: NodeProcess, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "keys", "--url", node.url, *args], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def status(node: NodeProcess, secret: str) -> int:
    return httpx2.post(node.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1},
                       headers={"authorization": f"Bearer {secret}"}, timeout=10).status_code


def within(predicate, bound_s: float) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < bound_s, f"not within {bound_s}s"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_key_created_and_revoked_on_one_node_holds_on_every_node(engines, log_dir):
    nodes = [NodeProcess(node_args(50, "--worker-urls", engines[0].url, seed=50), log_dir, "keys-c0")]
    nodes += [NodeProcess(node_args(50 + i, seed=50), log_dir, f"keys-c{i}") for i in (1, 2)]
    try:
        a, b, c = nodes
        within(lambda: all(httpx2.get(n.url + "/readiness").status_code == 200 for n in nodes), 30)
        created = json.loads(keys_cli(a, "create", "app", "--tenant", "acme"))
        secret = created["key"]
        seen_s = within(lambda: status(b, secret) == 200 and status(c, secret) == 200, BOUND_S)
        # With a user key in the cluster, inference needs a key on every node.
        assert status(b, "guessed-key") == 401 and status(c, "another-guess") == 401
        listed = keys_cli(b, "list")
        assert created["id"] in listed and secret not in listed
        keys_cli(a, "revoke", created["id"])
        revoked_s = within(lambda: status(b, secret) == 401 and status(c, secret) == 401, BOUND_S)
        print(f"key seen on every node after {seen_s:.2f}s, revoked everywhere after {revoked_s:.2f}s")
    finally:
        for n in nodes:
            n.kill()

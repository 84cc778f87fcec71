"""deploy/: three nodes behind a real nginx, then a real HAProxy; losing a node loses no request that had not started."""

from __future__ import annotations

import shutil

import httpx2
import openai
import pytest

from tests.support.nodes import MODEL
from tests.support.waiting import eventually


@pytest.fixture(params=["nginx", "haproxy"])
def local_cluster(request, log_dir):
    lb = request.param
    if shutil.which(lb) is None:
        pytest.skip(f"{lb} not installed (.ci/run installs it: apt-get install {lb})")
    from chaos.local_cluster import LocalCluster
    cluster = LocalCluster(nodes=3, engines=2, port=18080, mesh_base_port=18946, log_dir=log_dir / f"{lb}-cluster",
                           engine_args=["--itl-base-s", "0.001"], lb=lb)
    yield cluster
    cluster.stop()


def test_nodes_behind_a_load_balancer_survive_a_killed_node(local_cluster):
    # Engines registered on node0 reach every node through the mesh.
    eventually(lambda: all(len(httpx2.get(n.url + "/workers", headers=n.admin_headers).json()["workers"]) == 2
                           for n in local_cluster.nodes), 30)
    # The control plane and /metrics are not served through the balancer, even with the admin key.
    admin = local_cluster.nodes[0].admin_headers
    for path in ("/workers", "/admin/rate-limits", "/metrics"):
        assert httpx2.get(local_cluster.url + path, headers=admin).status_code == 403, path
    client = openai.OpenAI(base_url=local_cluster.url + "/v1", api_key="x", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "through nginx"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, stream=True) if c.choices)
    assert streamed == first.choices[0].message.content  # SSE passes through unbuffered and whole

    local_cluster.nodes[1].kill()
    # Every request still succeeds: the balancer retries the connection refused by the dead node.
    for i in range(12):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2)
        assert r.usage.completion_tokens == 2

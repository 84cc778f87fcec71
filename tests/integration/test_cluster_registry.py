"""Three nodes share one worker registry over the mesh; health checks follow ring ownership."""

from __future__ import annotations

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess

from tests.support.nodes import MODEL
from tests.support.waiting import eventually
from tests.support.nodes import registry_node_args as node_args, workers

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
    # A worker configured on node a serves through node c, once c has both the registration and a health
    # verdict (they travel separately: the owner's first check may land after the entry).
    eventually(lambda: all(workers(n).get(e0.url, {}).get("healthy") for n in (a, b, c)), 30)
    client = openai.OpenAI(base_url=c.url + "/v1", api_key="x", max_retries=0)
    assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3).usage.completion_tokens == 3

    # Registration and removal through any node reach every node.
    assert httpx2.post(b.url + "/workers", json={"url": e1.url}, timeout=30, headers=b.admin_headers).status_code == 201
    eventually(lambda: all(e1.url in workers(n) for n in (a, b, c)), 15)
    wid = workers(b)[e1.url]["id"]
    assert httpx2.delete(f"{c.url}/workers/{wid}", timeout=30, headers=c.admin_headers).status_code == 202
    eventually(lambda: all(e1.url not in workers(n) for n in (a, b, c)), 15)

    # Once the nodes agree on the members, exactly one checks e0; the others show its verdict.
    eventually(lambda: len({workers(n)[e0.url]["checked_by"] for n in (a, b, c)}) == 1, 20)
    assert workers(a)[e0.url]["checked_by"] in {"c0", "c1", "c2"}

    # Kill the node that registered it: the worker stays, healthy and checked by a live node.
    a.kill()
    eventually(lambda: all(workers(n)[e0.url]["checked_by"] in {"c1", "c2"} for n in (b, c)), 30)
    assert all(workers(n)[e0.url]["healthy"] for n in (b, c))
    assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "still"}],
                                          max_tokens=2).usage.completion_tokens == 2

    # The engine dies: its owner notices, and the other node learns the verdict from the document.
    e0.kill()
    eventually(lambda: not any(workers(n)[e0.url]["healthy"] for n in (b, c)), 30)


def kv_views(nodes, engine_url):
    out = []
    for n in nodes:
        w = workers(n).get(engine_url)
        out.append(None if w is None else (w["kv_index"]["next_sequence"], w["kv_index"]["fingerprint"]))
    return out


def test_kv_index_is_the_same_on_every_node_and_rebuilt_after_a_restart(log_dir):
    # One engine: its events are followed only with --kv-events-always (no routing choice otherwise).
    engine = EngineProcess(["--zero-cost", "--block-size", "16"], log_dir, "kv-share-engine")
    nodes = [NodeProcess(node_args(10, "--worker-urls", engine.url, "--kv-events-always", seed=10), log_dir, "kv-c0")]
    nodes += [NodeProcess(node_args(10 + i, "--kv-events-always", seed=10), log_dir, f"kv-c{i}") for i in (1, 2)]
    try:
        eventually(lambda: all(engine.url in workers(n) for n in nodes), 30)
        client = openai.OpenAI(base_url=nodes[1].url + "/v1", api_key="x", max_retries=0)
        system = "You are a meticulous assistant who answers in full sentences. " * 20
        for i in range(6):
            client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
                {"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}])
        # Only two nodes follow the engine's stream; all three hold the same index.
        eventually(lambda: len(set(kv_views(nodes, engine.url))) == 1 and kv_views(nodes, engine.url)[0][0] > 1, 20,
                   lambda: kv_views(nodes, engine.url))
        # Once every node sees all three members, exactly the engine's two ring owners follow it.
        eventually(lambda: sum(workers(n)[engine.url]["kv_index"]["following"] for n in nodes) == 2, 20,
                   lambda: [workers(n)[engine.url]["kv_index"] for n in nodes])
        # A node that restarts rebuilds the index from its peers.
        nodes[2].kill()
        nodes[2] = NodeProcess(node_args(12, "--kv-events-always", seed=10), log_dir, "kv-c2-again")
        eventually(lambda: len(set(kv_views(nodes, engine.url))) == 1, 30, lambda: kv_views(nodes, engine.url))
        assert workers(nodes[2])[engine.url]["kv_index"]["blocks"] >= 14  # the shared system prompt's blocks
    finally:
        for n in nodes:
            n.kill()
        engine.kill()

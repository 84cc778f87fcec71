"""The response cache the cluster shares (issue 63), on three real nodes driven by the openai and anthropic SDKs:
the same deterministic request through every node reaches the engines once; another tenant's identical request
reaches them again; a streamed replay parses exactly as the original stream did; an answer's cost is charged once
(hits are free by default)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
import openai
import pytest

from chaos.processes import NodeProcess

from tests.support.node_pairs import admin, alive_members
from tests.support.nodes import MODEL
from tests.support.waiting import eventually

BASE = 23800  # this file's mesh ports


def metric_sum(nodes: "list[NodeProcess]", name: str, label: str) -> float:
    """A counter's rows carrying ``label``, added up over every node."""
    total = 0.0
    for node in nodes:
        for line in httpx2.get(node.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + "{") and label in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def completion_tokens(nodes: "list[NodeProcess]") -> float:
    """Tokens the engines generated for the cluster's requests (counted by the node that asked them)."""
    return metric_sum(nodes, "smg_tokens_total", 'kind="completion"')


def cache_stores(nodes: "list[NodeProcess]") -> float:
    return metric_sum(nodes, "smg_cache_store_events_total", 'event="stored"')


def kept_on_owners(nodes: "list[NodeProcess]", stores_before: float) -> None:
    """Until the answer just sent is on both its owners: it is put there in the background once answered, and a
    node asked before that misses (and asks an engine), as a client of a real cluster could."""
    eventually(lambda: cache_stores(nodes) >= stores_before + 2, 30, "the answer kept on its two owners")


MODELS_TOML = f"""
[models.always]
targets = [{{ pool = "{MODEL}" }}]
cache = true
cache_ttl_secs = 600

[models.never]
targets = [{{ pool = "{MODEL}" }}]
cache = false
"""


@pytest.fixture(scope="module")
def cluster(engines, log_dir, tmp_path_factory):
    models = tmp_path_factory.mktemp("cache-routes") / "models.toml"
    models.write_text(MODELS_TOML)
    nodes = []
    try:
        for i in range(3):
            nodes.append(NodeProcess([
                "--mesh-bind", f"127.0.0.1:{BASE + i}", "--join", f"127.0.0.1:{BASE}", "--node-name", f"c{i}",
                "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{BASE + 100 + i}", "--retry-join-interval-secs",
                "0.5", "--worker-urls", *[e.url for e in engines], "--response-cache", "--workers", "1",
                "--models-config", str(models)],
                log_dir, f"cache-c{i}"))
        eventually(lambda: all(alive_members(n) == 3 for n in nodes), 60, "three members alive on every node")
        keys = {tenant: admin(nodes[0], "POST", "/admin/api-keys", {"name": tenant, "tenant": tenant}).json()["key"]
                for tenant in ("red", "blue")}
        eventually(lambda: all(httpx2.get(n.url + "/v1/models", headers={"authorization": f"Bearer {k}"},
                                      timeout=10).status_code == 200 for n in nodes for k in keys.values()), 30,
               "the keys known everywhere")
        yield nodes, keys
    finally:
        for n in nodes:
            n.kill()


def chat(node: NodeProcess, key: str, text: str, **extra):
    client = openai.OpenAI(base_url=node.url + "/v1", api_key=key, max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=8, temperature=0, messages=[{"role": "user", "content": text}], **extra)


def until_hit(ask, what: str) -> "tuple[Any, int]":
    """``ask()`` until its answer is a hit, and how many misses that took. The answer is on its owners already:
    a miss is a lookup whose owner answered later than the cache waits (a loaded machine), and the engine's
    answer it got instead is not kept over the first one, so the next look hits."""
    answers = []
    eventually(lambda: answers.append(ask()) or answers[-1][0] == "hit", 30, what)
    return answers[-1][1], len(answers) - 1


def cached_on(node: NodeProcess, key: str, text: str, **extra):
    """The request through ``node`` until it is a hit, and the misses that took."""
    def ask():
        raw = chat(node, key, text, **extra)
        return raw.headers["x-smg-cache"], raw
    return until_hit(ask, f"a hit on {node.name}")


def test_one_deterministic_request_through_three_nodes_reaches_the_engines_once(cluster):
    nodes, keys = cluster
    before, stores = completion_tokens(nodes), cache_stores(nodes)
    first = chat(nodes[0], keys["red"], "what is a cache?")
    assert first.headers["x-smg-cache"] == "miss"
    answer = first.parse()
    generated = completion_tokens(nodes) - before
    assert generated == answer.usage.completion_tokens > 0
    kept_on_owners(nodes, stores)
    misses = 0
    for node in nodes[1:]:
        hit, missed = cached_on(node, keys["red"], "what is a cache?")
        misses += missed
        assert hit.parse().model_dump() == answer.model_dump()
    # Order and defaults do not matter: the same question asked otherwise is the same answer.
    same, missed = cached_on(nodes[2], keys["red"], "what is a cache?", n=1, presence_penalty=0)
    misses += missed
    assert same.parse().model_dump() == answer.model_dump()
    assert completion_tokens(nodes) - before == (1 + misses) * generated, "a hit reached an engine"

    # Another tenant's identical request is its own: the engines answer it again.
    other = chat(nodes[1], keys["blue"], "what is a cache?")
    assert other.headers["x-smg-cache"] == "miss"
    assert completion_tokens(nodes) - before == (2 + misses) * generated

    # Opted out: answered by an engine whatever the cache holds.
    fresh = openai.OpenAI(base_url=nodes[0].url + "/v1", api_key=keys["red"], max_retries=0)
    raw = fresh.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=8, temperature=0, messages=[{"role": "user", "content": "what is a cache?"}],
        extra_headers={"cache-control": "no-cache"})
    assert "x-smg-cache" not in raw.headers
    assert completion_tokens(nodes) - before == (3 + misses) * generated


def test_a_streamed_replay_parses_as_the_original_stream_did(cluster):
    nodes, keys = cluster

    def stream(node: NodeProcess):
        client = openai.OpenAI(base_url=node.url + "/v1", api_key=keys["red"], max_retries=0)
        with client.chat.completions.with_streaming_response.create(
                model=MODEL, max_tokens=8, seed=11, stream=True, stream_options={"include_usage": True},
                messages=[{"role": "user", "content": "stream it"}]) as response:
            return response.headers["x-smg-cache"], [chunk.model_dump() for chunk in response.parse()]

    stores = cache_stores(nodes)
    status, original = stream(nodes[0])
    assert status == "miss" and original[-1]["usage"]["completion_tokens"] > 0
    kept_on_owners(nodes, stores)
    replay, _ = until_hit(lambda: stream(nodes[1]), "a streamed hit")
    assert replay == original


def test_anthropic_messages_are_cached_too(cluster):
    nodes, keys = cluster

    def ask(node: NodeProcess):
        client = anthropic.Anthropic(base_url=node.url, api_key=keys["blue"], max_retries=0)
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=8, extra_body={"temperature": 0},
                                                       messages=[{"role": "user", "content": "bonjour"}])
        return raw.headers["x-smg-cache"], raw.parse()

    stores = cache_stores(nodes)
    status, first = ask(nodes[2])
    assert status == "miss"
    kept_on_owners(nodes, stores)
    again, _ = until_hit(lambda: ask(nodes[0]), "a Messages hit")
    assert again.model_dump() == first.model_dump()


def test_a_routes_setting_caches_every_request_of_its_model_or_none(cluster):
    nodes, keys = cluster
    client = openai.OpenAI(base_url=nodes[0].url + "/v1", api_key=keys["red"], max_retries=0)

    def ask(model: str, **sampling):
        return client.chat.completions.with_raw_response.create(
            model=model, max_tokens=8, messages=[{"role": "user", "content": "routes decide"}], **sampling)

    assert ask("always", temperature=0.9).headers["x-smg-cache"] == "miss"  # sampled, cached all the same
    eventually(lambda: ask("always", temperature=0.9).headers["x-smg-cache"] == "hit", 10, "a hit of a sampled one")
    never = ask("never", temperature=0)
    assert never.status_code == 200 and "x-smg-cache" not in never.headers  # deterministic, never cached

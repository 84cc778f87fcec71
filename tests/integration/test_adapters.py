"""LoRA adapters end to end: simulated SGLang engines that load adapters from their disk (Load/Unload/List, a
request's lora_id: chaos/sim_engine/adapters.py), a vLLM engine of the same model (its contract carries no adapter),
one node, the admin API, the CLI and the openai SDK. The answers tell which adapter wrote them (the engine mixes the
adapter's id into its seed): an answer that reached the vLLM engine, or an engine without the adapter loaded, or
with another adapter, fails the comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess
from chaos.sim_engine.adapters import adapter_seed
from chaos.sim_engine.output import output_token_ids, word_token_ids
from gateway.tokenizer.bundled import default_tokenizer_dir
from tests.support.nodes import ENGINE_ARGS, MODEL
from tests.support.waiting import eventually

VLLM_ONLY = "vllm-only-sim"
SLOTS = 2  # adapters a worker holds at once (the node's bound and the engines')


@pytest.fixture(scope="module")
def engines(log_dir):
    started = {name: EngineProcess([*ENGINE_ARGS, *args], log_dir, f"lora-{name}") for name, args in (
        ("sglang0", ["--services", "sglang", "--max-loras", str(SLOTS)]),
        ("sglang1", ["--services", "sglang", "--max-loras", str(SLOTS)]),
        ("vllm", ["--services", "vllm"]),
        ("vllm-only", ["--services", "vllm", "--model-name", VLLM_ONLY]))}
    yield started
    for e in started.values():
        e.stop()


@pytest.fixture(scope="module")
def node(engines, log_dir):
    n = NodeProcess(["--worker-urls", *[e.url for e in engines.values()], "--health-check-interval-secs", "1",
                     "--policy", "round_robin", "--max-adapters-per-worker", str(SLOTS)], log_dir, "lora-node")
    yield n
    n.stop()


@pytest.fixture(scope="module")
def admin(node):
    with httpx2.Client(base_url=node.url, headers=node.admin_headers, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _adapter_dir(tmp_path_factory, name: str) -> str:
    path = tmp_path_factory.mktemp(name)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "peft_type": "LORA"}))
    return str(path)


@pytest.fixture(scope="module")
def words():
    return word_token_ids(default_tokenizer_dir() / "tokenizer.json")


def _expected(node, tokenizer, words, messages, adapter_id: str, count: int) -> str:
    ids = httpx2.post(node.url + "/v1/tokenize", json={"model": MODEL, "messages": messages}).json()["tokens"]
    return tokenizer.decode(output_token_ids(words, adapter_seed(adapter_id, ids, None), count))


def _define(admin, name: str, path: str, base: str = MODEL, **extra) -> dict:
    r = admin.put(f"/admin/adapters/{name}", json={"base": base, "path": path, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _held(admin) -> "dict[str, list[str]]":
    return {w["url"]: w.get("adapters", []) for w in admin.get("/workers").json()["workers"]}


def test_requests_naming_an_adapter_are_answered_with_it_by_workers_that_hold_it(node, admin, client, engines,
                                                                                  tokenizer, words, tmp_path_factory):
    spec = _define(admin, "alpha", _adapter_dir(tmp_path_factory, "alpha"))["adapter"]
    assert spec["base"] == MODEL and spec["loaded_on"] == [] and spec["id"].startswith("alpha-lora")
    listed = {m.id: m.model_extra for m in client.models.list().data}
    assert listed["alpha"]["parent"] == MODEL and listed["alpha"]["root"] == spec["path"]
    messages = [{"role": "user", "content": "hello adapter"}]
    expected = _expected(node, tokenizer, words, messages, spec["id"], 5)
    base_answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
    assert base_answer.choices[0].message.content != expected  # the adapter changes the answer
    for model in ("alpha", f"{MODEL}:alpha") * 3:  # round robin would reach every worker: the vLLM one never
        answer = client.chat.completions.create(model=model, messages=messages, max_tokens=5)
        assert answer.choices[0].message.content == expected and answer.model == "alpha"  # its own name
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="alpha", messages=messages, max_tokens=5, stream=True) if c.choices)
    assert streamed == expected
    held = _held(admin)
    assert held[engines["vllm"].url] == [] and spec["id"] in held[engines["sglang0"].url] + held[engines["sglang1"].url]
    # Loaded on one worker, the adapter's requests stay there (no second load while one holds it).
    assert sum(spec["id"] in held[engines[k].url] for k in ("sglang0", "sglang1")) == 1


def test_a_worker_holds_at_most_its_slots_the_least_recent_unloaded_pinned_never(admin, client, engines,
                                                                               tmp_path_factory):
    pinned = _define(admin, "pinned", _adapter_dir(tmp_path_factory, "pinned"), pinned=True, load="now")
    assert set(pinned["loaded"].values()) == {"loaded"} and len(pinned["loaded"]) == 2  # the two SGLang workers
    ids = {"pinned": pinned["adapter"]["id"]}
    for name in ("beta", "gamma", "delta"):
        ids[name] = _define(admin, name, _adapter_dir(tmp_path_factory, name))["adapter"]["id"]
        client.completions.create(model=name, prompt="x", max_tokens=2)
    for url in (engines["sglang0"].url, engines["sglang1"].url):
        held = _held(admin)[url]
        assert len(held) <= SLOTS and ids["pinned"] in held
    # The adapter used last is held somewhere; one used before it was unloaded to make room.
    every = _held(admin)[engines["sglang0"].url] + _held(admin)[engines["sglang1"].url]
    assert ids["delta"] in every and ids["beta"] not in every


def test_adapters_that_cannot_load_or_have_no_worker_are_clear_errors(admin, client, tmp_path_factory):
    _define(admin, "broken", str(tmp_path_factory.mktemp("empty")))  # no adapter_config.json: the engine refuses
    with pytest.raises(openai.InternalServerError) as failed:
        client.completions.create(model="broken", prompt="x", max_tokens=2)
    assert failed.value.status_code == 503 and failed.value.code == "adapter_load_failed"
    _define(admin, "on-vllm", _adapter_dir(tmp_path_factory, "on-vllm"), base=VLLM_ONLY)
    with pytest.raises(openai.InternalServerError) as unsupported:
        client.completions.create(model="on-vllm", prompt="x", max_tokens=2)
    assert unsupported.value.code == "adapters_not_supported"
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="beta", input="x")


@pytest.mark.parametrize("name, body, status", [
    ("bad:name", {"base": MODEL, "path": "/x"}, 404),  # not a path the admin API routes
    ("ok", {"path": "/x"}, 400),  # no base
    ("ok", {"base": MODEL}, 400),  # no path
    ("ok", {"base": MODEL, "path": "/x", "pinned": "yes"}, 400),
    ("ok", {"base": MODEL, "path": "/x", "load": "later"}, 400),
    (MODEL, {"base": MODEL, "path": "/x"}, 400),  # a model's own name
])
def test_bad_definitions_are_refused(admin, name, body, status):
    assert admin.put(f"/admin/adapters/{name}", json=body).status_code == status


def test_the_control_plane_needs_an_admin_credential(node):
    assert httpx2.get(node.url + "/admin/adapters").status_code == 401
    assert httpx2.put(node.url + "/admin/adapters/x", json={"base": MODEL, "path": "/x"}).status_code == 401


def test_the_cli_defines_lists_unloads_and_removes(node, admin, client, tmp_path_factory):
    path = _adapter_dir(tmp_path_factory, "cli")
    env = {**os.environ, **node.admin_env}

    def cli(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "gateway.cli", "adapters", *args, "--url", node.url],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "loaded:" in cli("add", "from-cli", "--base", MODEL, "--path", path, "--load-now")
    listing = cli("list")
    assert "from-cli" in listing and path in listing
    client.completions.create(model="from-cli", prompt="x", max_tokens=2)
    assert "unloaded" in cli("unload", "from-cli")
    assert not next(a for a in admin.get("/admin/adapters").json()["adapters"] if a["name"] == "from-cli")["loaded_on"]
    client.completions.create(model="from-cli", prompt="x", max_tokens=2)  # loaded again where it goes
    assert "removed from-cli" in cli("remove", "from-cli")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="from-cli", prompt="x", max_tokens=2)
    eventually(lambda: all("from-cli" not in str(h) for h in _held(admin).values()) or None, timeout_s=10)


def test_a_cluster_shares_definitions_and_which_worker_holds_which(engines, log_dir, tmp_path_factory, tokenizer,
                                                                   words):
    """Defined on one node, an adapter is served by the other; the engines' holdings, listed by the node that
    checks each worker, reach the other node through the cluster's document."""
    from tests.support.node_pairs import mesh_args, start_pair

    urls = [engines["sglang0"].url, engines["sglang1"].url]
    nodes = start_pair(lambda i, ports: [*mesh_args(i, ports, "lora"), "--worker-urls", *urls,
                                         "--health-check-interval-secs", "0.5", "--adapter-poll-interval-secs",
                                         "0.5"], log_dir, "lora-pair")
    try:
        first, second = nodes
        with httpx2.Client(base_url=first.url, headers=first.admin_headers, timeout=30) as admin:
            spec = _define(admin, "shared", _adapter_dir(tmp_path_factory, "shared"), load="now")["adapter"]
        assert sorted(spec["loaded_on"]) == sorted(w["id"] for w in httpx2.get(
            first.url + "/workers", headers=first.admin_headers).json()["workers"])
        with httpx2.Client(base_url=second.url, headers=second.admin_headers, timeout=30) as admin:
            eventually(lambda: next((a for a in admin.get("/admin/adapters").json()["adapters"]
                                     if a["name"] == "shared" and len(a["loaded_on"]) == 2), None), 20,
                       "the second node did not learn the adapter and its holders")
            messages = [{"role": "user", "content": "across the cluster"}]
            answer = openai.OpenAI(base_url=second.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
                model="shared", messages=messages, max_tokens=4)
            assert answer.choices[0].message.content == _expected(second, tokenizer, words, messages, spec["id"], 4)
            admin.delete("/admin/adapters/shared").raise_for_status()
        eventually(lambda: httpx2.post(first.url + "/v1/completions", json={
            "model": "shared", "prompt": "x", "max_tokens": 1}).status_code == 404 or None, 20)
    finally:
        for n in nodes:
            n.stop()

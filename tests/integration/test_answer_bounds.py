"""Issues 33 and 59: one answer ate the heap. n = 16, top_logprobs = 20, max_tokens = 16,000, not streamed: a 447 MB body,
the gateway at 3.4 GiB, another client waiting 17.7 s; streamed, 721 MiB held. An answer held whole is bounded
(--max-answer-bytes): refused before it runs when asked for outright, stopped when it grows past the bound; a
stream holds none of what it sent. Embeddings are answers too (issue 59): 2,048 inputs for a 4,096-value model
were a 188 MB answer, four at once +3.4 GiB and a 4 s stall for everyone; refused now before anything is
embedded, or stopped as the vectors arrive past the bound."""

from __future__ import annotations

import threading
import time

import httpx2
import pytest

from chaos.processes import EngineProcess, NodeProcess
from tests.support.waiting import eventually

MODEL = "qwen3-sim"
BOUND = 2_000_000
ATTACK = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "n": 16, "logprobs": True,
          "top_logprobs": 20, "temperature": 1.0, "ignore_eos": True}


EMBED = "embed-4096"


@pytest.fixture(scope="module")
def node(log_dir):
    engine = EngineProcess(["--zero-cost"], log_dir, "answer-bounds-engine")
    embedder = EngineProcess(["--task", "embed", "--model-name", EMBED, "--embedding-dim", "4096",
                              "--max-context-tokens", "512"], log_dir, "answer-bounds-embed")
    n = NodeProcess(["--worker-urls", engine.url, embedder.url, "--max-answer-bytes", str(BOUND)], log_dir,
                    "answer-bounds-node")
    yield n
    n.stop()
    engine.stop()
    embedder.stop()


def _running_on_engine(node) -> float:
    text = httpx2.get(node.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("smg_worker_in_flight"))


def test_an_answer_asked_for_beyond_the_bound_is_refused_before_it_runs(node):
    started = time.monotonic()
    r = httpx2.post(node.url + "/v1/chat/completions", json={**ATTACK, "max_tokens": 16000}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "answer_too_large"
    assert "stream it" in r.json()["error"]["message"] and time.monotonic() - started < 2


def test_an_answer_that_grows_past_the_bound_is_stopped_and_its_generation_aborted(node):
    r = httpx2.post(node.url + "/v1/chat/completions", json=ATTACK, timeout=120)  # bounded only by the context
    assert r.status_code == 400 and r.json()["error"]["code"] == "answer_too_large"
    eventually(lambda: _running_on_engine(node) == 0, 10, "the generation was not aborted on the engine")
    # A plain answer under the bound is untouched.
    ok = httpx2.post(node.url + "/v1/chat/completions", json={**ATTACK, "n": 2, "max_tokens": 8}, timeout=30)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def test_a_stream_holds_nothing_it_sent(node):
    before = _rss_bytes(node.process.pid)
    size = 0
    with httpx2.stream("POST", node.url + "/v1/chat/completions", timeout=300,
                       json={**ATTACK, "n": 4, "max_tokens": 8000, "stream": True}) as r:
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            size += len(chunk)
    grown = _rss_bytes(node.process.pid) - before
    assert size > 50 * 2 ** 20  # 4 x 8,000 tokens x 21 alternatives: ~55 MiB went through
    assert grown < 40 * 2 ** 20, f"the node grew {grown / 2 ** 20:.0f} MiB streaming {size / 2 ** 20:.0f} MiB"


def _embed(node, inputs: int, encoding_format: str = "float") -> httpx2.Response:
    return httpx2.post(node.url + "/v1/embeddings", timeout=120, json={
        "model": EMBED, "input": [f"input {i}" for i in range(inputs)], "encoding_format": encoding_format})


def test_embeddings_past_the_bound_are_refused_before_anything_is_embedded(node):
    for encoding_format in ("float", "base64"):
        started = time.monotonic()
        r = _embed(node, 2048, encoding_format)
        assert r.status_code == 400 and r.json()["error"]["code"] == "answer_too_large", r.text
        assert "2048 vectors of 4096 values" in r.json()["error"]["message"]
        assert time.monotonic() - started < 2  # 2,048 Embed calls would take longer
    ok = _embed(node, 16, "base64")  # 16 x 4,096 as base64: ~350 KB
    assert ok.status_code == 200 and len(ok.json()["data"]) == 16


def test_embeddings_that_grow_past_the_bound_as_they_arrive_are_stopped(node):
    # 28 x 4,096 values: at least 1.84 MB by the floor (16 bytes a value), ~2.4 MB as the vectors print.
    r = _embed(node, 28)
    assert r.status_code == 400 and "grew past the bound" in r.json()["error"]["message"], r.text


def test_four_of_the_largest_embeddings_at_once_cost_no_memory_and_no_stall(node):
    before = _rss_bytes(node.process.pid)
    answers: list[int] = []
    attacks = [threading.Thread(target=lambda: answers.append(_embed(node, 2048).status_code)) for _ in range(4)]
    for attack in attacks:
        attack.start()
    started = time.monotonic()
    r = httpx2.post(node.url + "/v1/chat/completions", timeout=30,
                    json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    other_s = time.monotonic() - started
    for attack in attacks:
        attack.join(60)
    assert answers == [400] * 4 and r.status_code == 200
    grown = _rss_bytes(node.process.pid) - before
    assert grown < 40 * 2 ** 20 and other_s < 2, (grown, other_s)

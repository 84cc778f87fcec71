"""A real engine (vLLM on CPU, smg-grpc-servicer) driven through a node with the openai SDK.

Opt-in: see conftest.py. The model has random weights, so texts are gibberish,
but every message crosses the real servicer and the real engine.
"""

from __future__ import annotations

import time

import httpx2
import pytest
from tests.support.vllm import engine_running


pytestmark = pytest.mark.real_engine


def test_tokenizer_came_from_the_engine(node):
    assert "(GetTokenizer)" in node.log_text() or "fetched from" in node.log_text()


def test_chat_and_usage(client, model):
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                       temperature=0)
    assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].message.content, str)


def test_completions_stream_equals_non_stream_with_greedy_sampling(client, model):
    args = dict(model=model, prompt="The capital of France is", max_tokens=12, temperature=0)
    whole = client.completions.create(**args).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True) if c.choices)
    assert streamed == whole


def test_stop_string_cuts_the_real_output(client, model):
    args = dict(model=model, messages=[{"role": "user", "content": "Count to ten"}], max_tokens=24, temperature=0)
    full = client.chat.completions.create(**args).choices[0].message.content
    stop = full[len(full) // 2: len(full) // 2 + 3]
    if not stop.strip():
        pytest.fail(f"could not pick a stop string from {full!r}")
    r = client.chat.completions.create(**args, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[:full.index(stop)]


def test_disconnect_aborts_on_the_real_engine(node, vllm_url, model):
    body = {"model": model, "messages": [{"role": "user", "content": "go"}], "max_tokens": 1500, "stream": True,
            "ignore_eos": True}
    with httpx2.Client(base_url=node.url, timeout=120) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert engine_running(vllm_url) == 1
    deadline = time.monotonic() + 10
    while engine_running(vllm_url) != 0:
        assert time.monotonic() < deadline, "the engine still runs the request of a gone client"
        time.sleep(0.1)

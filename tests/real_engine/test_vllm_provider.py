"""vLLM's own OpenAI server as a hosted provider (a route's openai_compatible target, gateway/providers/openai.py):
the node's answers through the route equal vLLM's own (greedy), whole and streamed, from OpenAI chat, Anthropic's
Messages and the Responses API; a dead first target falls back to it. vLLM's Responses API and its
Anthropic-compatible Messages endpoint are targets too (``api = "responses"``, and the anthropic wire)."""

from __future__ import annotations

import socket

import httpx2
import openai
import pytest

from chaos.processes import NodeProcess, default_log_dir

pytestmark = pytest.mark.real_engine


@pytest.fixture(scope="module")
def served_model(vllm_openai_url):
    return httpx2.get(vllm_openai_url + "/v1/models", timeout=30).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def routed(vllm_openai_url, served_model, tmp_path_factory):
    with socket.socket() as s:  # a port nothing listens on: the first target that never answers
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    config = tmp_path_factory.mktemp("routes") / "models.toml"
    config.write_text(f"""
[targets.vllm]
provider = "openai_compatible"
model = "{served_model}"
base_url = "{vllm_openai_url}/v1"
timeout_secs = 300

[targets.vllm-responses]
provider = "openai_compatible"
model = "{served_model}"
base_url = "{vllm_openai_url}/v1"
api = "responses"
timeout_secs = 300

[targets.vllm-messages]
provider = "anthropic"
model = "{served_model}"
base_url = "{vllm_openai_url}"
timeout_secs = 300

[targets.gone]
provider = "openai_compatible"
model = "{served_model}"
base_url = "http://127.0.0.1:{dead}/v1"

[models.hosted]
targets = ["vllm"]

[models.hosted-responses]
targets = ["vllm-responses"]

[models.hosted-messages]
targets = ["vllm-messages"]

[models.gone-first]
targets = [{{ target = "gone" }}, {{ target = "vllm", priority = 1 }}]
""")
    node = NodeProcess(["--models-config", str(config)], default_log_dir(), "node-vllm-provider")
    yield node
    node.stop()


def _direct(vllm_openai_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm_openai_url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_chat_through_the_route_equals_vllms_own_answer(routed, vllm_openai_url, served_model):
    through = openai.OpenAI(base_url=routed.url + "/v1", api_key="x", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    own = _direct(vllm_openai_url).chat.completions.create(model=served_model, messages=messages, max_tokens=12,
                                                           temperature=0)
    routed_answer = through.chat.completions.create(model="hosted", messages=messages, max_tokens=12, temperature=0)
    assert routed_answer.choices[0].message.content == own.choices[0].message.content
    assert routed_answer.usage.prompt_tokens == own.usage.prompt_tokens
    assert routed_answer.choices[0].finish_reason == own.choices[0].finish_reason
    streamed = "".join(c.choices[0].delta.content or "" for c in through.chat.completions.create(
        model="hosted", messages=messages, max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == own.choices[0].message.content
    fallback = through.chat.completions.create(model="gone-first", messages=messages, max_tokens=12, temperature=0)
    assert fallback.choices[0].message.content == own.choices[0].message.content


def test_messages_and_responses_clients_reach_vllm_through_the_route(routed, vllm_openai_url, served_model):
    import anthropic

    own = _direct(vllm_openai_url).chat.completions.create(
        model=served_model, messages=[{"role": "user", "content": "Tell me about the sea."}], max_tokens=12,
        temperature=0).choices[0].message.content
    client = anthropic.Anthropic(base_url=routed.url, api_key="x", max_retries=0, timeout=300)
    message = client.messages.create(model="hosted", max_tokens=12, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": "Tell me about the sea."}])
    assert "".join(b.text for b in message.content if b.type == "text") == own
    response = openai.OpenAI(base_url=routed.url + "/v1", api_key="x", max_retries=0, timeout=300).responses.create(
        model="hosted", input="Tell me about the sea.", max_output_tokens=12, temperature=0)
    assert response.output_text == own


@pytest.mark.parametrize("route", ["hosted-responses", "hosted-messages"])
def test_vllms_responses_and_messages_endpoints_as_targets_answer_as_its_chat_does(routed, vllm_openai_url,
                                                                                   served_model, route):
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    own = _direct(vllm_openai_url).chat.completions.create(model=served_model, messages=messages, max_tokens=12,
                                                           temperature=0)
    through = openai.OpenAI(base_url=routed.url + "/v1", api_key="x", max_retries=0, timeout=300)
    answer = through.chat.completions.create(model=route, messages=messages, max_tokens=12, temperature=0)
    assert answer.choices[0].message.content == own.choices[0].message.content
    assert answer.usage.prompt_tokens == own.usage.prompt_tokens and answer.choices[0].finish_reason == own.choices[0].finish_reason
    streamed = "".join(c.choices[0].delta.content or "" for c in through.chat.completions.create(
        model=route, messages=messages, max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == own.choices[0].message.content

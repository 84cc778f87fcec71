"""Gemma 3's images (issue 64) through a real node to simulated Gemma 3 engines, vLLM's service and SGLang's
(chaos/sim_engine/vision_gemma3.py checks the crops, the soft token and every range against the prompt: a gateway
that expands the image sequence wrongly is refused), with the openai SDK: the image sequence's tokens counted
with its newlines joined to the template's (one token of "\\n" + "\\n\\n"; two images side by side share one of
four), the image reaching the answer, streamed as whole."""

from __future__ import annotations

import pytest

from chaos.processes import EngineProcess, NodeProcess
from chaos.sim_engine.vision_gemma3 import TOKENS_PER_IMAGE

from .test_vision import BLUE, RED, data_uri

SERVICES = {"gemma3-vllm": "vllm", "gemma3-sglang": "sglang"}


@pytest.fixture(scope="module")
def node(log_dir):
    engines = [EngineProcess(["--vision", "--vision-family", "gemma3", "--model-name", name, "--zero-cost",
                              "--services", service], log_dir, name) for name, service in SERVICES.items()]
    n = NodeProcess(["--worker-urls", *(e.url for e in engines)], log_dir, "gemma3-node")
    yield n
    n.stop()
    for e in engines:
        e.stop()


@pytest.fixture(scope="module")
def client(node):
    import openai
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)


def ask(client, model: str, *images: str, **kwargs):
    content = [{"type": "image_url", "image_url": {"url": url}} for url in images] + [
        {"type": "text", "text": "What is in the picture?"}]
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=8, temperature=0, **kwargs)


@pytest.mark.parametrize("model", sorted(SERVICES))
def test_the_image_sequence_is_counted_with_its_newlines_joined(client, model):
    text_only, red, blue, both = (ask(client, model), ask(client, model, data_uri(RED)),
                                  ask(client, model, data_uri(BLUE)), ask(client, model, data_uri(RED), data_uri(BLUE)))
    # An image: <start_of_image>, its soft tokens, <end_of_image>, "\n\n" after; the "\n\n" before it joins the
    # template's "user\n" (one token). Two side by side: the first's "\n\n" after and the second's before join too.
    assert red.usage.prompt_tokens - text_only.usage.prompt_tokens == TOKENS_PER_IMAGE + 3
    assert blue.usage.prompt_tokens == red.usage.prompt_tokens  # every image is one square
    assert both.usage.prompt_tokens - text_only.usage.prompt_tokens == 2 * (TOKENS_PER_IMAGE + 3)
    answers = {r.choices[0].message.content for r in (text_only, red, blue, both)}
    assert len(answers) == 4, "the images did not reach the engine"
    assert ask(client, model, data_uri(RED)).choices[0].message.content == red.choices[0].message.content


@pytest.mark.parametrize("model", sorted(SERVICES))
def test_streamed_as_whole(client, model):
    whole = ask(client, model, data_uri(RED), data_uri(BLUE)).choices[0].message.content
    chunks = ask(client, model, data_uri(RED), data_uri(BLUE), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole


def test_listed_as_vision_models(client):
    assert {m.id: m.model_extra["tasks"] for m in client.models.list().data} == {
        name: ["generate", "vision"] for name in SERVICES}

"""Gemma 3's images (issue 64) through a real node to simulated Gemma 3 engines, vLLM's service and SGLang's
(chaos/sim_engine/vision_gemma3.py checks the crops, the soft token and every range against the prompt: a gateway
that expands the image sequence wrongly is refused), with the openai SDK: the image sequence's tokens counted
with its newlines joined to the template's (one token of "\\n" + "\\n\\n"; two images side by side share one of
four), the image reaching the answer, streamed as whole."""

from __future__ import annotations

import pytest

from chaos.processes import EngineProcess, NodeProcess
from chaos.sim_engine.vision_gemma3 import TOKENS_PER_IMAGE

from .test_vision import BLUE, RED, data_uri, png

SERVICES = {"gemma3-vllm": "vllm", "gemma3-sglang": "sglang"}


@pytest.fixture(scope="module")
def engines(log_dir):
    engines = [EngineProcess(["--vision", "--vision-family", "gemma3", "--model-name", name, "--zero-cost",
                              "--services", service], log_dir, name) for name, service in SERVICES.items()]
    yield engines
    for e in engines:
        e.stop()


@pytest.fixture(scope="module")
def node(log_dir, engines):
    # Trusting a request's mm_processor_kwargs (pan and scan per request, below), as vLLM's
    # --trust-request-mm-kwargs; the node below does not.
    n = NodeProcess(["--worker-urls", *(e.url for e in engines), "--media-trust-request-kwargs"], log_dir,
                    "gemma3-node")
    yield n
    n.stop()


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


PAN_AND_SCAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16}


@pytest.mark.parametrize("model", sorted(SERVICES))
def test_pan_and_scan_sends_the_crops_and_their_text_when_a_request_asks(client, model):
    # vLLM's per-request mm_processor_kwargs: a 300 x 100 image is the image and 3 crops (4 squares), written as
    # "Here is the original image" + its sequence + "and here are some crops..." + the crops' sequences.
    wide = data_uri(png(300, 100, 3))
    plain = ask(client, model, wide)
    cropped = ask(client, model, wide, extra_body={"mm_processor_kwargs": PAN_AND_SCAN})
    words = len(client_tokens("Here is the original image  and here are some crops to help you see better   "))
    grown = cropped.usage.prompt_tokens - plain.usage.prompt_tokens
    assert 3 * (TOKENS_PER_IMAGE + 3) < grown <= 3 * (TOKENS_PER_IMAGE + 4) + words
    assert cropped.choices[0].message.content != plain.choices[0].message.content  # the crops reached the engine
    # An image not long enough is not cropped: the same prompt as without the kwargs.
    squarish = data_uri(png(100, 95, 5))
    square = ask(client, model, squarish, extra_body={"mm_processor_kwargs": PAN_AND_SCAN})
    assert square.usage.prompt_tokens == ask(client, model, squarish).usage.prompt_tokens
    streamed = ask(client, model, wide, stream=True, extra_body={"mm_processor_kwargs": PAN_AND_SCAN})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        cropped.choices[0].message.content


def client_tokens(text: str) -> "list[int]":
    """A generous count of the text's tokens (one per character class run): the bound above needs no tokenizer."""
    import re
    return re.findall(r"\w+|\s+|[^\w\s]", text)


@pytest.mark.parametrize("kwargs, says", [({"max_pixels": 1000}, "'max_pixels' is not applied"),
                                          ({"do_pan_and_scan": True, "pan_and_scan_max_num_crops": 99}, "from 2 to 8"),
                                          ({"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 1}, "empty crop")])
def test_mm_processor_kwargs_the_node_cannot_apply_are_a_400(client, kwargs, says):
    import openai
    with pytest.raises(openai.BadRequestError) as caught:  # a 9 x 1 strip in 4 crops of 3: the last one empty
        ask(client, "gemma3-vllm", data_uri(png(9, 1, 4)), extra_body={"mm_processor_kwargs": kwargs})
    assert says in caught.value.message
    with pytest.raises(openai.BadRequestError, match="must be an object"):
        ask(client, "gemma3-vllm", data_uri(RED), extra_body={"mm_processor_kwargs": [1]})


def test_the_nodes_own_kwargs_crop_and_a_requests_are_refused_unless_trusted(log_dir, engines, client):
    # vLLM's --mm-processor-kwargs: the operator turns pan and scan on for every request; a request's own kwargs
    # are then a 400 with vLLM's words, as its server answers without --trust-request-mm-kwargs (images or not).
    import openai
    node = NodeProcess(["--worker-urls", *(e.url for e in engines), "--media-processor-kwargs",
                        '{"do_pan_and_scan": true, "pan_and_scan_min_crop_size": 16}'], log_dir, "gemma3-node-pas")
    try:
        own = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
        wide = data_uri(png(300, 100, 3))
        for model in SERVICES:
            by_node = ask(own, model, wide)
            by_request = ask(client, model, wide, extra_body={"mm_processor_kwargs": PAN_AND_SCAN})
            assert by_node.usage.prompt_tokens == by_request.usage.prompt_tokens > ask(client, model, wide
                                                                                       ).usage.prompt_tokens
            assert by_node.choices[0].message.content == by_request.choices[0].message.content
        for images in ((wide,), ()):
            for param, value in (("mm_processor_kwargs", {"do_pan_and_scan": False}),
                                 ("media_io_kwargs", {"video": {"fps": 1}})):
                with pytest.raises(openai.BadRequestError, match="--media-trust-request-kwargs") as caught:
                    ask(own, "gemma3-vllm", *images, extra_body={param: value})
                assert caught.value.body["param"] == param
        # Trusted, a request's media_io_kwargs say how its videos load (none here: the image's answer unchanged);
        # one this node does not apply is a 400, not an answer loaded otherwise.
        loaded = ask(client, "gemma3-vllm", wide, extra_body={"media_io_kwargs": {"video": {"fps": 1}}})
        assert loaded.usage.prompt_tokens == ask(client, "gemma3-vllm", wide).usage.prompt_tokens
        with pytest.raises(openai.BadRequestError, match="'frame_recovery' is not applied") as caught:
            ask(client, "gemma3-vllm", wide, extra_body={"media_io_kwargs": {"video": {"frame_recovery": True}}})
        assert caught.value.body["param"] == "media_io_kwargs"
    finally:
        node.stop()

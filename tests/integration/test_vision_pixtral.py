"""Mistral 3's images (issue 64) through a real node to simulated Mistral 3 engines, vLLM's service and SGLang's
(chaos/sim_engine/vision_pixtral.py checks each image's size in whole merged patches, [IMG] as the image token and
every range's rows against the prompt: a gateway that expands them wrongly is refused), with the openai SDK: the
rows counted, the image reaching the answer, two of one size streamed as whole, two of different sizes a clear
400 (the engine takes a request's images as one tensor)."""

from __future__ import annotations

import openai
import pytest


from .test_vision import BLUE, RED, data_uri, family_client, png
from .test_vision_gemma3 import ask

SERVICES = {"mistral3-vllm": "vllm", "mistral3-sglang": "sglang"}
# RED (120 x 90) and BLUE (300 x 200) both come out 64 x 48: 3 rows of 4 squares of 16 pixels, [IMG_BREAK] after
# each row but the last, [IMG_END] last: 15 tokens where the template wrote one [IMG].
IMAGE_TOKENS = 3 * (4 + 1)


@pytest.fixture(scope="module")
def client(log_dir):
    yield from family_client(log_dir, "pixtral", SERVICES, "mistral3-node")


@pytest.mark.parametrize("model", sorted(SERVICES))
def test_the_rows_are_counted_and_the_image_reaches_the_answer(client, model):
    text_only, red, blue, both = (ask(client, model), ask(client, model, data_uri(RED)),
                                  ask(client, model, data_uri(BLUE)), ask(client, model, data_uri(RED), data_uri(BLUE)))
    assert red.usage.prompt_tokens - text_only.usage.prompt_tokens == IMAGE_TOKENS
    assert both.usage.prompt_tokens - text_only.usage.prompt_tokens == 2 * IMAGE_TOKENS
    assert len({r.choices[0].message.content for r in (text_only, red, blue, both)}) == 4
    chunks = ask(client, model, data_uri(RED), data_uri(BLUE), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == both.choices[0].message.content


@pytest.mark.parametrize("model", sorted(SERVICES))
def test_two_images_of_different_sizes_are_a_clear_400(client, model):
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, model, data_uri(RED), data_uri(png(40, 40, 9)))  # 48 x 48 against 64 x 48
    assert refused.value.body["code"] == "images_differ_in_size" and "64x48, 48x48" in refused.value.body["message"]
    assert refused.value.body["param"] == "messages[0].content[0]"

"""Llama 4's images (issue 64) through a real node to simulated Llama 4 engines, vLLM's service and SGLang's
(chaos/sim_engine/vision_llama4.py checks the tiles and the global view against the aspect ratios, vLLM's flat
layout, the bfloat16 levels, <|patch|> as the image token and each range's tile sequence against the prompt: a
gateway that tiles or expands them wrongly is refused), with the openai SDK: the tile sequence counted, images of
different sizes in one request served (every tile is one square), the image reaching the answer, streamed as
whole."""

from __future__ import annotations

import pytest

from chaos.sim_engine.vision_llama4 import PATCHES_PER_TILE

from .test_vision import BLUE, RED, data_uri, family_client, png
from .test_vision_gemma3 import ask

SERVICES = {"llama4-vllm": "vllm", "llama4-sglang": "sglang"}
# RED (120 x 90) and BLUE (300 x 200) both fit the 2 x 2 canvas of 28-pixel tiles best: <|image_start|>, 4 tiles'
# patches, a <|tile_x_separator|> in each row, a <|tile_y_separator|> after each, <|image|>, the global view's
# patches, <|image_end|>. A 20 x 20 image is one tile: no separators, no global view.
TILED = 1 + 4 * PATCHES_PER_TILE + 2 + 2 + 1 + PATCHES_PER_TILE + 1
SINGLE = 1 + 1 + PATCHES_PER_TILE + 1
SMALL = png(20, 20, 5)


@pytest.fixture(scope="module")
def client(log_dir):
    yield from family_client(log_dir, "llama4", SERVICES, "llama4-node")


@pytest.mark.parametrize("model", sorted(SERVICES))
def test_the_tiles_are_counted_and_the_image_reaches_the_answer(client, model):
    text_only, red, blue, small, mixed = (
        ask(client, model), ask(client, model, data_uri(RED)), ask(client, model, data_uri(BLUE)),
        ask(client, model, data_uri(SMALL)), ask(client, model, data_uri(RED), data_uri(SMALL)))
    assert red.usage.prompt_tokens - text_only.usage.prompt_tokens == TILED  # the text-only prompt has no <|image|>
    assert blue.usage.prompt_tokens == red.usage.prompt_tokens
    assert small.usage.prompt_tokens - text_only.usage.prompt_tokens == SINGLE
    assert mixed.usage.prompt_tokens - text_only.usage.prompt_tokens == TILED + SINGLE
    assert len({r.choices[0].message.content for r in (text_only, red, blue, small, mixed)}) == 5
    chunks = ask(client, model, data_uri(RED), data_uri(SMALL), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == mixed.choices[0].message.content


def test_listed_as_vision_models(client):
    assert {m.id: m.model_extra["tasks"] for m in client.models.list().data} == {
        name: ["generate", "vision"] for name in SERVICES}

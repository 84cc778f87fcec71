"""Llama 4's images (issue 64) through a real node to simulated Llama 4 engines, vLLM's service and SGLang's
(chaos/sim_engine/vision_llama4.py checks the tiles and the global view against the aspect ratios, vLLM's flat
layout, the bfloat16 levels, <|patch|> as the image token and each range's tile sequence against the prompt: a
gateway that tiles or expands them wrongly is refused), with the openai SDK: the tile sequence counted, images of
different sizes in one request served (every tile is one square), the image reaching the answer, streamed as
whole."""

from __future__ import annotations

import pytest

from chaos.sim_engine.vision_llama4 import PATCHES_PER_TILE

from .test_vision import family_client, png, tiles_counted_and_answered

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
    tiles_counted_and_answered(client, model, TILED, SINGLE, SMALL)


def test_listed_as_vision_models(client):
    assert {m.id: m.model_extra["tasks"] for m in client.models.list().data} == {
        name: ["generate", "vision"] for name in SERVICES}

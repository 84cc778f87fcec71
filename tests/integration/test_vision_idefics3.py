"""Idefics3's and SmolVLM's images (issue 64) through a real node to simulated Idefics3 engines, vLLM's service and
SGLang's (chaos/sim_engine/vision_idefics3.py checks the tiles and the global image against num_patches, the pixel
attention mask beside them, vLLM's flat layout, <image> as the image token and each range against the prompt Idefics3's
processor writes: a gateway that tiles or expands them wrongly is refused), with the openai SDK: the tiles counted,
images of different grids in one request served, the image reaching the answer, streamed as whole."""

from __future__ import annotations

import pytest

from chaos.sim_engine.vision_idefics3 import TOKENS_PER_TILE

from .test_vision import family_client, png, tiles_counted_and_answered

SERVICES = {"idefics3-vllm": "vllm", "idefics3-sglang": "sglang"}


def sequence(rows: int, columns: int) -> int:
    """An image's tokens: per tile <fake_token_around_image>, <row_i_col_j> and its <image> run; a newline after each
    row but the last, "\\n\\n", then the global image's <fake_token_around_image><global-img>, run and closing token."""
    return rows * columns * (2 + TOKENS_PER_TILE) + (rows - 1) + 1 + 3 + TOKENS_PER_TILE


# RED (120 x 90) -> 112 x 84 (the longest edge 4 tiles of 28) -> 112 x 84 whole tiles: 3 rows of 4 and the global
# image. BLUE (300 x 200) -> 112 x 74 -> 112 x 84: the same grid. A 20 x 20 image is enlarged alike: 4 x 4 tiles.
TILED = sequence(3, 4)
SINGLE = sequence(4, 4)
SMALL = png(20, 20, 5)


@pytest.fixture(scope="module")
def client(log_dir):
    yield from family_client(log_dir, "idefics3", SERVICES, "idefics3-node")


@pytest.mark.parametrize("model", sorted(SERVICES))
def test_the_tiles_are_counted_and_the_image_reaches_the_answer(client, model):
    tiles_counted_and_answered(client, model, TILED, SINGLE, SMALL)


def test_listed_as_vision_models(client):
    assert {m.id: m.model_extra["tasks"] for m in client.models.list().data} == {
        name: ["generate", "vision"] for name in SERVICES}

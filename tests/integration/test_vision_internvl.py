"""InternVL's images (issue 64; the Hugging Face format) through a real node to simulated InternVL engines, vLLM's
service and SGLang's (chaos/sim_engine/vision_internvl.py checks the tiles and thumbnail against
image_num_patches, vLLM's flat layout, image_token_id kept on the CPU, <IMG_CONTEXT> as the image token and each
range against the prompt: a gateway that tiles or expands them wrongly is refused), with the openai SDK: the tiles
counted, images of different grids in one request served, the image reaching the answer, streamed as whole."""

from __future__ import annotations

import pytest

from chaos.sim_engine.vision_internvl import TOKENS_PER_TILE

from .test_vision import family_client, png, tiles_counted_and_answered

SERVICES = {"internvl-vllm": "vllm", "internvl-sglang": "sglang"}
# RED (120 x 90) and BLUE (300 x 200) both get the 2 x 2 grid of 28-pixel tiles (the nearest ratios tie with 1 x 1
# and 2 x 1, and the larger grid wins while the image covers half of it) and a thumbnail: <img>, 5 tiles'
# <IMG_CONTEXT>, </img>. A 20 x 20 image stays one tile. The template writes "<IMG_CONTEXT>\n": one more token.
TILED = 5 * TOKENS_PER_TILE + 2 + 1
SINGLE = TOKENS_PER_TILE + 2 + 1
SMALL = png(20, 20, 5)


@pytest.fixture(scope="module")
def client(log_dir):
    yield from family_client(log_dir, "internvl", SERVICES, "internvl-node")


@pytest.mark.parametrize("model", sorted(SERVICES))
def test_the_tiles_are_counted_and_the_image_reaches_the_answer(client, model):
    tiles_counted_and_answered(client, model, TILED, SINGLE, SMALL)


def test_listed_as_vision_models(client):
    assert {m.id: m.model_extra["tasks"] for m in client.models.list().data} == {
        name: ["generate", "vision"] for name in SERVICES}

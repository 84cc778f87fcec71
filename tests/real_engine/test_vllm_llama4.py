"""Llama 4's images on a real engine (issue 64), against vLLM's own OpenAI server on the same model and flags: a
tiny random Llama 4 (make_tiny_llama4.py: Llama 4's processor configs and tiled image sequence) preprocessed in the
gateway and sent over the servicer's preprocessed path, against vLLM's server running transformers' processor: the
same prompt tokens (the tiles, their separators and the global view), the same greedy text for one image and for
two of different tilings (streamed), and the same first token's probabilities (the gateway's tiles are
Llama4ImageProcessor's to the bit, bfloat16 levels included).

Needs SMG_VLLM_PYTHON, SMG_VLLM_LLAMA4_MODEL and SMG_VLLM_VISION_PYTHONPATH (setup_vllm.sh prints them). The
module starts its two engines (~3 minutes) and stops them at its end.
"""

from __future__ import annotations

import pytest

from .media_engines import vision_pair
from .test_vllm_vision import IMAGES, answers_as_vllm, _png, _uri, probabilities_as_vllms, streamed_as_vllm_answers

pytestmark = pytest.mark.real_engine
# With 56-pixel tiles, 4 at most: the shared images all fit 2 x 2 canvases; these a row of 4 and a column of 4.
TILINGS = {"row 300x60": _uri(_png(300, 60, 4)), "column 60x200": _uri(_png(60, 200, 5))}
# No image of one tile: vLLM 0.32's CPU build dies on one (its unfold's permuted view of a single tile reaches
# oneDNN's matmul, which wants a unit last stride: "Expected a.stride(-1) == 1"), on its own server as through the
# gateway, alone or beside other images. The simulated engine's tests cover it (test_vision_llama4.py).


@pytest.fixture(scope="module")
def llama4():
    with vision_pair("SMG_VLLM_LLAMA4_MODEL", "vllm-llama4", 18059, 18069) as pair:
        yield pair


@pytest.mark.parametrize("name", sorted({**IMAGES, **TILINGS}))
def test_one_image_gives_vllms_own_prompt_and_greedy_answer(llama4, name):
    ours, theirs, model = llama4
    uri = {**IMAGES, **TILINGS}[name]
    answers_as_vllm(ours, theirs, model, [uri])


def test_two_images_of_different_tilings_streamed(llama4):
    ours, theirs, model = llama4
    streamed_as_vllm_answers(ours, theirs, model, [IMAGES["noise 300x200"], TILINGS["column 60x200"],
                                                   TILINGS["row 300x60"]])


def test_the_image_moves_the_models_probabilities_as_on_vllms_own_server(llama4):
    ours, theirs, model = llama4
    probabilities_as_vllms(ours, theirs, model, [*([uri] for uri in {**IMAGES, **TILINGS}.values()),
                                                 [IMAGES["noise 300x200"], IMAGES["photo 640x480"]]])

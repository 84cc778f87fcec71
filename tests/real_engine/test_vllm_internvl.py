"""InternVL's images (Hugging Face format) on a real engine (issue 64), against vLLM's own OpenAI server on the same
model and flags: a tiny random InternVL (make_tiny_internvl.py: GotOcr2's and InternVL's processor configs)
preprocessed in the gateway and sent over the servicer's preprocessed path, against vLLM's server running
transformers' processor: the same prompt tokens (the grid's tiles and the thumbnail), the same greedy text for one
image and for three of different grids (streamed), and the same first token's probabilities.

Needs SMG_VLLM_PYTHON, SMG_VLLM_INTERNVL_MODEL and SMG_VLLM_VISION_PYTHONPATH (setup_vllm.sh prints them). The
module starts its two engines (~3 minutes) and stops them at its end.
"""

from __future__ import annotations

import pytest

from .media_engines import vision_pair
from .test_vllm_vision import IMAGES, answers_as_vllm, _png, _uri, probabilities_as_vllms, streamed_as_vllm_answers

pytestmark = pytest.mark.real_engine
# With 56-pixel tiles, 4 at most: a square small image stays one tile (no thumbnail), a 5:1 strip a row of 4.
TILINGS = {"one tile 40x40": _uri(_png(40, 40, 3)), "row 300x60": _uri(_png(300, 60, 4))}
ALL = {**IMAGES, **TILINGS}


@pytest.fixture(scope="module")
def internvl():
    with vision_pair("SMG_VLLM_INTERNVL_MODEL", "vllm-internvl", 18060, 18070) as pair:
        yield pair


@pytest.mark.parametrize("name", sorted(ALL))
def test_one_image_gives_vllms_own_prompt_and_greedy_answer(internvl, name):
    ours, theirs, model = internvl
    answers_as_vllm(ours, theirs, model, [ALL[name]])


def test_three_images_of_different_grids_streamed(internvl):
    ours, theirs, model = internvl
    streamed_as_vllm_answers(ours, theirs, model, [IMAGES["photo 640x480"], TILINGS["one tile 40x40"],
                                                   TILINGS["row 300x60"]])


def test_the_image_moves_the_models_probabilities_as_on_vllms_own_server(internvl):
    ours, theirs, model = internvl
    probabilities_as_vllms(ours, theirs, model, [*([uri] for uri in ALL.values()),
                                                 [IMAGES["noise 300x200"], IMAGES["photo 640x480"]]])

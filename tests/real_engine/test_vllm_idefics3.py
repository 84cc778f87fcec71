"""Idefics3's images on a real engine (issue 64), against vLLM's own OpenAI server on the same model and flags: a tiny
random Idefics3 (make_tiny_idefics3.py: Idefics3's image processor and processor configs) preprocessed in the gateway
and sent over the servicer's preprocessed path, against vLLM's server running transformers' processor: the same
prompt tokens (each tile's <row_i_col_j> and <image> run, the joined newlines, the global image), the same greedy text
for one image and for three of different grids (streamed), and the same first token's probabilities.

Needs SMG_VLLM_PYTHON, SMG_VLLM_IDEFICS3_MODEL and SMG_VLLM_VISION_PYTHONPATH (setup_vllm.sh prints them). The
module starts its two engines (~3 minutes) and stops them at its end.
"""

from __future__ import annotations

import pytest

from .media_engines import vision_pair
from .test_vllm_vision import IMAGES, answers_as_vllm, _png, _uri, probabilities_as_vllms, streamed_as_vllm_answers

pytestmark = pytest.mark.real_engine
# With 56-pixel tiles and the longest edge 4 of them: a 5:1 strip is a row of 4 tiles (and the global image), a
# tall one a column, a small square enlarged to 4 x 4.
TILINGS = {"row 300x60": _uri(_png(300, 60, 4)), "column 50x250": _uri(_png(50, 250, 5)),
           "small 40x40": _uri(_png(40, 40, 3))}
ALL = {**IMAGES, **TILINGS}


@pytest.fixture(scope="module")
def idefics3():
    with vision_pair("SMG_VLLM_IDEFICS3_MODEL", "vllm-idefics3", 18061, 18071) as pair:
        yield pair


@pytest.mark.parametrize("name", sorted(ALL))
def test_one_image_gives_vllms_own_prompt_and_greedy_answer(idefics3, name):
    ours, theirs, model = idefics3
    answers_as_vllm(ours, theirs, model, [ALL[name]])


def test_three_images_of_different_grids_streamed(idefics3):
    ours, theirs, model = idefics3
    streamed_as_vllm_answers(ours, theirs, model, [IMAGES["photo 640x480"], TILINGS["small 40x40"],
                                                   TILINGS["row 300x60"]])


def test_the_image_moves_the_models_probabilities_as_on_vllms_own_server(idefics3):
    ours, theirs, model = idefics3
    probabilities_as_vllms(ours, theirs, model, [*([uri] for uri in ALL.values()),
                                                 [IMAGES["noise 300x200"], IMAGES["photo 640x480"]]])

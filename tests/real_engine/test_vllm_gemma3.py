"""Gemma 3's images on a real engine (issue 64), against vLLM's own OpenAI server on the same model and flags: a
tiny random Gemma 3 (make_tiny_gemma3.py: Gemma 3's processor configs and image sequence) preprocessed in the
gateway and sent over the servicer's preprocessed path, against vLLM's server running transformers' processor: the
same prompt tokens (the image sequence and the newlines it joins), the same greedy text for one image and for two
side by side (streamed), and the same first token's probabilities on resized images (the gateway's pixels are
transformers' torchvision processor's to the bit).

Needs SMG_VLLM_PYTHON, SMG_VLLM_GEMMA3_MODEL and SMG_VLLM_VISION_PYTHONPATH (setup_vllm.sh prints them). The
module starts its two engines (~3 minutes) and stops them at its end.
"""

from __future__ import annotations

import pytest

from .media_engines import vision_pair
from .test_vllm_vision import IMAGES, answers_as_vllm, probabilities_as_vllms, streamed_as_vllm_answers

pytestmark = pytest.mark.real_engine


@pytest.fixture(scope="module")
def gemma3():
    with vision_pair("SMG_VLLM_GEMMA3_MODEL", "vllm-gemma3", 18057, 18067) as pair:
        yield pair


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_one_image_gives_vllms_own_prompt_and_greedy_answer(gemma3, name):
    ours, theirs, model = gemma3
    answers_as_vllm(ours, theirs, model, [IMAGES[name]])


def test_two_images_side_by_side_streamed(gemma3):
    # Their sequences meet as "\n\n" + "\n\n": one token of four newlines, as Gemma's tokenizer writes it.
    ours, theirs, model = gemma3
    streamed_as_vllm_answers(ours, theirs, model, [IMAGES["noise 300x200"], IMAGES["photo 640x480"]])


def test_the_image_moves_the_models_probabilities_as_on_vllms_own_server(gemma3):
    # Resized images: vLLM's server resizes with transformers' torchvision processor, and so does the gateway.
    ours, theirs, model = gemma3
    probabilities_as_vllms(ours, theirs, model, [*([uri] for uri in IMAGES.values()),
                                                 [IMAGES["noise 300x200"], IMAGES["photo 640x480"]]])

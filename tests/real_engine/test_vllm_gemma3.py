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
from .test_vllm_vision import (IMAGES, _chat, _png, _uri, answers_as_vllm, probabilities_as_vllms,
                               streamed_as_vllm_answers)

pytestmark = pytest.mark.real_engine


@pytest.fixture(scope="module")
def gemma3():
    # A request's mm_processor_kwargs trusted on both sides (pan and scan, below).
    with vision_pair("SMG_VLLM_GEMMA3_MODEL", "vllm-gemma3", 18057, 18067, server_flags=("--trust-request-mm-kwargs",),
                     node_flags=("--media-trust-request-kwargs",)) as pair:
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


# Pan and scan through a request's mm_processor_kwargs, as vLLM's server takes them (the tiny model's 64-pixel square
# would never be cropped at the published 256-pixel minimum crop): the crops, their text and the joined newlines
# make the same prompt, answer and first-token probabilities on both servers.
PAN_AND_SCAN = {"mm_processor_kwargs": {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16}}


def test_pan_and_scan_gives_vllms_own_prompt_answer_and_probabilities(gemma3):
    ours, theirs, model = gemma3
    wide, tall = IMAGES["noise 300x200"], _uri(_png(90, 400, 7))
    for images in ([wide], [tall], [wide, tall]):
        mine = _chat(ours, model, images, extra_body=PAN_AND_SCAN)
        reference = _chat(theirs, model, images, extra_body=PAN_AND_SCAN)
        assert mine.usage.prompt_tokens == reference.usage.prompt_tokens > _chat(theirs, model, images
                                                                                 ).usage.prompt_tokens
        assert mine.choices[0].message.content == reference.choices[0].message.content
    streamed_as_vllm_answers(ours, theirs, model, [wide, tall],
                             chat=lambda client, m, uris, **kw: _chat(client, m, uris, extra_body=PAN_AND_SCAN, **kw))
    probabilities_as_vllms(ours, theirs, model, [[wide], [tall]], extra_body=PAN_AND_SCAN)

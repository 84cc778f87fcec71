"""Mistral 3's images on a real engine (issue 64), against vLLM's own OpenAI server on the same model and flags: a
tiny random Mistral 3 (make_tiny_mistral3.py: Pixtral's processor configs and image rows, patches merged 2 x 2)
preprocessed in the gateway and sent over the servicer's preprocessed path, against vLLM's server running
transformers' processor: the same prompt tokens, greedy text and first-token probabilities for one image and for
two of one size (streamed); two that come out of different sizes are refused with a 400 (the contract carries a
request's images as one tensor), which vLLM's server answers.

Needs SMG_VLLM_PYTHON, SMG_VLLM_MISTRAL3_MODEL and SMG_VLLM_VISION_PYTHONPATH (setup_vllm.sh prints them). The
module starts its two engines (~3 minutes) and stops them at its end.
"""

from __future__ import annotations

import openai
import pytest

from .media_engines import vision_pair
from .test_vllm_vision import IMAGES, LOGPROB_TOLERANCE, _first_logprobs, _png, _uri, streamed_as_vllm_answers
from .test_vllm_vision import _chat as _any_chat

pytestmark = pytest.mark.real_engine


def _chat(client, model, images, **kwargs):
    # This random model's likeliest tokens are the added special ones ([/INST]): shown, so the text has something
    # to compare (found here: the gateway left them out of logprobs too, where vLLM's server lists them; fixed).
    return _any_chat(client, model, images, extra_body={"skip_special_tokens": False}, **kwargs)


@pytest.fixture(scope="module")
def mistral3():
    with vision_pair("SMG_VLLM_MISTRAL3_MODEL", "vllm-mistral3", 18058, 18068) as pair:
        yield pair


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_one_image_gives_vllms_own_prompt_answer_and_probabilities(mistral3, name):
    ours, theirs, model = mistral3
    mine = _chat(ours, model, [IMAGES[name]], logprobs=True, top_logprobs=5)
    reference = _chat(theirs, model, [IMAGES[name]], logprobs=True, top_logprobs=5)
    assert mine.usage.prompt_tokens == reference.usage.prompt_tokens
    assert mine.choices[0].message.content == reference.choices[0].message.content
    a, b = _first_logprobs(mine), _first_logprobs(reference)
    assert a.keys() == b.keys() and max(abs(a[t] - b[t]) for t in a) < LOGPROB_TOLERANCE, (a, b)


def test_two_images_of_one_size_streamed(mistral3):
    ours, theirs, model = mistral3
    both = [IMAGES["noise 300x200"], IMAGES["photo 640x480"]]  # both 112 x 84 once resized: 3 rows of 4
    streamed_as_vllm_answers(ours, theirs, model, both, _chat)


def test_two_images_of_different_sizes_are_a_clear_400(mistral3):
    ours, theirs, model = mistral3
    both = [IMAGES["noise 300x200"], _uri(_png(28, 28, 5))]
    assert _chat(theirs, model, both).choices[0].message.content  # vLLM's server takes them one by one
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(ours, model, both)
    assert refused.value.body["code"] == "images_differ_in_size"

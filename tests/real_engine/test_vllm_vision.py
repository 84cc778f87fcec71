"""Images on a real engine (issue 37), compared with vLLM's own OpenAI server on the same model and flags: a tiny
random Qwen2-VL with Qwen2-VL's published processor config and chat template, preprocessed in the gateway and
sent over the servicer's preprocessed path, against vLLM's server running transformers' processor itself: the
same prompt tokens and the same greedy text, over chat (one and two images, streamed), Responses' input_image
and Messages' image blocks.

Needs ``tests/real_engine/setup_vllm.sh`` (it builds the model and the torchvision its vLLM code imports) and
SMG_VLLM_PYTHON, SMG_VLLM_VISION_MODEL, SMG_VLLM_VISION_PYTHONPATH (the script prints them). The module starts
its two engines (~3 minutes) and stops them at its end.
"""

from __future__ import annotations

import base64
import io
import os

import anthropic
import numpy as np
import pytest
from PIL import Image

from .conftest import engine_pair
from .media_engines import clients, configured, node_on

pytestmark = pytest.mark.real_engine



@pytest.fixture(scope="module")
def vision():
    configured("SMG_VLLM_VISION_MODEL", "SMG_VLLM_VISION_PYTHONPATH")
    # vLLM's Qwen2-VL code imports torchvision, set up beside the venv for these engines only (setup_vllm.sh).
    env = {"PYTHONPATH": os.environ["SMG_VLLM_VISION_PYTHONPATH"]}
    with engine_pair("vllm-vision", os.environ["SMG_VLLM_VISION_MODEL"], 18054, 18064,
                     ["--limit-mm-per-prompt", '{"image": 3, "video": 0}'], env) as (grpc_url, http_url):
        node = node_on(grpc_url, "node-vllm-vision")
        try:
            ours, theirs = clients(node, http_url)
            yield ours, theirs, ours.models.list().data[0].id, node
        finally:
            node.stop()


def _png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8)).save(out, "PNG")
    return out.getvalue()


def _photo_like(width: int, height: int) -> bytes:
    """Smooth gradients, as photographs mostly are, as a JPEG."""
    x, y = np.meshgrid(np.linspace(0, 1, width), np.linspace(0, 1, height))
    pixels = np.stack([x * 255, y * 255, (1 - x * y) * 255], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def _uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _chat(client, model, images, text="Describe the picture.", **kwargs):
    content = [{"type": "image_url", "image_url": {"url": uri}} for uri in images] + [{"type": "text", "text": text}]
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=12, temperature=0, **kwargs)


IMAGES = {"noise 300x200": _uri(_png(300, 200, 1)), "noise 100x80": _uri(_png(100, 80, 2)),
          "photo 640x480": _uri(_photo_like(640, 480), "image/jpeg")}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_one_image_gives_vllms_own_greedy_answer(vision, name):
    ours, theirs, model, _ = vision
    answers_as_vllm(ours, theirs, model, [IMAGES[name]])


def test_two_images_streamed(vision):
    ours, theirs, model, _ = vision
    both = [IMAGES["noise 300x200"], IMAGES["photo 640x480"]]
    reference = _chat(theirs, model, both).choices[0].message.content
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in _chat(ours, model, both, stream=True)
                       if chunk.choices)
    assert streamed == reference


# The same pixels and prompt on the same engine: the same probabilities (the bound is a float's printing, not a
# kernel's difference: with Pillow's resize, --media-pixel-reference pil, they differ by up to ~0.03).
LOGPROB_TOLERANCE = 1e-4


def answers_as_vllm(ours, theirs, model, images) -> None:
    """``images`` through the node: the prompt tokens (each placeholder expanded as the model's processor expands
    it) and greedy text vLLM's own server answers."""
    mine, reference = _chat(ours, model, images), _chat(theirs, model, images)
    assert mine.usage.prompt_tokens == reference.usage.prompt_tokens
    assert mine.choices[0].message.content == reference.choices[0].message.content


def streamed_as_vllm_answers(ours, theirs, model, images, chat=_chat) -> None:
    """``images`` streamed through the node: the text and prompt tokens vLLM's own server answers whole."""
    reference = chat(theirs, model, images)
    streamed = list(chat(ours, model, images, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        reference.choices[0].message.content
    assert streamed[-1].usage.prompt_tokens == reference.usage.prompt_tokens


def _first_logprobs(reply) -> "dict[str, float]":
    return {t.token: t.logprob for t in reply.choices[0].logprobs.content[0].top_logprobs}


def probabilities_as_vllms(ours, theirs, model, requests: "list[list[str]]", **kwargs) -> None:
    """Each request's images (a list of data URIs) give the first token's top probabilities vLLM's own server
    gives (within LOGPROB_TOLERANCE), and no two requests give the same: each image reached the model."""
    seen = set()
    for uris in requests:
        mine = _first_logprobs(_chat(ours, model, uris, logprobs=True, top_logprobs=5, **kwargs))
        reference = _first_logprobs(_chat(theirs, model, uris, logprobs=True, top_logprobs=5, **kwargs))
        shared = mine.keys() & reference.keys()
        assert len(shared) >= 4, (mine, reference)
        assert max(abs(mine[t] - reference[t]) for t in shared) < LOGPROB_TOLERANCE, (mine, reference)
        seen.add(tuple(sorted(mine.items())))
    assert len(seen) == len(requests), "different images gave the same probabilities"


def test_the_image_moves_the_models_probabilities_as_on_vllms_own_server(vision):
    # Random weights answer the same text for most images; the probabilities show the image reached the model
    # and was read as vLLM's server reads it: the same pixels (its torchvision processor's, to the bit), so the
    # same probabilities.
    ours, theirs, model, _ = vision
    probabilities_as_vllms(ours, theirs, model, [[uri] for uri in IMAGES.values()])


def test_responses_input_image_and_messages_image_blocks(vision):
    ours, theirs, model, node = vision
    image = IMAGES["photo 640x480"]
    reference = _chat(theirs, model, [image]).choices[0].message.content
    response = ours.responses.create(model=model, max_output_tokens=12, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": image},
                                     {"type": "input_text", "text": "Describe the picture."}]}])
    assert response.output_text == reference
    claude = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0)
    # (anthropic 2.x's create() has no temperature argument; the Messages API still takes it)
    blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": image.split(",", 1)[1]}},
              {"type": "text", "text": "Describe the picture."}]
    message = claude.messages.create(model=model, max_tokens=12, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": blocks}])
    assert "".join(block.text for block in message.content if block.type == "text") == reference


def _turned(exif_orientation: int) -> str:
    """The photo-like JPEG stored sideways with an EXIF orientation (a phone's photo): seen upright once turned."""
    x, y = np.meshgrid(np.linspace(0, 1, 480), np.linspace(0, 1, 320))
    pixels = np.stack([x * 255, y * 255, (1 - x * y) * 255], axis=-1).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = exif_orientation
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90, exif=exif.tobytes())
    return _uri(out.getvalue(), "image/jpeg")


def _transparent() -> str:
    """A grey-and-alpha PNG, half of it transparent black: vLLM composites it over white (not RGBA only)."""
    pixels = np.zeros((200, 300, 2), dtype=np.uint8)
    pixels[:, :150, 0], pixels[:, :150, 1] = 90, 255  # the left half grey and opaque, the right transparent black
    out = io.BytesIO()
    Image.fromarray(pixels, "LA").save(out, "PNG")
    return _uri(out.getvalue())


def test_a_turned_photo_and_a_transparent_image_reach_the_model_as_on_vllms_own_server(vision):
    ours, theirs, model, _ = vision
    seen = {}
    for name, uri in (("upright", _turned(1)), ("turned", _turned(6)), ("transparent", _transparent())):
        mine = _first_logprobs(_chat(ours, model, [uri], logprobs=True, top_logprobs=5))
        reference = _first_logprobs(_chat(theirs, model, [uri], logprobs=True, top_logprobs=5))
        shared = mine.keys() & reference.keys()
        assert len(shared) >= 4, (name, mine, reference)
        assert max(abs(mine[t] - reference[t]) for t in shared) < LOGPROB_TOLERANCE, (name, mine, reference)
        seen[name] = mine
    assert seen["upright"] != seen["turned"], "the EXIF turn did not reach the model"

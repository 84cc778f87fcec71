"""Pixtral's and Mistral 3's images against transformers' own processors (the oracle): the pixels of
PixtralImageProcessorPil to the bit, and the prompt PixtralProcessor makes of a text and its image (rows of [IMG],
[IMG_BREAK] after each, [IMG_END] last, in merged patches for Mistral 3) equal to the gateway's expansion: its
module needs torch, so its prompts are digests made in the vLLM venv (tests/support/torchvision_goldens.py). The
tokenizer is the Qwen one with Pixtral's image tokens added (Mistral's is not on this machine). Also: a request's
images that come out of different sizes are refused (the engine takes them as one tensor)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from PIL import Image

from gateway.media.config import MediaConfig
from gateway.media.families import image_processor
from gateway.media.processors import PixtralProcessor
from gateway.media.service import ImageRef, MediaError, MediaService
from gateway.tokenizer.bundled import default_tokenizer_dir
from tests.support.torchvision_goldens import (GOLDENS, MISTRAL3_CONFIG, MISTRAL3_PROCESSOR, PIXTRAL_PROMPT,
                                               PROMPT_SIZES, expanded_prompt, image, pixtral_tokenizer, prompt_digest)

transformers = pytest.importorskip("transformers")
from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil  # noqa: E402

PIXTRAL_12B = {"image_processor_type": "PixtralImageProcessor", "size": {"longest_edge": 1024},
               "patch_size": {"height": 16, "width": 16}, "resample": 3, "rescale_factor": 1 / 255,
               "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
EXPECTED = json.loads(GOLDENS.read_text())


@pytest.fixture(scope="module")
def tokenizer() -> tokenizers.Tokenizer:
    return pixtral_tokenizer((Path(default_tokenizer_dir()) / "tokenizer.json").read_text())


def images(seed: int):
    rng = np.random.default_rng(seed)
    for w, h in [(200, 123), (1024, 1024), (3000, 20), (13, 600), (1280, 720), (1, 1), (1025, 77), (2000, 1600)]:
        yield Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))


@pytest.mark.parametrize("seed", [0, 1])
def test_pixels_equal_transformers(tokenizer, seed):
    ours = image_processor({"preprocessor_config.json": PIXTRAL_12B}, tokenizer.token_to_id, "pil")
    assert isinstance(ours, PixtralProcessor) and ours.patch == 16
    reference = PixtralImageProcessorPil(size={"longest_edge": 1024}, patch_size={"height": 16, "width": 16})
    for picture in images(seed):
        got = ours.process(picture, True)
        want = reference(images=[picture], return_tensors="np")
        assert got.normalized.shape == want["pixel_values"].shape[1:], picture.size
        assert np.array_equal(got.normalized, want["pixel_values"][0]), (picture.size, seed)
        assert list(want["image_sizes"][0]) == list(got.raw.shape[1:])


@pytest.mark.parametrize("index, size", list(enumerate(PROMPT_SIZES)))
def test_mistral3s_prompt_is_the_one_transformers_tokenizes(index, size):
    tokenizer = pixtral_tokenizer((Path(default_tokenizer_dir()) / "tokenizer.json").read_text())
    files = {"preprocessor_config.json": MISTRAL3_CONFIG, "processor_config.json": MISTRAL3_PROCESSOR}
    ours = image_processor(files, tokenizer.token_to_id)
    assert ours.patch == 28  # 14 merged 2 x 2
    processed = ours.process(Image.fromarray(image(*size, index + 1)), False)
    expanded, inputs = expanded_prompt(ours, processed, tokenizer.encode(PIXTRAL_PROMPT, add_special_tokens=False).ids)
    assert prompt_digest(expanded) == EXPECTED["prompts"][f"mistral3 {size[0]}x{size[1]}"]
    (offset, length), = inputs.ranges
    assert expanded[offset + length - 1] == tokenizer.token_to_id("[IMG_END]") and length == processed.tokens


def _uri(width: int, height: int) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "gray").save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


async def test_images_that_come_out_of_different_sizes_are_refused(tokenizer):
    ours = image_processor({"preprocessor_config.json": PIXTRAL_12B}, tokenizer.token_to_id)
    service = MediaService(MediaConfig(threads=1))
    try:
        same = await service.prepare([ImageRef(_uri(64, 48), "messages[0].content[0]"),
                                      ImageRef(_uri(60, 40), "messages[0].content[1]")], ours, False)
        assert same.pixel_values(True).shape == (2, 3, 48, 64)  # each rounded up to whole patches: 64 x 48
        with pytest.raises(MediaError, match="64x48, 128x96") as refused:
            await service.prepare([ImageRef(_uri(64, 48), "messages[0].content[0]"),
                                   ImageRef(_uri(128, 96), "messages[0].content[1]")], ours, False)
        assert refused.value.code == "images_differ_in_size"
    finally:
        await service.aclose()

"""The image processors against what transformers' torchvision-backed processors compute (the ones vLLM's server
runs, torchvision being one of vLLM's dependencies): equal float32 pixels to the bit for each family on seeded
images, and torch's antialiased resize equal on its own, held to digests made with torch
(tests/support/torchvision_goldens.py, run in the vLLM venv) since this suite has no torch. The PIL processors'
oracle is test_image_processors.py's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from gateway.media.families import image_processor
from gateway.media.processors import resized
from gateway.media.resize import pass_weights, resize_uint8
from tests.support.torchvision_goldens import CONFIGS, GOLDENS, digest, processor_cases, resize_cases

TOKENS = {"<|image_pad|>": 151655, "<image>": 32000, "<start_of_image>": 1, "<image_soft_token>": 2,
          "<end_of_image>": 3, "\n\n": 4, "[IMG]": 5, "[IMG_BREAK]": 6, "[IMG_END]": 7, "<|image|>": 8,
          "<|patch|>": 9, "<|image_start|>": 10, "<|image_end|>": 11, "<|tile_x_separator|>": 12,
          "<|tile_y_separator|>": 13, "<IMG_CONTEXT>": 14, "<img>": 15, "</img>": 16, "<fake_token_around_image>": 17,
          "<global-img>": 18, "\u010a": 19, "\u010a\u010a": 20,
          **{f"<row_{row}_col_{column}>": 100 + 10 * row + column for row in range(1, 7) for column in range(1, 7)}
          }.get
EXPECTED = json.loads(GOLDENS.read_text())


@pytest.mark.parametrize("case, name, pixels", list(processor_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_pixels_equal_transformers_torchvision_processors(case, name, pixels):
    processor = image_processor({"preprocessor_config.json": CONFIGS[name]}, TOKENS)
    shape, want = EXPECTED["processors"][case]
    got = processor.process(Image.fromarray(pixels), True).normalized
    assert digest(got.reshape(shape)) == [shape, want], case
    assert np.array_equal(processor.normalized(processor.process(Image.fromarray(pixels), False).raw), got)


@pytest.mark.parametrize("case, pixels, width, height, kind", list(resize_cases()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_the_resize_equals_torchs_antialiased_kernel(case, pixels, width, height, kind):
    assert digest(resize_uint8(pixels, width, height, kind)) == EXPECTED["resizes"][case], case


def test_it_differs_from_pillows_where_the_precision_does():
    """The reason it exists: Pillow's kernel (22-bit weights) gives other values on some pixels."""
    pixels = np.random.default_rng(5).integers(0, 256, (411, 733, 3), dtype=np.uint8)
    ours = resized(Image.fromarray(pixels), 300, 170, 3, "torchvision")
    pillow = resized(Image.fromarray(pixels), 300, 170, 3, "pil")
    differ = np.abs(ours.astype(int) - pillow.astype(int))
    assert differ.max() == 1 and 0 < np.count_nonzero(differ) < differ.size // 10


def test_weights_sum_to_one_at_their_precision_and_stay_within_the_image():
    for in_size, out_size, kind in ((733, 300, "bicubic"), (20, 560, "bicubic"), (57, 56, "bilinear"),
                                    (1, 28, "bilinear")):
        first, weights, precision = pass_weights(in_size, out_size, kind)
        assert 0 < precision <= 22 and np.abs(weights).max() < 1 << 15
        assert np.all(np.abs(weights.sum(axis=1) - (1 << precision)) <= weights.shape[1])
        assert first.min() >= 0 and first.max() < in_size


def test_a_strip_whose_resize_would_take_a_memory_of_weights_is_refused_before_it_starts():
    """The attack: a 1 x 4,000,000 image (12 MB, within the pixel bound) to Gemma 3's 896 square would need 8 M
    weights and 8,900 passes over it; refused as a shape the processor cannot take (a 400 invalid_image)."""
    strip = Image.fromarray(np.zeros((1, 4_000_000, 3), dtype=np.uint8))
    gemma3 = image_processor({"preprocessor_config.json": CONFIGS["gemma3"]}, TOKENS)
    with pytest.raises(ValueError, match="too far from the model's"):
        gemma3.process(strip, False)
    with pytest.raises(ValueError):
        pass_weights(4_000_000, 896, "bilinear")
    assert pass_weights(89_442, 896, "lanczos")[1].size < 1 << 22  # 200:1 at 40 M pixels, the widest others allow

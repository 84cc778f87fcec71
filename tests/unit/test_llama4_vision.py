"""Llama 4's images against transformers' own processors (the oracle, run in the vLLM venv since their module needs
torch: tests/support/torchvision_goldens.py keeps what they compute as digests). Pixels: the tiles, the global view
and the bfloat16 arithmetic equal to Llama4ImageProcessor's to the bit (test_torchvision_pixels.py's "llama4"
cases); here, the prompt Llama4Processor makes of a text and an image equal to the gateway's expansion, the canvas
choice on the processor's own documented examples, the bfloat16 rounding, the layout vLLM takes and the config
errors. The tokenizer is the Qwen one with Llama 4's tokens added (Meta's is not on this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gateway.media.families import image_processor
from gateway.media.llama4 import (Llama4Processor, best_canvas, bfloat16, bfloat16_levels, resize_size,
                                  supported_canvases)
from gateway.media.processors import ProcessorConfigError
from gateway.media.service import MediaInputs
from gateway.tokenizer.bundled import default_tokenizer_dir
from tests.support.torchvision_goldens import (GOLDENS, LLAMA4_CONFIG, LLAMA4_PROCESSOR, LLAMA4_PROMPT,
                                               LLAMA4_PROMPT_SIZES, golden_prompt, image, llama4_tokenizer,
                                               prompt_digest)

EXPECTED = json.loads(GOLDENS.read_text())
# Llama 4 Scout's model config as vLLM reads it for a tile's patches.
SCOUT = {"vision_config": {"image_size": 336, "patch_size": 14, "pixel_shuffle_ratio": 0.5}}


@pytest.fixture(scope="module")
def tokenizer():
    return llama4_tokenizer((Path(default_tokenizer_dir()) / "tokenizer.json").read_text())


@pytest.fixture(scope="module")
def scout(tokenizer) -> Llama4Processor:
    files = {"preprocessor_config.json": LLAMA4_CONFIG, "processor_config.json": LLAMA4_PROCESSOR, "config.json": SCOUT}
    processor = image_processor(files, tokenizer.token_to_id)
    assert isinstance(processor, Llama4Processor) and processor.patches_per_tile == 144
    return processor


@pytest.mark.parametrize("index, size", list(enumerate(LLAMA4_PROMPT_SIZES)))
def test_the_prompt_is_the_one_transformers_tokenizes(tokenizer, scout, index, size):
    expanded, inputs, processed, golden = golden_prompt(scout, tokenizer, LLAMA4_PROMPT, "llama4", index, size)
    assert prompt_digest(expanded) == golden
    (offset, length), = inputs.ranges
    window = expanded[offset:offset + length]
    assert window[0] == tokenizer.token_to_id("<|image_start|>")
    assert window[-1] == tokenizer.token_to_id("<|image_end|>")
    # The features go where <|patch|> is: 144 a tile and the global view (vLLM's encoder budget counts them).
    assert window.count(scout.embed_id) == processed.tokens == processed.raw.shape[0] * 144


def test_a_tiled_image_is_laid_out_as_vllm_takes_it(tokenizer, scout):
    processed = scout.process(Image.fromarray(image(1280, 720, 2)), True)
    assert processed.tensors["aspect_ratios"].tolist() == [3, 4]  # 3 rows of 4 tiles
    assert processed.raw.shape == (13, 3, 336, 336) and processed.raw.dtype == np.uint8  # 12 tiles, the global view
    assert processed.normalized.shape == (13, 3, 336, 336) and processed.normalized.dtype == np.float32
    ids = scout.expansion(processed)
    x, y = tokenizer.token_to_id("<|tile_x_separator|>"), tokenizer.token_to_id("<|tile_y_separator|>")
    assert ids.count(x) == 3 * 3 and ids.count(y) == 3 and ids.count(scout.placeholder_id) == 1
    inputs = MediaInputs(scout, [processed, scout.process(Image.fromarray(image(200, 123, 1)), True)], ["a" * 64] * 2)
    assert inputs.pixel_values(True).shape == (14, 3, 336, 336)  # flat: every image's tiles, one after another
    assert inputs.tensors()["patches_per_image"].tolist() == [13, 1]  # a single tile has no global view
    assert inputs.tensors()["aspect_ratios"].tolist() == [[3, 4], [1, 1]]
    assert scout.flat_pixels_by == "patches_per_image" and set(scout.cpu_tensors) == {"patches_per_image",
                                                                                      "aspect_ratios"}


def test_the_canvases_and_the_best_fit_follow_the_processors_own_examples():
    # find_supported_resolutions' documented list for 4 tiles of 224, in its order (ties keep the first).
    assert supported_canvases(4, 224) == [(224, 896), (448, 448), (224, 224), (896, 224), (224, 672), (672, 224),
                                          (224, 448), (448, 224)]
    # get_best_fit's documented example: 200 x 300 fits 224 x 448 (the least upscale, the smaller canvas).
    assert best_canvas(200, 300, [(224, 672), (672, 224), (224, 448), (448, 224), (224, 224)], False) == (224, 448)
    # get_max_res_without_distortion's documented examples (to the canvas itself), as the function computes them
    # (transformers 5.19 returns these; its docstring says 134 and 338, which no floor gives).
    assert resize_size(200, 300, (450, 200), 336, True) == (133, 200)
    assert resize_size(800, 600, (450, 1300), 336, True) == (450, 337)
    # Never upscaled past a tile's side: a 100 x 50 image becomes 336 x 168 in one tile, padded to the square.
    assert resize_size(100, 50, (336, 336), 336, False) == (336, 168)


def test_bfloat16_rounds_to_nearest_even():
    values = np.array([1 / 3, 1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -0.75, 255 / 255], dtype=np.float32)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even (1); 1 + 3 * 2^-8 to 1 + 2^-6.
    assert bfloat16(values).tolist() == [0.333984375, 1.0, 1.0, 1.015625, -0.75, 1.0]
    table = bfloat16_levels(1 / 255, (0.5,) * 3, (0.5,) * 3)
    assert table[:, 0].tolist() == [-1.0] * 3 and table[:, 255].tolist() == [1.0] * 3
    assert not np.any(table.view(np.uint32) & 0xFFFF)  # every value a bfloat16


def test_unusable_configs_are_refused(tokenizer):
    for config, files in (({"size": {"height": 336, "width": 224}}, {}),  # tiles are square
                          ({}, {"config.json": {"vision_config": {"image_size": 336, "patch_size": 15}}}),
                          ({}, {"config.json": {"vision_config": {"image_size": 448}}}),  # the tower's size differs
                          ({"max_patches": 0}, {})):
        with pytest.raises(ProcessorConfigError):
            image_processor({"preprocessor_config.json": {**LLAMA4_CONFIG, **config}, **files}, tokenizer.token_to_id)
    with pytest.raises(ProcessorConfigError, match="no <\\|patch\\|>"):
        image_processor({"preprocessor_config.json": LLAMA4_CONFIG}, {"<|image|>": 1}.get)


def test_a_strip_is_refused_by_its_header_size(scout):
    assert scout.size_problem(30_000, 100) is not None and scout.size_problem(3000, 20) is None

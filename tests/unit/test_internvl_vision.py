"""InternVL's images (HF format) against transformers' own processors (the oracle, run in the vLLM venv since their
module needs torch: tests/support/torchvision_goldens.py keeps what they compute as digests). Pixels: the grid of
tiles, the thumbnail and the normalization equal to GotOcr2ImageProcessor's to the bit (test_torchvision_pixels.py's
"internvl" cases); here, the prompt InternVLProcessor makes of a text and an image equal to the gateway's
expansion, the grid choice on the processor's own documented example, the layout vLLM takes and the config errors.
The tokenizer is the Qwen one with InternVL's tokens added."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gateway.media.families import image_processor
from gateway.media.internvl import InternVLProcessor, best_grid, tile_grids
from gateway.media.processors import ProcessorConfigError
from gateway.media.service import MediaInputs
from gateway.tokenizer.bundled import default_tokenizer_dir
from tests.support.torchvision_goldens import (GOLDENS, INTERNVL_CONFIG, INTERNVL_PROCESSOR, INTERNVL_PROMPT,
                                               INTERNVL_PROMPT_SIZES, golden_prompt, image, internvl_tokenizer,
                                               prompt_digest)

EXPECTED = json.loads(GOLDENS.read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return internvl_tokenizer((Path(default_tokenizer_dir()) / "tokenizer.json").read_text())


@pytest.fixture(scope="module")
def internvl3(tokenizer) -> InternVLProcessor:
    files = {"preprocessor_config.json": INTERNVL_CONFIG, "processor_config.json": INTERNVL_PROCESSOR}
    processor = image_processor(files, tokenizer.token_to_id)
    assert isinstance(processor, InternVLProcessor) and processor.tokens_per_tile == 256
    return processor


@pytest.mark.parametrize("index, size", list(enumerate(INTERNVL_PROMPT_SIZES)))
def test_the_prompt_is_the_one_transformers_tokenizes(tokenizer, internvl3, index, size):
    expanded, inputs, processed, golden = golden_prompt(internvl3, tokenizer, INTERNVL_PROMPT, "internvl", index, size)
    assert prompt_digest(expanded) == golden
    (offset, length), = inputs.ranges
    assert expanded[offset] == internvl3.start_id and expanded[offset + length - 1] == internvl3.end_id
    assert length == processed.tokens + 2 == processed.raw.shape[0] * 256 + 2


def test_a_tiled_image_is_laid_out_as_vllm_takes_it(internvl3):
    processed = internvl3.process(Image.fromarray(image(1280, 720, 2)), True)
    assert internvl3.grid(1280, 720) == (4, 2)  # 16:9 nearest 2:1 of the grids of up to 12 tiles
    assert processed.raw.shape == (9, 3, 448, 448) and processed.raw.dtype == np.uint8  # 8 tiles, the thumbnail
    assert processed.normalized.shape == (9, 3, 448, 448) and processed.normalized.dtype == np.float32
    small = internvl3.process(Image.fromarray(image(40, 40, 1)), True)  # square and small: one tile
    inputs = MediaInputs(internvl3, [processed, small], ["a" * 64] * 2)
    assert inputs.pixel_values(True).shape == (10, 3, 448, 448)  # flat: a one-tile image has no thumbnail
    assert inputs.tensors()["image_num_patches"].tolist() == [9, 1]
    assert inputs.tensors()["image_token_id"].tolist() == [internvl3.placeholder_id] * 2  # per image, kept on the CPU
    assert set(internvl3.cpu_tensors) == {"image_num_patches", "image_token_id"}


def test_the_grids_follow_the_processors_own_example():
    # get_all_supported_aspect_ratios' documented list for 1 to 4 tiles, (columns, rows), in its order.
    assert tile_grids(1, 4) == [(1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (1, 4), (2, 2), (4, 1)]
    # A square ties (1, 1) with (2, 2): the larger grid while the image covers over half of it.
    grids = tile_grids(1, 12)
    assert best_grid(448, 448, 448, grids) == (1, 1)  # 448^2 is not over half of 896^2
    assert best_grid(700, 700, 448, grids) == (2, 2) and best_grid(1000, 1000, 448, grids) == (3, 3)


def test_unusable_configs_are_refused(tokenizer):
    for config in ({"size": {"height": 448, "width": 224}}, {"min_patches": 3, "max_patches": 2}, {"max_patches": 0}):
        with pytest.raises(ProcessorConfigError):
            image_processor({"preprocessor_config.json": {**INTERNVL_CONFIG, **config}}, tokenizer.token_to_id)
    with pytest.raises(ProcessorConfigError, match="no <img>"):  # GOT-OCR 2's own models use other tokens
        image_processor({"preprocessor_config.json": INTERNVL_CONFIG}, {"<IMG_CONTEXT>": 1}.get)


def test_a_strip_is_refused_by_its_header_size(internvl3):
    """The thumbnail squeezes the long side into one tile: past 200:1 refused from the header, before a resize."""
    assert internvl3.size_problem(30_000, 100) is not None and internvl3.size_problem(3000, 40) is None

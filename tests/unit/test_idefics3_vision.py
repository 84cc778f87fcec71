"""Idefics3's and SmolVLM's images against transformers' own processors (the oracle, run in the vLLM venv since their
module needs torch: tests/support/torchvision_goldens.py keeps what they compute as digests). Pixels: the two Lanczos
resizes, the tiles and the global image equal to Idefics3ImageProcessor's to the bit (test_torchvision_pixels.py's
"idefics3" cases); here, the prompt Idefics3Processor makes of a text and an image equal to the gateway's expansion
(its <row_i_col_j> tokens and the newlines the tokenizer joins), the sizes of both resizes on the processor's own
functions' terms, the layout vLLM takes and the config errors. The tokenizer is the Qwen one with Idefics3's tokens
added."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gateway.media.families import image_processor
from gateway.media.idefics3 import Idefics3Processor, longest_edge_size, whole_tiles_size
from gateway.media.processors import ProcessorConfigError
from gateway.media.service import MediaInputs
from gateway.tokenizer.bundled import default_tokenizer_dir
from tests.support.torchvision_goldens import (GOLDENS, IDEFICS3_CONFIG, IDEFICS3_PROCESSOR, IDEFICS3_PROMPT,
                                               IDEFICS3_PROMPT_SIZES, golden_prompt, idefics3_tokenizer, image,
                                               prompt_digest)

EXPECTED = json.loads(GOLDENS.read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return idefics3_tokenizer((Path(default_tokenizer_dir()) / "tokenizer.json").read_text())


@pytest.fixture(scope="module")
def idefics3(tokenizer) -> Idefics3Processor:
    files = {"preprocessor_config.json": IDEFICS3_CONFIG, "processor_config.json": IDEFICS3_PROCESSOR}
    processor = image_processor(files, tokenizer.token_to_id)
    assert isinstance(processor, Idefics3Processor) and processor.tokens_per_tile == 169
    return processor


@pytest.mark.parametrize("index, size", list(enumerate(IDEFICS3_PROMPT_SIZES)))
def test_the_prompt_is_the_one_transformers_tokenizes(tokenizer, idefics3, index, size):
    expanded, inputs, processed, golden = golden_prompt(idefics3, tokenizer, IDEFICS3_PROMPT, "idefics3", index, size)
    assert prompt_digest(expanded) == golden
    (offset, length), = inputs.ranges
    assert expanded[offset] == idefics3.fake_id and expanded[offset + length - 1] == idefics3.fake_id
    assert expanded[offset:offset + length].count(idefics3.placeholder_id) == processed.tokens == \
        processed.raw.shape[0] * 169


def test_an_image_is_laid_out_as_vllm_takes_it(idefics3):
    processed = idefics3.process(Image.fromarray(image(1280, 720, 2)), True)
    # 1280 x 720 -> 1456 x 820 (the longest edge, the other even) -> 1456 x 1092 (whole tiles): 3 rows of 4 tiles.
    assert idefics3.layout(1280, 720) == ((820, 1456), (1092, 1456)) and processed.grid == (3, 4)
    assert processed.raw.shape == (13, 3, 364, 364) and processed.raw.dtype == np.uint8  # 12 tiles, the global one
    assert processed.normalized.shape == (13, 3, 364, 364) and processed.normalized.dtype == np.float32
    one = idefics3.process(Image.fromarray(image(40, 40, 1)), True)
    assert idefics3.layout(40, 40) == ((1456, 1456), (1456, 1456)) and one.grid == (4, 4)  # enlarged: 16 tiles + 1
    inputs = MediaInputs(idefics3, [processed, one], ["a" * 64] * 2)
    assert inputs.pixel_values(True).shape == (30, 3, 364, 364)  # flat by num_patches
    tensors = inputs.tensors()
    assert tensors["num_patches"].tolist() == [13, 17]
    assert tensors["pixel_attention_mask"].shape == (30, 364, 364) and tensors["pixel_attention_mask"].all()
    assert idefics3.flat_tensors == ("pixel_attention_mask",) and idefics3.cpu_tensors == ("num_patches",)


def test_the_resizes_follow_the_processors_functions():
    # _resize_output_size_rescale_to_max_len: the longest side to the bound, the other truncated and made even.
    assert longest_edge_size(720, 1280, 1456) == (820, 1456) and longest_edge_size(1000, 20, 1456) == (1456, 30)
    assert longest_edge_size(3, 3, 1456) == (1456, 1456)
    # resize_for_vision_encoder: the long side rounded up to whole tiles, the other derived from it, rounded up.
    assert whole_tiles_size(820, 1456, 364) == (1092, 1456) and whole_tiles_size(1456, 30, 364) == (1456, 364)
    assert whole_tiles_size(364, 364, 364) == (364, 364)


def test_without_splitting_an_image_is_one_tile_and_its_prompt_the_global_one(tokenizer):
    files = {"preprocessor_config.json": {**IDEFICS3_CONFIG, "do_image_splitting": False},
             "processor_config.json": {"image_seq_len": 4}}
    processor = image_processor(files, tokenizer.token_to_id)
    processed = processor.process(Image.fromarray(image(500, 300, 3)), False)
    assert processed.raw.shape == (1, 3, 364, 364) and processed.grid == (0, 0)
    assert processor.expansion(processed) == [processor.fake_id, processor.global_id, *[processor.placeholder_id] * 4,
                                              processor.fake_id]


def test_unusable_configs_are_refused(tokenizer):
    for config in ({"size": {"longest_edge": 100}, "max_image_size": {"longest_edge": 364}},
                   {"size": {"longest_edge": 7 * 364}},  # 7 tiles a side: no <row_7_col_7> token
                   {"max_image_size": 364}, {"resample": 9}):
        with pytest.raises(ProcessorConfigError):
            image_processor({"preprocessor_config.json": {**IDEFICS3_CONFIG, **config}}, tokenizer.token_to_id)
    with pytest.raises(ProcessorConfigError, match="no <row_1_col_1>"):
        image_processor({"preprocessor_config.json": IDEFICS3_CONFIG}, {"<image>": 1,
                                                                        "<fake_token_around_image>": 2}.get)
    # SmolVLM's: tiles of 512, 64 tokens a tile from its config.json when its processor config says none.
    smol = image_processor({"preprocessor_config.json": {"image_processor_type": "SmolVLMImageProcessor",
                                                         "size": {"longest_edge": 2048},
                                                         "max_image_size": {"longest_edge": 512}},
                            "config.json": {"scale_factor": 4, "vision_config": {"image_size": 512, "patch_size": 16}}},
                           tokenizer.token_to_id)
    assert (smol.tile, smol.tokens_per_tile) == (512, 64)


def test_a_vllm_request_carries_the_masks_flat_beside_the_tiles(idefics3):
    from gateway.engine.messages import SamplingOptions
    from gateway.engine.runtimes import ENGINE_RUNTIMES
    small = idefics3.process(Image.fromarray(image(300, 100, 4)), False)
    inputs = MediaInputs(idefics3, [small], ["b" * 64])
    ids, _ = inputs.expand([1, idefics3.placeholder_id, 2])
    request = ENGINE_RUNTIMES["vllm"].generate_request("r", ids, SamplingOptions(max_new_tokens=4), False,
                                                       media=(inputs,), raw_pixels=True)
    mm = request.mm_inputs
    assert dict(mm.flat_keys) == {"pixel_values": "num_patches", "pixel_attention_mask": "num_patches"}
    assert list(mm.batched_keys) == ["num_patches"] and list(mm.keep_on_cpu_keys) == ["num_patches"]
    mask = mm.model_specific_tensors["pixel_attention_mask"]
    assert mask.dtype == "uint8" and list(mask.shape) == [small.raw.shape[0], 364, 364]  # a dtype the servicer takes
    assert mm.im_token_id == idefics3.placeholder_id and [(p.offset, p.length) for p in mm.mm_placeholders] == [
        (1, len(ids) - 2)]

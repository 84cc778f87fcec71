"""Gemma 3's images against transformers' own processor (the oracle): the pixels of Gemma3ImageProcessorPil to the
last bit, and the prompt Gemma3Processor makes of a text and its images (the image sequence written as text and
tokenized, its newlines joined with the text's) equal to the gateway's expansion of the same text's ids. The
tokenizer is the Qwen one with Gemma 3's image tokens and newline tokens added (Gemma's own is not on this
machine): the merges are the tokenizer's, whatever its vocabulary."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from PIL import Image

from gateway.engine.runtimes.vllm import _media
from gateway.media.families import image_processor, with_request_kwargs
from gateway.media.processors import Gemma3Processor, PanAndScan, ProcessorConfigError
from tests.support.torchvision_goldens import (GEMMA3_PAS_CASES, GEMMA3_PAS_CONFIG, GEMMA3_PAS_DEFAULTS, GEMMA3_PROMPT,
                                               GOLDENS, digest, gemma3_pas_image, prompt_digest)
from tests.support.torchvision_goldens import gemma3_tokenizer as gemma3_goldens_tokenizer
from gateway.media.service import MediaInputs, joined_newlines
from gateway.tokenizer.bundled import default_tokenizer_dir

transformers = pytest.importorskip("transformers")
from transformers import PreTrainedTokenizerFast  # noqa: E402
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil  # noqa: E402
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor as HfGemma3Processor  # noqa: E402
from smg_grpc_proto.generated import vllm_engine_pb2  # noqa: E402

PUBLISHED = {  # google/gemma-3-4b-it's preprocessor_config.json
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5], "processor_class": "Gemma3Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896}}
IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
GOLDENS_JSON = json.loads(GOLDENS.read_text())


@pytest.fixture(scope="module")
def tokenizer() -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in IMAGE_TOKENS])
    tok.add_tokens([tokenizers.AddedToken("\n" * n, normalized=False) for n in (4, 3, 2, 1)])
    return tok


def oracle(tokenizer: tokenizers.Tokenizer, seq_length: int, size: int) -> HfGemma3Processor:
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, extra_special_tokens={
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
    return HfGemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": size, "width": size}),
                             tokenizer=hf_tokenizer, image_seq_length=seq_length)


def ours(tokenizer: tokenizers.Tokenizer, config: dict, reference: str = "pil") -> Gemma3Processor:
    processor = image_processor({"preprocessor_config.json": config}, tokenizer.token_to_id, reference)
    assert isinstance(processor, Gemma3Processor)
    return processor


def images(seed: int):
    rng = np.random.default_rng(seed)
    for w, h in [(200, 123), (896, 896), (1000, 20), (13, 600), (1280, 720), (1, 1), (897, 895)]:
        yield Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))
    x, y = np.meshgrid(np.linspace(0, 255, 733), np.linspace(0, 255, 411))  # smooth, as photos are
    yield Image.fromarray(np.stack([x, y, (x + y) / 2], axis=-1).astype(np.uint8))


@pytest.mark.parametrize("seed", [0, 1])
def test_pixels_equal_transformers_on_the_published_config(tokenizer, seed):
    processor = ours(tokenizer, PUBLISHED)
    reference = Gemma3ImageProcessorPil(**{k: v for k, v in PUBLISHED.items() if v is not None and k not in (
        "image_processor_type", "processor_class", "image_seq_length")})
    for image in images(seed):
        got = processor.process(image, True)
        want = reference(images=[image], return_tensors="np")
        assert got.normalized.dtype == np.float32 and got.normalized.shape == want["pixel_values"].shape == (
            1, 3, 896, 896), image.size
        assert np.array_equal(got.normalized, want["pixel_values"]), (image.size, seed)
        assert got.raw.dtype == np.uint8 and np.array_equal(processor.normalized(got.raw), got.normalized)
        assert got.tokens == 256 and list(want["num_crops"]) == [0]


PROMPTS = [
    "<start_of_turn>user\n<start_of_image>Describe this.<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_image>",
    "a\n\n<start_of_image><start_of_image>\n\nb",  # two images side by side: their newlines join as four
    "x\n<start_of_image>\ny",  # one newline each side: three
    "<start_of_image>\n\n\nz <start_of_image> w",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_expanded_prompt_is_the_one_transformers_tokenizes(tokenizer, prompt):
    seq_length, size = 16, 32
    config = {**PUBLISHED, "image_seq_length": seq_length, "size": {"height": size, "width": size}}
    processor = ours(tokenizer, config)
    count = prompt.count("<start_of_image>")
    pictures = [Image.fromarray(np.full((20 + i, 30, 3), 40 * i, np.uint8)) for i in range(count)]
    want = oracle(tokenizer, seq_length, size)(text=[prompt], images=[pictures], return_tensors="np")
    inputs = MediaInputs(processor, [processor.process(p, False) for p in pictures],
                         [f"{i + 1:064x}" for i in range(count)])
    expanded, routing = inputs.expand(tokenizer.encode(prompt, add_special_tokens=False).ids)
    assert expanded == want["input_ids"][0].tolist()
    soft = tokenizer.token_to_id("<image_soft_token>")
    assert len(inputs.ranges) == count
    for offset, length in inputs.ranges:
        # As vLLM places it: from the token its leading newlines became, the sequence's length long.
        assert length == seq_length + 4
        assert expanded[offset + 1] == tokenizer.token_to_id("<start_of_image>")
        assert expanded[offset + 2:offset + 2 + seq_length] == [soft] * seq_length
        assert expanded[offset + 2 + seq_length] == tokenizer.token_to_id("<end_of_image>")
        assert "\n\n" in tokenizer.id_to_token(expanded[offset]) and "\n\n" in tokenizer.id_to_token(
            expanded[offset + length - 1])
        assert soft not in routing[offset:offset + length]  # the image's hash there, not its tokens
    assert sum(1 for t in expanded if t == soft) == count * seq_length


def test_newlines_at_an_expansions_edges_are_written_again_and_the_text_s_own_are_not():
    pieces = {10: 1, 20: 2, 30: 3, 40: 4}
    # text "\n" + image (20 7 8 20) + text "\n\n\n" + text "\n": the first two join, the image's last with the
    # text's three (five: 4 + 1); a run away from any image is left.
    ids, ranges = joined_newlines([5, 10, 20, 7, 8, 20, 30, 6, 20, 20], [(2, 4)], pieces)
    assert ids == [5, 30, 7, 8, 40, 10, 6, 20, 20]
    assert ranges == [(1, 4)]
    # Two images side by side: their newlines join as four, the token both ranges share.
    ids, ranges = joined_newlines([20, 7, 20, 20, 8, 20], [(0, 3), (3, 3)], pieces)
    assert ids == [20, 7, 40, 8, 20] and ranges == [(0, 3), (2, 3)]
    # What follows a joined run moves with it; a run its tokens cannot write again (no "\n" of its own to end four
    # newlines written 3 + 1) is left as it was.
    ids, ranges = joined_newlines([10, 20, 7, 20, 5, 6, 20, 9, 20], [(1, 3), (6, 3)], pieces)
    assert ids == [30, 7, 20, 5, 6, 20, 9, 20] and ranges == [(0, 3), (5, 3)]
    assert joined_newlines([20, 20, 7, 20], [(1, 3)], {20: 2, 30: 3}) == ([20, 20, 7, 20], [(1, 3)])


def test_vllm_gets_the_crops_per_image_batched_and_the_soft_token(tokenizer):
    processor = ours(tokenizer, {**PUBLISHED, "image_seq_length": 4, "size": {"height": 16, "width": 16}})
    pictures = [Image.new("RGB", (20, 10), "red"), Image.new("RGB", (5, 9), "blue")]
    inputs = MediaInputs(processor, [processor.process(p, False) for p in pictures], ["a" * 64, "b" * 64])
    inputs.expand(tokenizer.encode("<start_of_image> and <start_of_image>", add_special_tokens=False).ids)
    mm = vllm_engine_pb2.MultimodalInputs()
    _media(mm, inputs, raw_pixels=True)
    assert list(mm.pixel_values.shape) == [2, 3, 16, 16] and mm.pixel_values.dtype == "uint8"
    assert dict(mm.flat_keys) == {"pixel_values": "num_patches"} and list(mm.batched_keys) == ["num_patches"]
    assert list(mm.keep_on_cpu_keys) == ["num_patches"]
    assert mm.im_token_id == tokenizer.token_to_id("<image_soft_token>")
    assert [(p.offset, p.length) for p in mm.mm_placeholders] == inputs.ranges


def test_a_tokenizer_without_the_tokens_is_refused_at_load_and_the_configs_pan_and_scan_is_not_read(tokenizer):
    # transformers' Gemma3Processor merges its own defaults (do_pan_and_scan false) over the image processor's
    # settings, so vLLM's server does not crop for a model whose file says true: neither does the gateway.
    processor = ours(tokenizer, {**PUBLISHED, "do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8})
    assert processor.pan_and_scan is None
    assert processor.process(Image.new("RGB", (3000, 200)), False).raw.shape == (1, 3, 896, 896)
    with pytest.raises(ProcessorConfigError, match="start_of_image"):
        image_processor({"preprocessor_config.json": PUBLISHED}, {"\n\n": 5}.get)
    # The sequence length from processor_config.json when the image processor's file does not say it.
    config = {k: v for k, v in PUBLISHED.items() if k != "image_seq_length"}
    processor = image_processor({"preprocessor_config.json": config, "processor_config.json": {
        "image_seq_length": 64}}, tokenizer.token_to_id)
    assert processor.tokens_per_image == 64


# -- pan and scan (a request's mm_processor_kwargs) ---------------------------------------------------------------

def _pas_processor(tokenizer, reference: str, **kwargs) -> Gemma3Processor:
    config = {**PUBLISHED, **{k: v for k, v in GEMMA3_PAS_CONFIG.items() if k != "image_processor_type"}}
    processor = image_processor({"preprocessor_config.json": config}, tokenizer.token_to_id, reference,
                                lambda text: tokenizer.encode(text, add_special_tokens=False).ids)
    return with_request_kwargs(processor, {**GEMMA3_PAS_DEFAULTS, **kwargs})


@pytest.fixture(scope="module")
def gemma3_tokenizer() -> tokenizers.Tokenizer:
    return gemma3_goldens_tokenizer((Path(default_tokenizer_dir()) / "tokenizer.json").read_text())


@pytest.mark.parametrize("name", list(GEMMA3_PAS_CASES))
def test_pan_and_scan_equals_transformers_torchvision_processor_and_its_prompt(gemma3_tokenizer, name):
    """The crops, their pixels to the bit, num_patches and the prompt Gemma3Processor writes around them, against
    goldens made with transformers' torchvision processor (tests/support/torchvision_goldens.py)."""
    kwargs, width, height = GEMMA3_PAS_CASES[name]
    processor = _pas_processor(gemma3_tokenizer, "torchvision", **kwargs)
    pixels_want, crops_want, prompt_want = GOLDENS_JSON["gemma3_pan_and_scan"][name]
    processed = processor.process(Image.fromarray(gemma3_pas_image(name)), True)
    assert digest(processed.normalized) == pixels_want and processed.raw.shape[0] == crops_want + 1
    assert processed.tokens == 16 * (crops_want + 1)
    inputs = MediaInputs(processor, [processed], ["a" * 64])
    expanded, _ = inputs.expand(gemma3_tokenizer.encode(GEMMA3_PROMPT, add_special_tokens=False).ids)
    assert prompt_digest(expanded) == prompt_want, name
    mm = vllm_engine_pb2.MultimodalInputs()
    _media(mm, inputs, raw_pixels=True)
    assert list(mm.model_specific_tensors["num_patches"].shape) == [1]
    assert np.frombuffer(mm.model_specific_tensors["num_patches"].inline, np.int64).tolist() == [crops_want + 1]
    # The range: from the text before the image (or its joined newlines) to the last crop's newlines, the soft
    # tokens of every square inside it and nowhere else.
    (offset, length), = inputs.ranges
    soft = gemma3_tokenizer.token_to_id("<image_soft_token>")
    assert expanded[offset:offset + length].count(soft) == expanded.count(soft) == 16 * (crops_want + 1)
    assert "\n\n" in gemma3_tokenizer.id_to_token(expanded[offset + length - 1])
    if crops_want:
        assert gemma3_tokenizer.decode(expanded[offset:offset + 4]).startswith("Here is the")


@pytest.mark.parametrize("seed", [3, 4])
def test_pan_and_scan_pixels_equal_transformers_pil_processor(gemma3_tokenizer, seed):
    processor = _pas_processor(gemma3_tokenizer, "pil")
    reference = Gemma3ImageProcessorPil(size={"height": 112, "width": 112}, resample=2)
    rng = np.random.default_rng(seed)
    for width, height in [(200, 123), (40, 300), (1000, 90), (97, 19), (300, 299)]:
        picture = Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8))
        got = processor.process(picture, True)
        want = reference(images=[picture], return_tensors="np", **GEMMA3_PAS_DEFAULTS)
        assert np.array_equal(got.normalized, want["pixel_values"]), (width, height, seed)
        assert got.raw.shape[0] == 1 + int(want["num_crops"][0])


def test_crops_are_counted_as_transformers_counts_them():
    # Every shape on a grid, against transformers' own pan_and_scan (on an array of the shape).
    reference = Gemma3ImageProcessorPil()
    for min_crop, max_crops, ratio in [(256, 4, 1.2), (7, 3, 1.5), (1, 8, 1.0), (30, 2, 2.5)]:
        rule = PanAndScan(min_crop, max_crops, ratio)
        for width in (*range(1, 60, 3), 255, 256, 257, 511, 512, 1023, 1024, 1200, 3000):
            for height in (1, 2, 5, 9, 17, 31, 64, 100, 255, 256, 300, 700):
                want = reference.pan_and_scan(np.zeros((1, height, width), np.uint8), min_crop, max_crops, ratio)
                got = rule.crops(width, height)
                assert [(bottom - top, right - left) for left, top, right, bottom in got] == [
                    crop.shape[1:] for crop in want], (width, height, min_crop, max_crops, ratio)


def test_request_kwargs_are_checked_and_make_their_own_cache_key(tokenizer):
    processor = ours(tokenizer, PUBLISHED)
    assert with_request_kwargs(processor, {}) is processor
    assert with_request_kwargs(processor, {"do_pan_and_scan": False}) == processor
    cropping = with_request_kwargs(dataclasses.replace(processor, encode_text=lambda text: [1]),
                                   {"do_pan_and_scan": True})
    assert cropping.pan_and_scan == PanAndScan(256, 4, 1.2) and cropping.describe() != processor.describe()
    for bad, says in [({"max_pixels": 100}, "'max_pixels' is not applied"), ({"do_pan_and_scan": "yes"}, "boolean"),
                      ({"do_pan_and_scan": True, "pan_and_scan_max_num_crops": 100}, "from 2 to 8"),
                      ({"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 0}, "positive"),
                      ({"do_pan_and_scan": True, "pan_and_scan_min_crop_size": True}, "positive"),
                      ({"do_pan_and_scan": True, "pan_and_scan_min_ratio_to_activate": 0.5}, "at least 1")]:
        with pytest.raises(ValueError, match=says):
            with_request_kwargs(cropping, bad)
    with pytest.raises(ValueError, match="tokenizer"):  # its text needs the model's tokenizer
        with_request_kwargs(processor, {"do_pan_and_scan": True})
    llava = image_processor({"preprocessor_config.json": {"image_processor_type": "CLIPImageProcessor"}},
                            {"<image>": 7}.get)
    with pytest.raises(ValueError, match="take no mm_processor_kwargs"):
        with_request_kwargs(llava, {"max_pixels": 100})

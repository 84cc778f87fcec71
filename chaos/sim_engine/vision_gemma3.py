"""The simulated engine as a Gemma 3 vision model (``--vision-family gemma3``): its bundle carries Gemma 3's image
processor config (a small square, so tests stay cheap), a chat template that writes ``<start_of_image>`` for each
image part as Gemma 3's does, and the tokenizer with Gemma 3's image tokens and newline tokens added (written here,
in that format, onto the tokenizer it is given). A Generate carrying images is checked as vLLM's and SGLang's
Gemma 3 need them: a square an image and one a pan-and-scan crop (vLLM: pixel rows flat by ``num_patches``, which
is batched and kept on the CPU), the soft token as the image token, each range the whole image sequence ("\\n\\n" or
the newline token it joined, <start_of_image>, the soft tokens, <end_of_image>, its newlines), or with crops the text
around one sequence a square, and no soft token outside them;
refused with INVALID_ARGUMENT naming what is off. What a Qwen2-VL-style engine checks otherwise is vision.py's.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from .vision import (CheckedImages, ImagesRefused, _array, cache_ids_of, check_pixels_and_token, placeholders,
                     tokenizer_with)

SIZE = 32  # pixels a side
TOKENS_PER_IMAGE = 4
IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
PREPROCESSOR_CONFIG = {
    "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor", "do_resize": True,
    "do_rescale": True, "do_normalize": True, "do_pan_and_scan": None, "resample": 2, "rescale_factor": 1 / 255,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "size": {"height": SIZE, "width": SIZE},
    "image_seq_length": TOKENS_PER_IMAGE,
}
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")


class Gemma3Tokens:
    """The tokenizer the bundle carries (the given one with Gemma 3's tokens added) and the ids the checks need."""

    def __init__(self, tokenizer_json: bytes) -> None:
        tok = tokenizer_with(tokenizer_json, (*IMAGE_TOKENS, "<start_of_turn>", "<end_of_turn>"),
                             tuple("\n" * n for n in (4, 3, 2, 1)))
        self.tokenizer_json = tok.to_str().encode()
        self.boi, self.eoi, self.soft = (tok.token_to_id(t) for t in IMAGE_TOKENS)
        self.newlines = {tok.token_to_id("\n" * n) for n in (2, 3, 4)}  # what an image's "\n\n" may have joined


def bundle_files(tokenizer_json: bytes) -> dict[str, bytes]:
    return {"preprocessor_config.json": json.dumps(PREPROCESSOR_CONFIG).encode(),
            "chat_template.jinja": CHAT_TEMPLATE.encode(),
            "tokenizer.json": Gemma3Tokens(tokenizer_json).tokenizer_json}


def check(tokens: Gemma3Tokens, input_ids: "list[int]", pixels: np.ndarray, ranges: "list[tuple[int, int]]",
          im_token_id: int | None, hashes: "list[str]", raw: bool, crops: "list[int] | None" = None) -> CheckedImages:
    """``crops``: squares per image (vLLM's num_patches: the image and its pan-and-scan crops); None when the form
    does not say them (SGLang's): each range's <start_of_image> count says them then."""
    n = TOKENS_PER_IMAGE
    counted = [input_ids[offset:offset + length].count(tokens.boi) for offset, length in ranges]
    crops = counted if crops is None else crops
    check_pixels_and_token(pixels, (sum(crops), 3, SIZE, SIZE), raw, im_token_id, tokens.soft, hashes, len(ranges),
                           f"{sum(crops)} squares of 3 x {SIZE} x {SIZE} for {len(ranges)} images")
    sequence = [tokens.boi, *[tokens.soft] * n, tokens.eoi]
    for (offset, length), squares, boi_count in zip(ranges, crops, counted):
        window = input_ids[offset:offset + length]
        if squares == 1:  # the sequence alone, its newlines perhaps joined with the text's
            whole = length == n + 4 and len(window) == length and window[0] in tokens.newlines and \
                window[-1] in tokens.newlines and window[1:n + 3] == sequence
        else:  # pan and scan: text around as many sequences as squares, the first one's text before it
            whole = len(window) == length and boi_count == squares and window[0] not in tokens.newlines and \
                window[-1] in tokens.newlines and all(window[at:at + n + 2] == sequence
                                                      for at, token in enumerate(window) if token == tokens.boi)
        if not whole:
            raise ImagesRefused(f"the range ({offset}, {length}) is not {squares} image sequences (\\n\\n "
                                f"<start_of_image> {n} soft tokens <end_of_image> \\n\\n) in the prompt")
    if input_ids.count(tokens.soft) != n * sum(crops):
        raise ImagesRefused(f"the prompt has {input_ids.count(tokens.soft)} soft tokens for {sum(crops)} squares")
    digest = zlib.crc32(pixels.tobytes())
    per_image = np.split(pixels.reshape(sum(crops), -1), np.cumsum(crops)[:-1])
    return CheckedImages(digest, cache_ids_of(input_ids, [rows.reshape(-1) for rows in per_image], ranges, hashes))


def check_vllm(tokens: Gemma3Tokens, mm: Any, input_ids: "list[int]", config: Any) -> CheckedImages:
    tensors = {key: _array(td.inline, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    pixels = _array(mm.pixel_values.inline, mm.pixel_values.shape, mm.pixel_values.dtype)
    if dict(mm.flat_keys) != {"pixel_values": "num_patches"} or "num_patches" not in mm.batched_keys or \
            "num_patches" not in mm.keep_on_cpu_keys or "num_patches" not in tensors:
        raise ImagesRefused("vLLM's Gemma 3 layout is pixel_values flat by num_patches, num_patches batched and kept "
                            "on the CPU")
    crops = tensors["num_patches"].tolist()
    if len(crops) != len(mm.mm_placeholders) or min(crops, default=1) < 1:
        raise ImagesRefused(f"num_patches is {crops} for {len(mm.mm_placeholders)} images")
    return check(tokens, input_ids, pixels, *placeholders(mm), list(mm.mm_hashes), not config.vision_takes_floats,
                 crops)


def check_sglang(tokens: Gemma3Tokens, mm: Any, input_ids: "list[int]") -> CheckedImages:
    pixels = _array(mm.pixel_values.data, mm.pixel_values.shape, mm.pixel_values.dtype)
    return check(tokens, input_ids, pixels, *placeholders(mm), [], False)

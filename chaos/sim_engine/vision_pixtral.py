"""The simulated engine as a Mistral 3 vision model (``--vision-family pixtral``): its bundle carries Pixtral's
image processor and processor configs (small: at most 64 pixels a side, patches of 8 merged 2 x 2, so one [IMG]
is 16 x 16 pixels), a chat template that writes [IMG] for each image part as Mistral's do, and the tokenizer with
[IMG], [IMG_BREAK], [IMG_END], [INST] and [/INST] added (written here, in that format, onto the tokenizer it is
given). A Generate carrying images is checked as vLLM's Mistral 3 needs them: each image at its own size, whole
merged patches (vLLM: pixel_values batched, so a request's images share one size), [IMG] as the image token, and
each range the image's rows ([IMG] a merged patch, [IMG_BREAK] after each row, [IMG_END] last); refused with
INVALID_ARGUMENT naming what is off.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from .vision import CheckedImages, ImagesRefused, _array, cache_ids_of, placeholders, tokenizer_with

LONGEST_EDGE, PATCH, MERGE = 64, 8, 2
SQUARE = PATCH * MERGE  # pixels a side of what one [IMG] stands for
IMAGE_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")
PREPROCESSOR_CONFIG = {
    "image_processor_type": "PixtralImageProcessor", "processor_class": "PixtralProcessor", "do_resize": True,
    "do_rescale": True, "do_normalize": True, "resample": 3, "rescale_factor": 1 / 255,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "patch_size": {"height": PATCH, "width": PATCH}, "size": {"longest_edge": LONGEST_EDGE},
}
PROCESSOR_CONFIG = {"processor_class": "PixtralProcessor", "patch_size": PATCH, "spatial_merge_size": MERGE,
                    "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ '[INST]' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '[IMG]' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '[/INST]' }}"
    "{%- else -%}{{ message['content'] }}{{ eos_token }}{%- endif -%}"
    "{%- endfor -%}")


class PixtralTokens:
    """The tokenizer the bundle carries (the given one with Pixtral's tokens added) and the ids the checks need."""

    def __init__(self, tokenizer_json: bytes) -> None:
        tok = tokenizer_with(tokenizer_json, (*IMAGE_TOKENS, "[INST]", "[/INST]"))
        self.tokenizer_json = tok.to_str().encode()
        self.image, self.row_end, self.end = (tok.token_to_id(t) for t in IMAGE_TOKENS)


def bundle_files(tokenizer_json: bytes) -> dict[str, bytes]:
    return {"preprocessor_config.json": json.dumps(PREPROCESSOR_CONFIG).encode(),
            "processor_config.json": json.dumps(PROCESSOR_CONFIG).encode(),
            "chat_template.jinja": CHAT_TEMPLATE.encode(),
            "tokenizer.json": PixtralTokens(tokenizer_json).tokenizer_json}


def check(tokens: PixtralTokens, input_ids: "list[int]", pixels: np.ndarray, ranges: "list[tuple[int, int]]",
          im_token_id: int | None, hashes: "list[str]", raw: bool) -> CheckedImages:
    kind = np.uint8 if raw else np.float32
    if pixels.ndim != 4 or pixels.shape[:2] != (len(ranges), 3) or pixels.dtype != kind or \
            pixels.shape[2] % SQUARE or pixels.shape[3] % SQUARE or max(pixels.shape[2:]) > LONGEST_EDGE + SQUARE:
        raise ImagesRefused(f"pixel_values is {pixels.dtype}{list(pixels.shape)}; this engine takes {kind.__name__} "
                            f"images of 3 x h x w in whole {SQUARE}-pixel squares, {len(ranges)} of them")
    if im_token_id != tokens.image:
        raise ImagesRefused(f"im_token_id is {im_token_id}; this model's image token is {tokens.image}")
    if hashes and len(hashes) != len(ranges):
        raise ImagesRefused(f"{len(hashes)} mm_hashes for {len(ranges)} images")
    rows, columns = pixels.shape[2] // SQUARE, pixels.shape[3] // SQUARE
    want = ([tokens.image] * columns + [tokens.row_end]) * rows
    want[-1] = tokens.end
    for offset, length in ranges:
        if input_ids[offset:offset + length] != want:
            raise ImagesRefused(f"the range ({offset}, {length}) is not {rows} rows of {columns} [IMG] in the prompt")
    if input_ids.count(tokens.image) != rows * columns * len(ranges):
        raise ImagesRefused(f"the prompt has {input_ids.count(tokens.image)} [IMG] tokens for {len(ranges)} images "
                            f"of {rows} x {columns}")
    return CheckedImages(zlib.crc32(pixels.tobytes()),
                         cache_ids_of(input_ids, list(pixels), ranges, hashes))


def check_vllm(tokens: PixtralTokens, mm: Any, input_ids: "list[int]", config: Any) -> CheckedImages:
    if dict(mm.flat_keys) or list(mm.batched_keys) != ["pixel_values"]:
        raise ImagesRefused("vLLM's Mistral 3 layout is pixel_values batched, one image an entry, and nothing else")
    pixels = _array(mm.pixel_values.inline, mm.pixel_values.shape, mm.pixel_values.dtype)
    return check(tokens, input_ids, pixels, *placeholders(mm), list(mm.mm_hashes), not config.vision_takes_floats)


def check_sglang(tokens: PixtralTokens, mm: Any, input_ids: "list[int]") -> CheckedImages:
    pixels = _array(mm.pixel_values.data, mm.pixel_values.shape, mm.pixel_values.dtype)
    return check(tokens, input_ids, pixels, *placeholders(mm), [], False)

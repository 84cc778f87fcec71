"""The simulated engine as an InternVL vision model in the Hugging Face format (``--vision-family internvl``): its
bundle carries GotOcr2's image processor config and InternVL's processor config (small: tiles of 28 pixels, up to 4,
4 <IMG_CONTEXT> a tile), a chat template that writes <IMG_CONTEXT> for each image part as InternVL's does, and the
tokenizer with <img>, </img>, <IMG_CONTEXT> and <video> added (written here, in that format, onto the tokenizer it is
given). A Generate carrying images is checked as vLLM's InternVL needs them: each image's tiles (and thumbnail) flat
by ``image_num_patches``, the context token's id as ``image_token_id`` (both batched and kept on the CPU), the
context token as the image token, and each range <img>, 4 <IMG_CONTEXT> a tile, </img>; refused with
INVALID_ARGUMENT naming what is off.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from .vision import (CheckedImages, ImagesRefused, _array, cache_ids_of, check_pixels_and_token, placeholders,
                     tokenizer_with)

TILE, MAX_TILES, TOKENS_PER_TILE = 28, 4, 4
IMAGE_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>", "<video>")
PREPROCESSOR_CONFIG = {
    "image_processor_type": "GotOcr2ImageProcessorFast", "processor_class": "InternVLProcessor", "do_resize": True,
    "do_rescale": True, "do_normalize": True, "resample": 3, "rescale_factor": 1 / 255, "crop_to_patches": False,
    "min_patches": 1, "max_patches": MAX_TILES, "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225], "size": {"height": TILE, "width": TILE},
}
PROCESSOR_CONFIG = {"processor_class": "InternVLProcessor", "image_seq_length": TOKENS_PER_TILE}
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<IMG_CONTEXT>\\n' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


class InternVLTokens:
    """The tokenizer the bundle carries (the given one with InternVL's tokens added) and the ids the checks need."""

    def __init__(self, tokenizer_json: bytes) -> None:
        tok = tokenizer_with(tokenizer_json, IMAGE_TOKENS)
        self.tokenizer_json = tok.to_str().encode()
        self.start, self.end, self.context = (tok.token_to_id(t) for t in IMAGE_TOKENS[:3])


def bundle_files(tokenizer_json: bytes) -> dict[str, bytes]:
    return {"preprocessor_config.json": json.dumps(PREPROCESSOR_CONFIG).encode(),
            "processor_config.json": json.dumps(PROCESSOR_CONFIG).encode(),
            "chat_template.jinja": CHAT_TEMPLATE.encode(),
            "tokenizer.json": InternVLTokens(tokenizer_json).tokenizer_json}


def check(tokens: InternVLTokens, input_ids: "list[int]", pixels: np.ndarray, tiles: np.ndarray,
          ranges: "list[tuple[int, int]]", im_token_id: int | None, hashes: "list[str]", raw: bool) -> CheckedImages:
    counts = tiles.tolist()
    if len(counts) != len(ranges) or any(n not in (1, *range(3, MAX_TILES + 2)) for n in counts):
        raise ImagesRefused(f"image_num_patches is {counts}: 1, or 2 to {MAX_TILES} tiles and a thumbnail, an "
                            f"image; {len(ranges)} images")
    check_pixels_and_token(pixels, (sum(counts), 3, TILE, TILE), raw, im_token_id, tokens.context, hashes,
                           len(ranges), f"tiles of 3 x {TILE} x {TILE}, {sum(counts)} for image_num_patches {counts}")
    for (offset, length), n in zip(ranges, counts):
        if input_ids[offset:offset + length] != [tokens.start, *[tokens.context] * (n * TOKENS_PER_TILE), tokens.end]:
            raise ImagesRefused(f"the range ({offset}, {length}) is not <img>, {n * TOKENS_PER_TILE} <IMG_CONTEXT>, "
                                "</img> in the prompt")
    if input_ids.count(tokens.context) != sum(counts) * TOKENS_PER_TILE:
        raise ImagesRefused(f"the prompt has {input_ids.count(tokens.context)} <IMG_CONTEXT> tokens for "
                            f"{sum(counts)} tiles")
    rows = np.split(pixels, np.cumsum(counts)[:-1])
    return CheckedImages(zlib.crc32(pixels.tobytes()), cache_ids_of(input_ids, [r.reshape(-1) for r in rows],
                                                                    ranges, hashes))


def check_vllm(tokens: InternVLTokens, mm: Any, input_ids: "list[int]", config: Any) -> CheckedImages:
    tensors = {key: _array(td.inline, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    pixels = _array(mm.pixel_values.inline, mm.pixel_values.shape, mm.pixel_values.dtype)
    wanted = {"image_num_patches", "image_token_id"}
    if dict(mm.flat_keys) != {"pixel_values": "image_num_patches"} or \
            not wanted <= set(mm.batched_keys) & set(mm.keep_on_cpu_keys) or not wanted <= set(tensors):
        raise ImagesRefused("vLLM's InternVL layout is pixel_values flat by image_num_patches, image_num_patches and "
                            "image_token_id batched and kept on the CPU")
    if set(tensors["image_token_id"].tolist()) != {tokens.context}:
        raise ImagesRefused(f"image_token_id is {tensors['image_token_id'].tolist()}; the context token is "
                            f"{tokens.context}")
    return check(tokens, input_ids, pixels, tensors["image_num_patches"], *placeholders(mm), list(mm.mm_hashes),
                 not config.vision_takes_floats)


def check_sglang(tokens: InternVLTokens, mm: Any, input_ids: "list[int]") -> CheckedImages:
    pixels = _array(mm.pixel_values.data, mm.pixel_values.shape, mm.pixel_values.dtype)
    tensors = {key: _array(td.data, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    if "image_num_patches" not in tensors:
        raise ImagesRefused("InternVL takes image_num_patches beside the pixels")
    return check(tokens, input_ids, pixels, tensors["image_num_patches"], *placeholders(mm), [], False)

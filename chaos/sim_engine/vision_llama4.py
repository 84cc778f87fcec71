"""The simulated engine as a Llama 4 vision model (``--vision-family llama4``): its bundle carries Llama 4's image
processor config and model config (small: tiles of 28 pixels, at most 4 of them, patches of 7 shuffled by 0.5, so
4 <|patch|> tokens a tile), a chat template that writes <|image|> for each image part as Llama 4's does, and the
tokenizer with Llama 4's image and header tokens added (written here, in that format, onto the tokenizer it is
given). A Generate carrying images is checked as vLLM's Llama 4 needs them: the tiles of each image and its global
view (vLLM: pixel rows flat by ``patches_per_image``; it and ``aspect_ratios`` batched and kept on the CPU), the
patch token as the image token, and each range the image's sequence for its tiles (<|image_start|>, each tile's
patches with <|tile_x_separator|> between the tiles of a row and <|tile_y_separator|> after a row, <|image|>, the
global view's patches, <|image_end|>); refused with INVALID_ARGUMENT naming what is off.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from .vision import (CheckedImages, ImagesRefused, _array, cache_ids_of, check_pixels_and_token, placeholders,
                     tokenizer_with)

TILE, MAX_TILES, PATCH = 28, 4, 7
PATCHES_PER_TILE = (TILE // PATCH) ** 2 // 4  # a pixel shuffle of 0.5 merges 2 x 2 patches
IMAGE_TOKENS = ("<|image|>", "<|patch|>", "<|image_start|>", "<|image_end|>", "<|tile_x_separator|>",
                "<|tile_y_separator|>")
PREPROCESSOR_CONFIG = {
    "image_processor_type": "Llama4ImageProcessorFast", "processor_class": "Llama4Processor", "do_resize": True,
    "do_rescale": True, "do_normalize": True, "resample": 2, "rescale_factor": 1 / 255, "max_patches": MAX_TILES,
    "resize_to_max_canvas": False, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "size": {"height": TILE, "width": TILE},
}
PROCESSOR_CONFIG = {"processor_class": "Llama4Processor", "patch_size": PATCH, "fake_image_token": "<|image|>",
                    "image_token": "<|image|>"}
MODEL_CONFIG = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                "vision_config": {"image_size": TILE, "patch_size": PATCH, "pixel_shuffle_ratio": 0.5}}
CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{{ '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<|image|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '<|eot|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif -%}")


class Llama4Tokens:
    """The tokenizer the bundle carries (the given one with Llama 4's tokens added) and the ids the checks need."""

    def __init__(self, tokenizer_json: bytes) -> None:
        tok = tokenizer_with(tokenizer_json, (*IMAGE_TOKENS, "<|header_start|>", "<|header_end|>", "<|eot|>"))
        self.tokenizer_json = tok.to_str().encode()
        self.image, self.patch, self.start, self.end, self.tile_x, self.tile_y = (
            tok.token_to_id(t) for t in IMAGE_TOKENS)

    def sequence(self, rows: int, columns: int) -> "list[int]":
        """The prompt's tokens for an image of ``rows`` x ``columns`` tiles (Llama4Processor's)."""
        patches = [self.patch] * PATCHES_PER_TILE
        ids = [self.start]
        if rows * columns > 1:
            for _ in range(rows):
                for column in range(columns):
                    ids += patches + ([self.tile_x] if column < columns - 1 else [])
                ids.append(self.tile_y)
        return ids + [self.image, *patches, self.end]


def bundle_files(tokenizer_json: bytes) -> dict[str, bytes]:
    return {"preprocessor_config.json": json.dumps(PREPROCESSOR_CONFIG).encode(),
            "processor_config.json": json.dumps(PROCESSOR_CONFIG).encode(),
            "config.json": json.dumps(MODEL_CONFIG).encode(),
            "chat_template.jinja": CHAT_TEMPLATE.encode(),
            "tokenizer.json": Llama4Tokens(tokenizer_json).tokenizer_json}


def check(tokens: Llama4Tokens, input_ids: "list[int]", pixels: np.ndarray, ratios: np.ndarray,
          ranges: "list[tuple[int, int]]", im_token_id: int | None, hashes: "list[str]", raw: bool) -> CheckedImages:
    if ratios.shape != (len(ranges), 2) or ratios.min(initial=1) < 1 or \
            (ratios[:, 0] * ratios[:, 1]).max(initial=1) > MAX_TILES:
        raise ImagesRefused(f"aspect_ratios is {ratios.tolist()}: (rows, columns) of at most {MAX_TILES} tiles an "
                            f"image, {len(ranges)} images")
    views = [int(r * c) + (1 if r * c > 1 else 0) for r, c in ratios]  # tiles, and the global view of a tiled one
    check_pixels_and_token(pixels, (sum(views), 3, TILE, TILE), raw, im_token_id, tokens.patch, hashes, len(ranges),
                           f"tiles of 3 x {TILE} x {TILE}, {sum(views)} for these aspect ratios")
    if not raw and (pixels.min() < -1 or pixels.max() > 1 or not _is_bfloat16(pixels)):
        raise ImagesRefused("pixel_values are not Llama 4's: normalized levels in [-1, 1], each a bfloat16")
    for (offset, length), (rows, columns) in zip(ranges, ratios.tolist()):
        if input_ids[offset:offset + length] != tokens.sequence(rows, columns):
            raise ImagesRefused(f"the range ({offset}, {length}) is not the image sequence of {rows} x {columns} "
                                "tiles in the prompt")
    patches = sum(v * PATCHES_PER_TILE for v in views)
    if input_ids.count(tokens.patch) != patches:
        raise ImagesRefused(f"the prompt has {input_ids.count(tokens.patch)} <|patch|> tokens for {patches}")
    rows = np.split(pixels, np.cumsum(views)[:-1])
    return CheckedImages(zlib.crc32(pixels.tobytes()), cache_ids_of(input_ids, [r.reshape(-1) for r in rows],
                                                                    ranges, hashes))


def _is_bfloat16(values: np.ndarray) -> bool:
    """Every value a bfloat16 (a float32 whose low 16 bits are zero), as Llama 4's processor leaves them."""
    return not np.any(np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF))


def check_vllm(tokens: Llama4Tokens, mm: Any, input_ids: "list[int]", config: Any) -> CheckedImages:
    tensors = {key: _array(td.inline, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    pixels = _array(mm.pixel_values.inline, mm.pixel_values.shape, mm.pixel_values.dtype)
    if dict(mm.flat_keys) != {"pixel_values": "patches_per_image"} or \
            not {"patches_per_image", "aspect_ratios"} <= set(mm.batched_keys) & set(mm.keep_on_cpu_keys) or \
            not {"patches_per_image", "aspect_ratios"} <= set(tensors):
        raise ImagesRefused("vLLM's Llama 4 layout is pixel_values flat by patches_per_image, patches_per_image and "
                            "aspect_ratios batched and kept on the CPU")
    ranges, im_token_id = placeholders(mm)
    checked = check(tokens, input_ids, pixels, tensors["aspect_ratios"], ranges, im_token_id, list(mm.mm_hashes),
                    not config.vision_takes_floats)
    views = [int(r * c) + (1 if r * c > 1 else 0) for r, c in tensors["aspect_ratios"]]
    if tensors["patches_per_image"].tolist() != views:
        raise ImagesRefused(f"patches_per_image is {tensors['patches_per_image'].tolist()} for aspect ratios "
                            f"{tensors['aspect_ratios'].tolist()}: tiles and a global view of a tiled image")
    return checked


def check_sglang(tokens: Llama4Tokens, mm: Any, input_ids: "list[int]") -> CheckedImages:
    pixels = _array(mm.pixel_values.data, mm.pixel_values.shape, mm.pixel_values.dtype)
    tensors = {key: _array(td.data, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    if "aspect_ratios" not in tensors:
        raise ImagesRefused("SGLang's Llama 4 takes aspect_ratios beside the pixels")
    return check(tokens, input_ids, pixels, tensors["aspect_ratios"], *placeholders(mm), [], False)

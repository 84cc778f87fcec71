"""The simulated engine as an Idefics3 / SmolVLM vision model (``--vision-family idefics3``): its bundle carries
Idefics3's image processor config (small: the longest edge 4 tiles of 28 pixels) and processor config (4 <image> a
tile), a chat template that writes <image> for each image part as Idefics3's does, and the tokenizer with
<fake_token_around_image>, <image>, <global-img> and the <row_i_col_j> tokens added (written here, in that format,
onto the tokenizer it is given). A Generate carrying images is checked as vLLM's Idefics3 needs them: each image's
tiles and global image flat by ``num_patches`` (batched, kept on the CPU), a pixel attention mask flat the same way,
<image> as the image token, and each range the tiles' <fake_token_around_image><row_i_col_j> and <image> runs with a
newline after each row, "\\n\\n" and the global image's; refused with INVALID_ARGUMENT naming what is off.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from .vision import (CheckedImages, ImagesRefused, _array, cache_ids_of, check_pixels_and_token, placeholders,
                     tokenizer_with)

TILE, TOKENS_PER_TILE, GRID_MAX = 28, 4, 6
IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
                *(f"<row_{row}_col_{column}>" for row in range(1, GRID_MAX + 1) for column in range(1, GRID_MAX + 1)))
PREPROCESSOR_CONFIG = {
    "image_processor_type": "Idefics3ImageProcessor", "processor_class": "Idefics3Processor", "do_resize": True,
    "do_rescale": True, "do_normalize": True, "do_image_splitting": True, "resample": 1, "rescale_factor": 1 / 255,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "size": {"longest_edge": 4 * TILE},
    "max_image_size": {"longest_edge": TILE},
}
PROCESSOR_CONFIG = {"processor_class": "Idefics3Processor", "image_seq_len": TOKENS_PER_TILE}
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ message['role'] | capitalize }}"
    "{%- if message['content'] is string -%}{{ ': ' + message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ ': ' + item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '<end_of_utterance>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}")


class Idefics3Tokens:
    """The tokenizer the bundle carries (the given one with Idefics3's tokens added) and the ids the checks need."""

    def __init__(self, tokenizer_json: bytes) -> None:
        tok = tokenizer_with(tokenizer_json, IMAGE_TOKENS)
        self.tokenizer_json = tok.to_str().encode()
        self.fake, self.image, self.global_image = (tok.token_to_id(t) for t in IMAGE_TOKENS[:3])
        self.grid = [tok.token_to_id(t) for t in IMAGE_TOKENS[4:]]
        self.newline, self.double_newline = (tok.encode(text, add_special_tokens=False).ids[0]
                                             for text in ("\n", "\n\n"))

    def sequence(self, rows: int, columns: int) -> "list[int]":
        """An image's tokens as Idefics3Processor writes them, tokenized."""
        run = [self.image] * TOKENS_PER_TILE
        out: list[int] = []
        for row in range(rows):
            for column in range(columns):
                out += [self.fake, self.grid[row * GRID_MAX + column], *run]
            if row < rows - 1:
                out.append(self.newline)
        if rows:
            out.append(self.double_newline)
        return out + [self.fake, self.global_image, *run, self.fake]


def bundle_files(tokenizer_json: bytes) -> dict[str, bytes]:
    return {"preprocessor_config.json": json.dumps(PREPROCESSOR_CONFIG).encode(),
            "processor_config.json": json.dumps(PROCESSOR_CONFIG).encode(),
            "chat_template.jinja": CHAT_TEMPLATE.encode(),
            "tokenizer.json": Idefics3Tokens(tokenizer_json).tokenizer_json}


def _grid(patches: int, length: int) -> "tuple[int, int] | None":
    """The (rows, columns) of tiles whose sequence is ``length`` long, for an image of ``patches`` patches."""
    if patches == 1:
        return 0, 0
    for rows in range(1, GRID_MAX + 1):
        if (patches - 1) % rows == 0 and (patches - 1) // rows <= GRID_MAX:
            columns = (patches - 1) // rows
            tiles = rows * columns
            if length == tiles * (2 + TOKENS_PER_TILE) + (rows - 1) + 1 + 3 + TOKENS_PER_TILE:
                return rows, columns
    return None


def check(tokens: Idefics3Tokens, input_ids: "list[int]", pixels: np.ndarray, counts: "list[int]",
          mask: np.ndarray, ranges: "list[tuple[int, int]]", im_token_id: int | None, hashes: "list[str]",
          raw: bool) -> CheckedImages:
    if len(counts) != len(ranges) or any(not 1 <= n <= GRID_MAX * GRID_MAX + 1 for n in counts):
        raise ImagesRefused(f"num_patches is {counts} for {len(ranges)} images")
    check_pixels_and_token(pixels, (sum(counts), 3, TILE, TILE), raw, im_token_id, tokens.image, hashes, len(ranges),
                           f"tiles of 3 x {TILE} x {TILE}, {sum(counts)} for num_patches {counts}")
    if mask.shape != (sum(counts), TILE, TILE) or not mask.all():
        raise ImagesRefused(f"pixel_attention_mask is {list(mask.shape)} with {int(mask.size - mask.sum())} "
                            f"padded pixels; one a tile, none padded")
    for (offset, length), n in zip(ranges, counts):
        grid = _grid(n, length)
        if grid is None or input_ids[offset:offset + length] != tokens.sequence(*grid):
            raise ImagesRefused(f"the range ({offset}, {length}) is not Idefics3's sequence for {n} patches")
    if input_ids.count(tokens.image) != sum(counts) * TOKENS_PER_TILE:
        raise ImagesRefused(f"the prompt has {input_ids.count(tokens.image)} <image> tokens for {sum(counts)} tiles")
    rows = np.split(pixels, np.cumsum(counts)[:-1])
    return CheckedImages(zlib.crc32(pixels.tobytes()), cache_ids_of(input_ids, [r.reshape(-1) for r in rows],
                                                                    ranges, hashes))


def check_vllm(tokens: Idefics3Tokens, mm: Any, input_ids: "list[int]", config: Any) -> CheckedImages:
    tensors = {key: _array(td.inline, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    pixels = _array(mm.pixel_values.inline, mm.pixel_values.shape, mm.pixel_values.dtype)
    if dict(mm.flat_keys) != {"pixel_values": "num_patches", "pixel_attention_mask": "num_patches"} or \
            "num_patches" not in set(mm.batched_keys) & set(mm.keep_on_cpu_keys) or \
            {"num_patches", "pixel_attention_mask"} - set(tensors):
        raise ImagesRefused("vLLM's Idefics3 layout is pixel_values and pixel_attention_mask flat by num_patches, "
                            "num_patches batched and kept on the CPU")
    return check(tokens, input_ids, pixels, tensors["num_patches"].tolist(), tensors["pixel_attention_mask"],
                 *placeholders(mm), list(mm.mm_hashes), not config.vision_takes_floats)


def check_sglang(tokens: Idefics3Tokens, mm: Any, input_ids: "list[int]") -> CheckedImages:
    pixels = _array(mm.pixel_values.data, mm.pixel_values.shape, mm.pixel_values.dtype)
    tensors = {key: _array(td.data, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    if {"num_patches", "pixel_attention_mask"} - set(tensors):
        raise ImagesRefused("Idefics3 takes num_patches and pixel_attention_mask beside the pixels")
    return check(tokens, input_ids, pixels, tensors["num_patches"].tolist(), tensors["pixel_attention_mask"],
                 *placeholders(mm), [], False)

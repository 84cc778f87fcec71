"""Llama 4's images (Llama4ImageProcessor, Llama4Processor), computed as the processor vLLM's server runs them.

An image is fitted to a canvas of whole tiles (the tile: ``size``, 336 published; at most ``max_patches`` tiles,
16 published): of the canvases whose tile counts divide into rows and columns, the one that upscales it least, or
if none can, downscales it least, the smaller canvas on a tie. It is resized into the canvas without distortion,
never upscaled past one tile's side (bilinear, torch's antialiased kernel), padded with black on the right and
bottom, and cut into the canvas's tiles, row by row; when there is more than one, the whole image squeezed into
one tile (distorted) follows them as a global view. Each tile is rescaled and normalized **in bfloat16**, as
transformers does for this family (every operation rounded to bfloat16): the values a 0-255 level becomes per
channel are a table of 256, computed once and checked against torch for every level
(tests/unit/test_llama4_vision.py's goldens).

In the prompt the template's ``<|image|>`` becomes ``<|image_start|>``, then for a tiled image each tile's
``<|patch|>`` tokens with ``<|tile_x_separator|>`` between the tiles of a row and ``<|tile_y_separator|>`` after
each row, then ``<|image|>`` and the global view's (or the only tile's) patches, then ``<|image_end|>``; a tile's
patches are (tile / patch)^2 / (1 / pixel_shuffle_ratio^2), 144 published. The features go to the ``<|patch|>``
positions (vLLM's embed token). vLLM lays the pixels out flat by ``patches_per_image`` with ``aspect_ratios``
(rows, columns of tiles) beside them, both kept on the CPU.

transformers has no PIL processor for this family: with ``reference="pil"`` the resize is Pillow's and the
arithmetic the same (no oracle holds that variant).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from .processors import (RESAMPLE, ProcessedImage, ProcessorConfigError, _number, _pixel_fields, _token_id,
                         aspect_problem, resized)

# The prompt's tokens (Llama4Processor's defaults, which the published processor keeps).
TOKENS = {"image": "<|image|>", "start": "<|image_start|>", "end": "<|image_end|>", "patch": "<|patch|>",
          "tile_x": "<|tile_x_separator|>", "tile_y": "<|tile_y_separator|>"}


def bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32: torch's rounding of every
    bfloat16 operation's float32 result (no NaN or infinity arises from 0-255 levels)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
            ).view(np.float32)


def bfloat16_levels(scale: float, mean: "tuple[float, ...]", std: "tuple[float, ...]") -> np.ndarray:
    """(channels, 256) float32: what Llama4ImageProcessor's rescale_and_normalize makes of each level per channel:
    the level in bfloat16 times the scale (float32 arithmetic, rounded), minus the channel's mean, divided by its
    std (each a bfloat16, each operation rounded to bfloat16)."""
    levels = bfloat16(np.arange(256, dtype=np.float32) * np.float32(scale))
    table = np.empty((len(mean), 256), dtype=np.float32)
    for channel, (m, s) in enumerate(zip(mean, std)):
        table[channel] = bfloat16(bfloat16(levels - bfloat16(np.float32(m))) / bfloat16(np.float32(s)))
    return table


def supported_canvases(max_tiles: int, tile: int) -> "list[tuple[int, int]]":
    """(height, width) of every canvas of up to ``max_tiles`` tiles, in the order Llama4ImageProcessor lists them
    (its order decides ties): grouped by aspect ratio in the order each ratio first appears, counting the tiles
    down from ``max_tiles``, each count's factor pairs in ascending order of rows."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for count in range(max_tiles, 0, -1):
        for rows in sorted(f for f in range(1, count + 1) if count % f == 0):
            by_ratio.setdefault(rows / (count // rows), []).append((rows, count // rows))
    return [(rows * tile, columns * tile) for pairs in by_ratio.values() for rows, columns in pairs]


def best_canvas(height: int, width: int, canvases: "list[tuple[int, int]]", to_max: bool) -> "tuple[int, int]":
    """The canvas get_best_fit picks: each canvas's scale is the smaller of its sides' over the image's (float32
    divisions, as torch divides int64 tensors); the least upscale at or above 1 (the most with ``to_max``), else
    the least downscale; of the canvases at that scale, the first of the smallest area."""
    h32, w32 = np.float32(height), np.float32(width)
    scales = [min(np.float32(ch) / h32, np.float32(cw) / w32) for ch, cw in canvases]
    up = [s for s in scales if s >= 1]
    chosen = (max(up) if to_max else min(up)) if up else max(scales)
    candidates = [canvas for canvas, s in zip(canvases, scales) if s == chosen]
    return min(candidates, key=lambda c: c[0] * c[1])  # min keeps the first of equals, as torch.argmin does


def _divided(a: int, a_is_tensor: bool, b: int) -> float:
    """``a / b`` as Llama4ImageProcessor computes it: in float32 when ``a`` came from the canvas tensor, in Python's
    float64 when it is a plain int."""
    return float(np.float32(a) / np.float32(b)) if a_is_tensor else a / b


def resize_size(height: int, width: int, canvas: "tuple[int, int]", tile: int, to_max: bool) -> "tuple[int, int]":
    """(height, width) the image is resized to within ``canvas``: no larger than the image or one tile's side
    (unless ``to_max``), the aspect ratio kept (get_max_res_without_distortion). Which side of each ``min`` is a
    torch scalar decides whether a division is float32 or float64, and so a floor at the edge: followed exactly."""
    target_h, target_w = canvas
    h_tensor = w_tensor = True
    if not to_max:
        # Python's min returns the int when it is not larger than the tensor (min(a, b) keeps a unless b < a).
        bound_h, bound_w = max(height, tile), max(width, tile)
        h_tensor, w_tensor = target_h < bound_h, target_w < bound_w
        target_h, target_w = min(bound_h, target_h), min(bound_w, target_w)
    scale_w = _divided(target_w, w_tensor, width)
    scale_h = _divided(target_h, h_tensor, height)
    if _less(scale_w, w_tensor, scale_h, h_tensor):
        new_h = _floored(height, scale_w, w_tensor)
        return max(min(new_h, target_h), 1), max(target_w, 1)
    new_w = _floored(width, scale_h, h_tensor)
    return max(target_h, 1), max(min(new_w, target_w), 1)


def _less(a: float, a_is_tensor: bool, b: float, b_is_tensor: bool) -> bool:
    """``a < b`` where a float32 scalar compared with a Python float is compared in float32 (torch's promotion)."""
    if a_is_tensor or b_is_tensor:
        return bool(np.float32(a) < np.float32(b))
    return a < b


def _floored(side: int, scale: float, scale_is_tensor: bool) -> int:
    """math.floor(side * scale): a float32 product when the scale is a float32 scalar."""
    if scale_is_tensor:
        return int(math.floor(np.float32(side) * np.float32(scale)))
    return math.floor(side * scale)


@dataclasses.dataclass(frozen=True)
class Llama4Processor:
    placeholder_id: int  # <|image|>: the template's placeholder, and the marker before the global view
    embed_id: int  # <|patch|>
    start_id: int
    end_id: int
    tile_x_id: int
    tile_y_id: int
    patches_per_tile: int = 144
    tile: int = 336
    max_tiles: int = 16
    to_max_canvas: bool = False
    mean: "tuple[float, ...]" = (0.5, 0.5, 0.5)
    std: "tuple[float, ...]" = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 2
    reference: str = "torchvision"
    family = "llama4"
    newline_pieces: "tuple[tuple[int, int], ...]" = ()
    flat_pixels_by = "patches_per_image"  # vLLM's Llama 4 layout: tiles (and the global view) per image
    cpu_tensors = ("patches_per_image", "aspect_ratios")

    @classmethod
    def from_config(cls, config: dict[str, Any], token_to_id: Callable[[str], "int | None"],
                    files: dict[str, Any]) -> "Llama4Processor":
        model_config = files.get("config.json") or {}
        outer = files.get("processor_config.json") or {}
        vision = model_config.get("vision_config") if isinstance(model_config.get("vision_config"), dict) else {}
        size = config.get("size", {"height": 336, "width": 336})
        tile = size.get("height") if isinstance(size, dict) and size.get("height") == size.get("width") else None
        # vLLM counts a tile's patches from the model's vision config; the processor's own settings otherwise.
        patch = vision.get("patch_size", outer.get("patch_size", 14))
        shuffle = vision.get("pixel_shuffle_ratio", outer.get("pixel_shuffle_ratio", 0.5))
        image_size = vision.get("image_size", tile)
        if not (isinstance(tile, int) and tile > 0 and isinstance(patch, int) and 0 < patch and image_size == tile
                and tile % patch == 0 and isinstance(shuffle, (int, float)) and 0 < shuffle <= 1):
            raise ProcessorConfigError(f"preprocessor_config.json: unusable tile {size} / patch {patch} / pixel "
                                       f"shuffle {shuffle} / the vision tower's image size {image_size}")
        downsample = int(round(1.0 / shuffle ** 2))
        max_tiles = _number(config, "max_patches", 16, (int,))
        # The placeholder and the embed token as the processor's config names them (what vLLM matches and selects
        # by); the sequence's other tokens are written literally by Llama4Processor._prompt_split_image.
        processor = cls(placeholder_id=_token_id(token_to_id, outer.get("image_token", TOKENS["image"])),
                        embed_id=_token_id(token_to_id, outer.get("patch_token", TOKENS["patch"])),
                        start_id=_token_id(token_to_id, TOKENS["start"]), end_id=_token_id(token_to_id, TOKENS["end"]),
                        tile_x_id=_token_id(token_to_id, TOKENS["tile_x"]),
                        tile_y_id=_token_id(token_to_id, TOKENS["tile_y"]),
                        patches_per_tile=(tile // patch) ** 2 // downsample, tile=tile, max_tiles=max_tiles,
                        to_max_canvas=config.get("resize_to_max_canvas", False) is True,
                        **_pixel_fields(config, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 2))
        if not 0 < max_tiles <= 64 or processor.patches_per_tile < 1 or processor.resample not in RESAMPLE:
            raise ProcessorConfigError(f"preprocessor_config.json: unusable {processor}")
        return processor

    def describe(self) -> str:
        return f"{self.family}:{self.tile}:{self.max_tiles}:{self.to_max_canvas}:{self.patches_per_tile}:" \
               f"{self.mean}:{self.std}:{self.rescale_factor}:{self.resample}:{self.reference}"

    def size_problem(self, width: int, height: int) -> str | None:
        # A strip's global view squeezes its long side into one tile: refused past the ratio no photograph reaches.
        return aspect_problem(height, width)

    def layout(self, width: int, height: int) -> "tuple[tuple[int, int], tuple[int, int]]":
        """((rows, columns) of tiles, (height, width) the image is resized to) for an image of this size."""
        canvas = best_canvas(height, width, supported_canvases(self.max_tiles, self.tile), self.to_max_canvas)
        return (canvas[0] // self.tile, canvas[1] // self.tile), resize_size(height, width, canvas, self.tile,
                                                                                  self.to_max_canvas)

    def process(self, image: Image.Image, normalize: bool) -> ProcessedImage:
        width, height = image.size
        (rows, columns), (new_h, new_w) = self.layout(width, height)
        t = self.tile
        canvas = np.zeros((rows * t, columns * t, 3), dtype=np.uint8)  # black padding right and below
        canvas[:new_h, :new_w] = resized(image, new_w, new_h, self.resample, self.reference)
        tiles = canvas.reshape(rows, t, columns, t, 3).transpose(0, 2, 4, 1, 3).reshape(rows * columns, 3, t, t)
        if rows * columns > 1:
            whole = resized(image, t, t, self.resample, self.reference).transpose(2, 0, 1)[None]
            tiles = np.concatenate([tiles, whole])
        raw = np.ascontiguousarray(tiles)
        # The features the encoder makes (what vLLM's encoder budget counts): a tile's patches per tile and view.
        tokens = raw.shape[0] * self.patches_per_tile
        tensors = {"aspect_ratios": np.array([rows, columns], dtype=np.int64)}
        return ProcessedImage(raw, tensors, tokens, self.normalized(raw) if normalize else None)

    def normalized(self, raw: np.ndarray) -> np.ndarray:
        table = bfloat16_levels(self.rescale_factor, self.mean, self.std)
        out = np.empty(raw.shape, dtype=np.float32)
        for channel in range(raw.shape[1]):  # a lookup per channel: half the time of one fancy index over all three
            out[:, channel] = table[channel][raw[:, channel]]
        return out

    def expansion(self, image: ProcessedImage) -> "list[int]":
        rows, columns = (int(v) for v in image.tensors["aspect_ratios"])
        patches = [self.embed_id] * self.patches_per_tile
        ids = [self.start_id]
        if rows * columns > 1:
            for _ in range(rows):
                for column in range(columns):
                    ids += patches
                    if column < columns - 1:
                        ids.append(self.tile_x_id)
                ids.append(self.tile_y_id)
        return ids + [self.placeholder_id, *patches, self.end_id]

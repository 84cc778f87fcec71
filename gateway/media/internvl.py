"""InternVL's images in the Hugging Face format (InternVL 2.5 / 3 "-hf": GotOcr2ImageProcessor and InternVLProcessor),
computed as the processor vLLM's server runs them.

An image is resized onto a grid of square tiles (the tile: ``size``, 448 published; between ``min_patches`` and
``max_patches`` tiles, 1 and 12 published) whose columns over rows are nearest its own aspect ratio, a tie going to
the grid with more tiles while the image's area is over half the grid's; the resized image is cut into the tiles row
by row and, when there is more than one, the whole image squeezed into one tile (a thumbnail) follows them. Each is
rescaled and normalized (ImageNet's mean and std published; bicubic). InternVLProcessor always crops to tiles (its
own default is passed on every call, over the image processor config's ``crop_to_patches``).

In the prompt the template's ``<IMG_CONTEXT>`` becomes ``<img>``, ``image_seq_length`` (256 published) ``<IMG_CONTEXT>``
per tile and the thumbnail, ``</img>``; the features go to the ``<IMG_CONTEXT>`` positions. vLLM's InternVL (HF
format, its interns1 model) takes the tiles flat by ``image_num_patches`` with the context token's id as
``image_token_id``: sent per image (batched, kept on the CPU), since vLLM drops what is not kept on the CPU from an
image it has already encoded and the model reads that id on every call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from .processors import (RESAMPLE, ProcessedImage, ProcessorConfigError, _number, _pixel_fields, _token_id,
                         aspect_problem, resized, tiles_normalized)

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # the published InternVL configs' normalization
IMAGENET_STD = (0.229, 0.224, 0.225)


def tile_grids(min_tiles: int, max_tiles: int) -> "list[tuple[int, int]]":
    """(columns, rows) of every grid of ``min_tiles`` to ``max_tiles`` tiles, ordered by tile count (a stable sort of
    the columns-then-rows enumeration, as get_all_supported_aspect_ratios lists them: ties keep that order)."""
    grids = [(columns, rows) for columns in range(1, max_tiles + 1) for rows in range(1, max_tiles + 1)
             if min_tiles <= columns * rows <= max_tiles]
    return sorted(grids, key=lambda grid: grid[0] * grid[1])


def best_grid(height: int, width: int, tile: int, grids: "list[tuple[int, int]]") -> "tuple[int, int]":
    """The grid get_optimal_tiled_canvas picks: the columns / rows nearest the image's width / height; on an equal
    difference a later grid (more tiles) replaces the one held while the image's area is over half the grid's."""
    aspect, area = width / height, width * height
    best, best_difference = (1, 1), float("inf")
    for columns, rows in grids:
        difference = abs(aspect - columns / rows)
        if difference < best_difference:
            best, best_difference = (columns, rows), difference
        elif difference == best_difference and area > 0.5 * tile * tile * columns * rows:
            best = (columns, rows)
    return best


@dataclasses.dataclass(frozen=True)
class InternVLProcessor:
    placeholder_id: int  # <IMG_CONTEXT>: the template's placeholder and the features' positions
    start_id: int  # <img>
    end_id: int  # </img>
    tokens_per_tile: int = 256
    tile: int = 448
    min_tiles: int = 1
    max_tiles: int = 12
    mean: "tuple[float, ...]" = IMAGENET_MEAN
    std: "tuple[float, ...]" = IMAGENET_STD
    rescale_factor: float = 1 / 255
    resample: int = 3
    reference: str = "torchvision"
    family = "internvl"
    newline_pieces: "tuple[tuple[int, int], ...]" = ()
    flat_pixels_by = "image_num_patches"  # vLLM's InternVL layout: tiles (and the thumbnail) per image
    cpu_tensors = ("image_num_patches", "image_token_id")

    @property
    def embed_id(self) -> int:
        return self.placeholder_id

    @classmethod
    def from_config(cls, config: dict[str, Any], token_to_id: Callable[[str], "int | None"],
                    files: dict[str, Any]) -> "InternVLProcessor":
        size = config.get("size", {"height": 448, "width": 448})
        tile = size.get("height") if isinstance(size, dict) and size.get("height") == size.get("width") else None
        tokens = config.get("image_seq_length", 256)  # (processor_config.json's, merged in by families.py)
        min_tiles, max_tiles = _number(config, "min_patches", 1, (int,)), _number(config, "max_patches", 12, (int,))
        if not (isinstance(tile, int) and tile > 0 and isinstance(tokens, int) and tokens > 0
                and 1 <= min_tiles <= max_tiles <= 64):
            raise ProcessorConfigError(f"preprocessor_config.json: unusable tile {size} / tiles {min_tiles}-"
                                       f"{max_tiles} / image_seq_length {tokens}")
        processor = cls(placeholder_id=_token_id(token_to_id, "<IMG_CONTEXT>"),
                        start_id=_token_id(token_to_id, "<img>"),
                        end_id=_token_id(token_to_id, "</img>"), tokens_per_tile=tokens, tile=tile,
                        min_tiles=min_tiles, max_tiles=max_tiles,
                        **_pixel_fields(config, IMAGENET_MEAN, IMAGENET_STD, 3))
        if processor.resample not in RESAMPLE:
            raise ProcessorConfigError(f"preprocessor_config.json: resample {processor.resample}")
        return processor

    def describe(self) -> str:
        return f"{self.family}:{self.tile}:{self.min_tiles}-{self.max_tiles}:" \
               f"{self.tokens_per_tile}:{self.mean}:{self.std}:{self.rescale_factor}:{self.resample}:{self.reference}"

    def size_problem(self, width: int, height: int) -> str | None:
        return aspect_problem(height, width)  # the thumbnail squeezes the long side into one tile

    def grid(self, width: int, height: int) -> "tuple[int, int]":
        """(columns, rows) of tiles an image of this size is cut into."""
        return best_grid(height, width, self.tile, tile_grids(self.min_tiles, self.max_tiles))

    def process(self, image: Image.Image, normalize: bool) -> ProcessedImage:
        t = self.tile
        columns, rows = self.grid(*image.size)
        pixels = resized(image, columns * t, rows * t, self.resample, self.reference)
        tiles = pixels.reshape(rows, t, columns, t, 3).transpose(0, 2, 4, 1, 3).reshape(rows * columns, 3, t, t)
        if rows * columns > 1:
            thumbnail = resized(image, t, t, self.resample, self.reference).transpose(2, 0, 1)[None]
            tiles = np.concatenate([tiles, thumbnail])
        raw = np.ascontiguousarray(tiles)
        tensors = {"image_token_id": np.array(self.placeholder_id, dtype=np.int64)}
        return ProcessedImage(raw, tensors, raw.shape[0] * self.tokens_per_tile,
                              self.normalized(raw) if normalize else None)

    def normalized(self, raw: np.ndarray) -> np.ndarray:
        return tiles_normalized(raw, self)

    def expansion(self, image: ProcessedImage) -> "list[int]":
        return [self.start_id, *([self.placeholder_id] * image.tokens), self.end_id]

"""Idefics3's and SmolVLM's images (Idefics3ImageProcessor, Idefics3Processor), computed as the processor vLLM's server
runs them (transformers' torchvision-backed one).

An image is resized twice with Lanczos: its longest edge to ``size`` (4 x 364 published for Idefics3, 4 x 512 for
SmolVLM; a smaller image is enlarged), each side even, then up to whole tiles of ``max_image_size`` (364 / 512: the
width rounded up, the height derived from it by the aspect ratio and rounded up, or the other way round for a tall
image). That is cut into tiles row by row, and the whole of it resized into one tile (the global image) follows them;
an image of exactly one tile is only itself. Rescaled and normalized (0.5, 0.5). Each tile has a pixel attention mask
(every pixel real: nothing is padded within one image).

In the prompt the template's ``<image>`` becomes, per tile, ``<fake_token_around_image><row_i_col_j>`` and
``image_seq_len`` ``<image>`` (169 published for Idefics3, 64 for SmolVLM), a newline after each row, then a newline,
``<fake_token_around_image><global-img>``, its ``<image>`` run and ``<fake_token_around_image>``. The processor writes
that as text and tokenizes it: the last row's newline and the one before the global image are one token ("\\n\\n").
vLLM takes the tiles and their masks flat by ``num_patches`` (kept on the CPU) and the features at the ``<image>``
positions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from .processors import (RESAMPLE, ProcessedImage, ProcessorConfigError, _pixel_fields, _token_id,
                         aspect_problem, resized, tiles_normalized)

MAX_IMAGE_SIDE = 4096  # Idefics3's MAX_IMAGE_SIZE: no side past it after the first resize
GRID_MAX = 6  # <row_i_col_j> tokens exist for rows and columns up to 6
# The spellings a tokenizer may have for a run of newlines: the character itself, or byte-level BPE's.
NEWLINE_SPELLINGS = ("\n", "\u010a")


def longest_edge_size(height: int, width: int, longest: int) -> "tuple[int, int]":
    """(height, width) of the first resize: the longest side ``longest``, the other by the aspect ratio (truncated,
    then made even), then neither past MAX_IMAGE_SIDE (Idefics3's two size functions, in order)."""
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIDE:
        width, height = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE / aspect)
    elif height > width and height > MAX_IMAGE_SIDE:
        height, width = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE * aspect)
    return max(height, 1), max(width, 1)


def whole_tiles_size(height: int, width: int, tile: int) -> "tuple[int, int]":
    """(height, width) of the second resize (resize_for_vision_encoder): whole tiles, the long side rounded up and
    the other derived from it by the aspect ratio, then rounded up."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def _newline_id(token_to_id: Callable[[str], "int | None"], count: int) -> int:
    for spelling in NEWLINE_SPELLINGS:
        token_id = token_to_id(spelling * count)
        if token_id is not None:
            return token_id
    raise ProcessorConfigError(f"the tokenizer has no token for {count} newline(s)")


@dataclasses.dataclass(frozen=True)
class Idefics3Processor:
    placeholder_id: int  # <image>: the template's placeholder and the features' positions
    fake_id: int  # <fake_token_around_image>
    global_id: int  # <global-img>
    grid_ids: "tuple[int, ...]"  # <row_i_col_j>, row-major, GRID_MAX x GRID_MAX
    newline_id: int  # "\n"
    double_newline_id: int  # "\n\n"
    tokens_per_tile: int = 169
    longest: int = 4 * 364
    tile: int = 364
    split: bool = True
    mean: "tuple[float, ...]" = (0.5, 0.5, 0.5)
    std: "tuple[float, ...]" = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 1
    reference: str = "torchvision"
    family = "idefics3"
    newline_pieces: "tuple[tuple[int, int], ...]" = ()  # (its newlines are inside the expansion, written joined)
    flat_pixels_by = "num_patches"  # vLLM's Idefics3 layout: tiles (and the global image) per image
    flat_tensors = ("pixel_attention_mask",)  # flat by the same sizes
    cpu_tensors = ("num_patches",)

    @property
    def embed_id(self) -> int:
        return self.placeholder_id

    @classmethod
    def from_config(cls, config: dict[str, Any], token_to_id: Callable[[str], "int | None"],
                    files: dict[str, Any]) -> "Idefics3Processor":
        size = config.get("size", {"longest_edge": 4 * 364})
        tile = config.get("max_image_size", {"longest_edge": 364})
        longest = size.get("longest_edge") if isinstance(size, dict) else None
        tile = tile.get("longest_edge") if isinstance(tile, dict) else None
        tokens = (files.get("processor_config.json") or {}).get("image_seq_len", _seq_len(files))
        if not (isinstance(longest, int) and isinstance(tile, int) and 0 < tile <= longest and isinstance(tokens, int)
                and tokens > 0):
            raise ProcessorConfigError(f"preprocessor_config.json: unusable size {size} / max_image_size {tile} / "
                                       f"image_seq_len {tokens}")
        if longest > GRID_MAX * tile:
            raise ProcessorConfigError(f"preprocessor_config.json: size {longest} needs more than {GRID_MAX} tiles "
                                       "a side, which have no tokens")
        grid_ids = tuple(_token_id(token_to_id, f"<row_{row}_col_{column}>")
                         for row in range(1, GRID_MAX + 1) for column in range(1, GRID_MAX + 1))
        processor = cls(placeholder_id=_token_id(token_to_id, "<image>"),
                        fake_id=_token_id(token_to_id, "<fake_token_around_image>"),
                        global_id=_token_id(token_to_id, "<global-img>"), grid_ids=grid_ids,
                        newline_id=_newline_id(token_to_id, 1), double_newline_id=_newline_id(token_to_id, 2),
                        tokens_per_tile=tokens, longest=longest, tile=tile,
                        split=config.get("do_image_splitting", True) is not False,
                        **_pixel_fields(config, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 1))
        if processor.resample not in RESAMPLE:
            raise ProcessorConfigError(f"preprocessor_config.json: resample {processor.resample}")
        return processor

    def describe(self) -> str:
        return f"{self.family}:{self.longest}:{self.tile}:{self.split}:{self.tokens_per_tile}:{self.mean}:" \
               f"{self.std}:{self.rescale_factor}:{self.resample}:{self.reference}"

    def size_problem(self, width: int, height: int) -> str | None:
        return aspect_problem(height, width)

    def layout(self, width: int, height: int) -> "tuple[tuple[int, int], tuple[int, int]]":
        """((height, width) of the first resize, (height, width) of the second: whole tiles) for an image's size."""
        first = longest_edge_size(height, width, self.longest)
        return first, whole_tiles_size(*first, self.tile)

    def process(self, image: Image.Image, normalize: bool) -> ProcessedImage:
        t = self.tile
        (h1, w1), (h2, w2) = self.layout(*image.size)
        first = Image.fromarray(resized(image, w1, h1, self.resample, self.reference))
        if not self.split:
            tiles = resized(first, t, t, self.resample, self.reference).transpose(2, 0, 1)[None]
            rows = columns = 0
        else:
            whole = resized(first, w2, h2, self.resample, self.reference)
            rows, columns = h2 // t, w2 // t
            if rows * columns > 1:
                tiles = whole.reshape(rows, t, columns, t, 3).transpose(0, 2, 4, 1, 3).reshape(rows * columns, 3, t, t)
                global_image = resized(Image.fromarray(whole), t, t, self.resample, self.reference)
                tiles = np.concatenate([tiles, global_image.transpose(2, 0, 1)[None]])
            else:
                tiles, rows, columns = whole.transpose(2, 0, 1)[None], 0, 0
        raw = np.ascontiguousarray(tiles)
        # uint8 ones: the servicer's wire takes no bool, and an int64 mask would be 1 MB a tile of 364 (the model sums
        # it per patch: any integer type reads the same).
        tensors = {"pixel_attention_mask": np.ones((raw.shape[0], t, t), dtype=np.uint8)}
        return ProcessedImage(raw, tensors, raw.shape[0] * self.tokens_per_tile,
                              self.normalized(raw) if normalize else None, (rows, columns))

    def normalized(self, raw: np.ndarray) -> np.ndarray:
        return tiles_normalized(raw, self)

    def expansion(self, image: ProcessedImage) -> "list[int]":
        rows, columns = image.grid
        run = [self.placeholder_id] * self.tokens_per_tile
        out: list[int] = []
        for row in range(rows):
            for column in range(columns):
                out += [self.fake_id, self.grid_ids[row * GRID_MAX + column], *run]
            if row < rows - 1:
                out.append(self.newline_id)
        if rows:
            out.append(self.double_newline_id)  # the last row's newline and the global image's, one token
        return out + [self.fake_id, self.global_id, *run, self.fake_id]


def _seq_len(files: dict[str, Any]) -> int:
    """Tokens a tile takes, from the model's config.json when the processor's config says none: (image_size /
    patch_size)^2 / scale_factor^2 (169 for Idefics3's 364 / 14 / 2)."""
    model = files.get("config.json") or {}
    vision = model.get("vision_config") if isinstance(model.get("vision_config"), dict) else {}
    size, patch, scale = vision.get("image_size", 364), vision.get("patch_size", 14), model.get("scale_factor", 2)
    if not all(isinstance(v, int) and v > 0 for v in (size, patch, scale)):
        return 169
    return int((size // patch) ** 2 / scale ** 2)

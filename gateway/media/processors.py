"""Image processors per model family, computing what the model's own Hugging Face processor computes.

Each family is registered in families.py's ``IMAGE_PROCESSORS`` with the ``image_processor_type`` names of the
``preprocessor_config.json`` it reads (the engine ships that file in its tokenizer bundle, so the gateway's
numbers are the model's own), and is built from that file: sizes, means, patch and merge sizes. An image
goes in as RGB; out come its pixel tensor (float32), the model's other tensors (a grid), and the prompt
tokens that stand for it. Two references, a processor's ``reference``: "torchvision" (the default), transformers'
torchvision-backed processor of the family, which vLLM's server runs (torch's integer resize, resize.py; the
rescale folded into the mean and std), held equal to the bit by tests/unit/test_torchvision_pixels.py; or "pil",
its PIL processor (Pillow's resize, then rescale in float64 cast to float32, normalize in float32), held equal by
tests/unit/test_image_processors.py. The raw pixels (resized, in the family's layout, not yet rescaled) are what
an engine that normalizes on its device takes.

Families:

    qwen2_vl   Qwen2-VL, Qwen2.5-VL, Qwen3-VL (Qwen2VLImageProcessor*): resized so each side is a multiple of
               patch x merge and the pixels within [min, max] (``smart_resize``), rescaled and normalized,
               cut into patch_size squares repeated over temporal_patch_size frames, ordered by merge
               window; grid (t, h, w); (t*h*w)/merge^2 <|image_pad|> tokens
    llava      LLaVA 1.5 and CLIP-style processors (CLIPImageProcessor, LlavaImageProcessor): resized so its
               shortest side is the size, center-cropped, rescaled, normalized; (crop/patch)^2 <image> tokens
               (one fewer with the default feature strategy that drops CLS... as the model's config says)
    gemma3     Gemma 3 (Gemma3ImageProcessor*): resized to one square, rescaled, normalized; the placeholder
               <start_of_image> becomes "\n\n<start_of_image>" + soft tokens + "<end_of_image>\n\n", its newlines
               joined with their neighbours as the tokenizer joins them; with pan and scan (a request's
               mm_processor_kwargs, as vLLM takes them) a long image's crops besides, each its own sequence

Families whose prompt expansion is more than the placeholder repeated give ``expansion`` (the ids that replace it)
and ``newline_pieces`` (the newline tokens its edges join with); ``embed_id`` is the token whose positions take the
features.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from PIL import Image

from .resize import resize_uint8

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's published normalization
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_STANDARD_MEAN = (0.5, 0.5, 0.5)  # transformers' IMAGENET_STANDARD_MEAN and _STD
IMAGENET_STANDARD_STD = (0.5, 0.5, 0.5)
# Pillow's resampling filters by the numbers preprocessor configs give them.
RESAMPLE = {0: Image.Resampling.NEAREST, 1: Image.Resampling.LANCZOS, 2: Image.Resampling.BILINEAR,
            3: Image.Resampling.BICUBIC, 4: Image.Resampling.BOX, 5: Image.Resampling.HAMMING}
# torchvision's kernel for a config's filter (its Lanczos on a CPU since 0.27, which vLLM's requirements exceed).
TORCH_KERNELS = {1: "lanczos", 2: "bilinear", 3: "bicubic"}
REFERENCES = ("torchvision", "pil")  # whose pixels: transformers' torchvision processors (vLLM's server), or PIL ones
ASPECT_RATIO_MAX = 200  # Qwen2-VL's bound on an image's long side over its short one
NEWLINE_RUN_MAX = 32  # the longest run of newlines looked for as one token (Gemma's vocabulary stops at 31)


class ProcessorConfigError(ValueError):
    """A preprocessor_config.json (or the tokenizer) this family cannot be built from."""


@dataclasses.dataclass(frozen=True)
class ProcessedImage:
    # The resized (and cropped) pixels, uint8, already in the family's layout: what an engine that normalizes on
    # its device takes (vLLM's mm_device_do_normalize, on by default for the Qwen-VL families), a quarter of the
    # bytes of the floats.
    raw: np.ndarray
    tensors: dict[str, np.ndarray]  # the model's other per-image tensors (a grid), by the name the model takes
    tokens: int  # prompt tokens the image takes (its placeholder, expanded)
    # The same rescaled and normalized, float32: what the model's Hugging Face processor outputs and an engine
    # that does not normalize takes; None when no engine of the model wanted them (``ImageProcessor.normalized``).
    normalized: "np.ndarray | None" = None
    # Rows and columns of tiles, for a family whose prompt names each tile and whose engine is not told them
    # (Idefics3's <row_i_col_j>); (0, 0) otherwise.
    grid: "tuple[int, int]" = (0, 0)
    # The ids that replace its placeholder, for a family that writes text of the item's own into them and makes
    # them while processing it, in the media threads (Qwen3-VL's video timestamps); () for the others.
    prompt_ids: "tuple[int, ...]" = ()

    @property
    def nbytes(self) -> int:
        floats = self.normalized.nbytes if self.normalized is not None else 0
        # prompt_ids: a tuple's pointer an id (its ints are shared: the same few ids repeated).
        return self.raw.nbytes + floats + sum(t.nbytes for t in self.tensors.values()) + 8 * len(self.prompt_ids)


class ImageProcessor(Protocol):
    family: str
    placeholder_id: int  # the token the chat template writes once per image, replaced by ``expansion``
    embed_id: int  # the token whose positions take the image's features (the engines' im_token_id)
    # The tokenizer's tokens that are only newlines, as (id, newlines): an expansion that begins or ends with
    # newlines (Gemma 3's) is written as text by the model's own processor, and the tokenizer joins those with the
    # newlines beside them ("\n" + "\n\n" is one token); empty when nothing is joined.
    newline_pieces: "tuple[tuple[int, int], ...]"
    # How the engine lays the batch out (vLLM's MultiModalFieldConfig): pixel rows per image (flat, sized by
    # the named tensor) or one entry per image (batched).
    flat_pixels_by: str | None
    # The tensors the engine keeps on the CPU (vLLM's keep_on_cpu): an M-RoPE model computes positions from its
    # grid there, and vLLM strips every other tensor from an image whose tokens it has already computed.
    cpu_tensors: "tuple[str, ...]"

    def process(self, image: Image.Image, normalize: bool) -> ProcessedImage: ...  # normalized too when asked

    def expansion(self, image: ProcessedImage) -> "list[int]": ...  # the ids that replace the placeholder

    def normalized(self, raw: np.ndarray) -> np.ndarray: ...  # a ProcessedImage's raw pixels rescaled, normalized

    def describe(self) -> str: ...  # what it was built with, for hashes: a change of processor changes them

    def size_problem(self, width: int, height: int) -> str | None: ...  # why it refuses that size, from the header


def _number(config: dict[str, Any], key: str, default: Any, kinds: "tuple[type, ...]" = (int, float)) -> Any:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ProcessorConfigError(f"preprocessor_config.json: {key} is {value!r}")
    return value


def _triple(config: dict[str, Any], key: str, default: "tuple[float, ...]") -> "tuple[float, float, float]":
    value = config.get(key, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,) * 3
    if not (isinstance(value, (list, tuple)) and len(value) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise ProcessorConfigError(f"preprocessor_config.json: {key} is {value!r}")
    return tuple(float(v) for v in value)


def _pixel_fields(config: dict[str, Any], mean: "tuple[float, ...]", std: "tuple[float, ...]", resample: int
                  ) -> dict[str, Any]:
    """What every family reads alike from preprocessor_config.json (its defaults given): mean, std, rescale
    factor, resampling filter."""
    return {"mean": _triple(config, "image_mean", mean), "std": _triple(config, "image_std", std),
            "rescale_factor": float(_number(config, "rescale_factor", 1 / 255)),
            "resample": _number(config, "resample", resample, (int,))}


def _token_id(token_to_id: Callable[[str], "int | None"], text: str) -> int:
    token_id = token_to_id(text)
    if token_id is None:
        raise ProcessorConfigError(f"the tokenizer has no {text} token")
    return token_id


def resized(image: Image.Image, width: int, height: int, resample: int, reference: str) -> np.ndarray:
    """``image`` resized to ``width`` x ``height``, HWC uint8, as the reference processor resizes it: Pillow's
    kernel ("pil"), or torch's antialiased integer kernel ("torchvision", resize.py) for the bilinear, bicubic and
    Lanczos filters (the others are Pillow's either way)."""
    if image.size == (width, height):
        return np.asarray(image)
    kind = TORCH_KERNELS.get(resample) if reference == "torchvision" else None
    if kind is None:
        return np.asarray(image.resize((width, height), resample=RESAMPLE[resample]))
    return resize_uint8(np.asarray(image), width, height, kind)


def rescaled_normalized(channels_first: np.ndarray, scale: float, mean: "tuple[float, ...]",
                        std: "tuple[float, ...]", reference: str = "torchvision") -> np.ndarray:
    """uint8 pixels whose first axis is the channel (any layout after it) to float32, as the reference processor
    computes it: transformers' PIL processors rescale in float64, cast to float32 and normalize in float32 per
    channel; its torchvision processors fold the rescale into the mean and std (each times 1 / scale, in float32)
    and normalize the float32 pixels with them. Each value's arithmetic is its own, so normalizing after the
    family's reshuffle of the pixels equals normalizing before it."""
    shape = (-1,) + (1,) * (channels_first.ndim - 1)
    if reference == "torchvision":
        factor = np.float32(1.0 / scale)
        out = channels_first.astype(np.float32)
        out -= (np.asarray(mean, dtype=np.float32) * factor).reshape(shape)
        out /= (np.asarray(std, dtype=np.float32) * factor).reshape(shape)
        return out
    out = (channels_first.astype(np.float64) * scale).astype(np.float32)
    out -= np.asarray(mean, dtype=np.float32).reshape(shape)
    out /= np.asarray(std, dtype=np.float32).reshape(shape)
    return out


def tiles_normalized(raw: np.ndarray, processor: Any) -> np.ndarray:
    """Tiles of (tile, channel, y, x) uint8 rescaled and normalized with ``processor``'s numbers, float32."""
    return rescaled_normalized(raw.transpose(1, 0, 2, 3), processor.rescale_factor, processor.mean, processor.std,
                               processor.reference).transpose(1, 0, 2, 3).copy()


class PlaceholderIsImageToken:
    """The token the template writes is the one whose positions take the features, and no newline is joined."""

    placeholder_id: int
    newline_pieces: "tuple[tuple[int, int], ...]" = ()

    @property
    def embed_id(self) -> int:
        return self.placeholder_id


class RepeatedPlaceholder(PlaceholderIsImageToken):
    """The placeholder repeated once per image token, which are the embedding positions themselves (Qwen-VL's,
    LLaVA's): nothing around them, nothing merged."""

    def expansion(self, image: ProcessedImage) -> "list[int]":
        return [self.placeholder_id] * image.tokens


# -- Qwen2-VL, Qwen2.5-VL, Qwen3-VL -------------------------------------------------------------------------

# The most pixels a request's or the node's kwargs may let a Qwen-VL image (or video frame) keep: 4096 x 4096, past
# the published models' own bound (12.8 M); tokens grow with them, so they are bounded as every media input is.
QWEN_PIXELS_MAX = 4096 * 4096
_QWEN_PIXEL_KEYS = ("min_pixels", "max_pixels", "size")
QWEN3_VL_MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe")  # config.json's model_type of Qwen3-VL models
_QWEN_SIZE_EDGES = {"shortest_edge": "min_pixels", "longest_edge": "max_pixels"}


def qwen_pixel_layers(kwargs: dict[str, Any], partial_size: bool = False
                      ) -> "dict[str, tuple[tuple[str, int], ...]]":
    """Qwen-VL's mm_processor_kwargs as pixel bounds by layer ("" flat, "images", "videos"), each
    ((min_pixels|max_pixels, value), ...), as vLLM 0.32 reads each layer (its Qwen-VL size aliases): ``size``'s
    edges (shortest_edge the minimum, longest_edge the maximum; one alone only with ``partial_size``), then
    ``min_pixels`` / ``max_pixels`` over them; a bound given as None is not given. ValueError naming what is not
    taken here."""
    layers: dict[str, tuple[tuple[str, int], ...]] = {}
    for layer, given in (("", kwargs), ("images", kwargs.get("images_kwargs")),
                         ("videos", kwargs.get("videos_kwargs"))):
        if given is None:
            continue
        if not isinstance(given, dict):
            raise ValueError(f"'{layer}_kwargs' must be an object")
        keys = _QWEN_PIXEL_KEYS + (("images_kwargs", "videos_kwargs") if not layer else ())
        unknown = [key for key in given if key not in keys]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not applied to "
                             f"Qwen-VL's {layer or 'images and video'}s here (these are: {', '.join(keys)})")
        bounds: dict[str, Any] = {}
        size = given.get("size")
        if size is not None:
            if not (isinstance(size, dict) and size.keys() <= _QWEN_SIZE_EDGES.keys()):
                raise ValueError("'size' takes 'shortest_edge' (the fewest pixels) and 'longest_edge' (the most)")
            if not partial_size and len(size) == 1:  # transformers' Qwen2-VL processors refuse it, so vLLM does
                raise ValueError("'size' must give both 'shortest_edge' and 'longest_edge' for this model")
            bounds = {_QWEN_SIZE_EDGES[edge]: value for edge, value in size.items()}
        bounds.update({key: given[key] for key in ("min_pixels", "max_pixels") if given.get(key) is not None})
        for key, value in bounds.items():
            if type(value) is not int or value < 1:
                raise ValueError(f"'{key}' must be a positive integer")
        if bounds:
            layers[layer] = tuple(sorted(bounds.items()))
    return layers


def aspect_problem(height: int, width: int) -> str | None:
    """Why Qwen2-VL refuses an image of this size (past 200:1); None when it does not."""
    if max(height, width) / min(height, width) > ASPECT_RATIO_MAX:
        return f"the image's aspect ratio is over {ASPECT_RATIO_MAX}:1"
    return None


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's target size: each side a multiple of ``factor`` nearest the image's own, the pixels brought
    within [min_pixels, max_pixels] keeping the aspect ratio; ValueError past 200:1."""
    problem = aspect_problem(height, width)
    if problem is not None:
        raise ValueError(problem)
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / shrink / factor) * factor)
        w = max(factor, math.floor(width / shrink / factor) * factor)
    elif h * w < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * grow / factor) * factor, math.ceil(width * grow / factor) * factor
    return h, w


@dataclasses.dataclass(frozen=True)
class QwenVisionProcessor(RepeatedPlaceholder):
    placeholder_id: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    mean: "tuple[float, ...]" = OPENAI_CLIP_MEAN
    std: "tuple[float, ...]" = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3
    reference: str = "torchvision"
    # The pixel bounds its files gave, and the mm_processor_kwargs applied over them so far in the order they
    # apply (the node's, then a request's; each flat, then per modality), by layer: "" the flat ones, "images" /
    # "videos" images_kwargs / videos_kwargs.
    config_pixels: "tuple[int, int] | None" = dataclasses.field(default=None, compare=False)
    settings: "tuple[tuple[str, tuple[tuple[str, int], ...]], ...]" = dataclasses.field(default=(), compare=False)
    # Whether a ``size`` with one edge is taken (the other the processor's own): vLLM completes it for Qwen3-VL (its
    # processor's _apply_hf_processor_main) and hands Qwen2-VL's and Qwen2.5-VL's to transformers, which refuses it.
    partial_size: bool = False
    family = "qwen2_vl"
    request_kwargs = ("min_pixels", "max_pixels", "size", "images_kwargs", "videos_kwargs")
    flat_pixels_by = "patches_per_image"
    cpu_tensors = ("image_grid_thw",)
    placeholder_token = "<|image_pad|>"

    @classmethod
    def from_config(cls, config: dict[str, Any], token_to_id: Callable[[str], "int | None"], **more: Any
                    ) -> "QwenVisionProcessor":
        """From a preprocessor config; the sizes it does not give are the class's own defaults (the video
        processor's differ: video.py); ``more``: a subclass's own fields."""
        defaults = cls.__dataclass_fields__
        size = config.get("size") if isinstance(config.get("size"), dict) else {}
        min_pixels = config.get("min_pixels", size.get("shortest_edge", size.get("min_pixels",
                                                                                 defaults["min_pixels"].default)))
        max_pixels = config.get("max_pixels", size.get("longest_edge", size.get("max_pixels",
                                                                                 defaults["max_pixels"].default)))
        processor = cls(
            placeholder_id=_token_id(token_to_id, cls.placeholder_token), **more,
            patch_size=_number(config, "patch_size", 14, (int,)),
            temporal_patch_size=_number(config, "temporal_patch_size", 2, (int,)),
            merge_size=_number(config, "merge_size", 2, (int,)),
            min_pixels=_number({"min_pixels": min_pixels}, "min_pixels", 0, (int,)),
            max_pixels=_number({"max_pixels": max_pixels}, "max_pixels", 0, (int,)),
            **_pixel_fields(config, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, 3))
        if min(processor.patch_size, processor.temporal_patch_size, processor.merge_size) < 1 or \
                not 0 < processor.min_pixels <= processor.max_pixels or processor.resample not in RESAMPLE:
            raise ProcessorConfigError(f"preprocessor_config.json: unusable sizes {processor}")
        return processor

    def with_request_kwargs(self, kwargs: dict[str, Any]) -> "QwenVisionProcessor":
        """This processor with ``mm_processor_kwargs`` applied over those it has, as vLLM 0.32 merges a request's
        over its configured ones: the pixel bounds, flat (images and videos) or in images_kwargs / videos_kwargs,
        each bound the last of the node's flat, the node's for this modality, the request's flat, the request's
        for this modality (vLLM's precedence: a modality's own over the flat one, no error for both); a bound none
        gives stays the processor's own. ValueError naming what it cannot take."""
        settings = self.settings + tuple(qwen_pixel_layers(kwargs, self.partial_size).items())  # flat, then each
        own = f"{getattr(self, 'modality', 'image')}s"
        base = self.config_pixels or (self.min_pixels, self.max_pixels)
        bounds = {"min_pixels": base[0], "max_pixels": base[1]}
        for layer, given in settings:
            if layer in ("", own):
                bounds.update(given)
        # Not required in order: smart_resize takes a minimum above the maximum as transformers' does (shrunk to the
        # maximum when above it, else grown to the minimum), and vLLM's server answers it.
        if max(bounds["min_pixels"], bounds["max_pixels"]) > QWEN_PIXELS_MAX:
            raise ValueError(f"the pixel bounds come to {bounds['min_pixels']} and {bounds['max_pixels']}: at most "
                             f"{QWEN_PIXELS_MAX}")
        return dataclasses.replace(self, min_pixels=bounds["min_pixels"], max_pixels=bounds["max_pixels"],
                                   config_pixels=base, settings=settings)

    def describe(self) -> str:
        return f"{self.family}:{self.patch_size}:{self.temporal_patch_size}:{self.merge_size}:{self.min_pixels}:" \
               f"{self.max_pixels}:{self.mean}:{self.std}:{self.rescale_factor}:{self.resample}:{self.reference}"

    def size_problem(self, width: int, height: int) -> str | None:
        return aspect_problem(height, width)

    def process(self, image: Image.Image, normalize: bool) -> ProcessedImage:
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        width, height = image.size
        h, w = smart_resize(height, width, p * m, self.min_pixels, self.max_pixels)
        chw = resized(image, w, h, self.resample, self.reference).transpose(2, 0, 1)
        channels = chw.shape[0]
        frames = np.broadcast_to(chw, (t, *chw.shape))  # one picture repeated over the temporal patch
        gh, gw = h // p, w // p
        # (frame, channel, merge row, row in window, pixel row, merge column, column in window, pixel column) ->
        # patches ordered by merge window (row-major), within a window row-major; each patch channel, frame,
        # pixel row, pixel column.
        blocks = frames.reshape(t, channels, gh // m, m, p, gw // m, m, p).transpose(2, 5, 3, 6, 1, 0, 4, 7)
        raw = np.ascontiguousarray(blocks.reshape(gh * gw, channels * t * p * p))
        grid = np.array([1, gh, gw], dtype=np.int64)
        return ProcessedImage(raw, {"image_grid_thw": grid}, gh * gw // (m * m),
                              self.normalized(raw) if normalize else None)

    def normalized(self, raw: np.ndarray) -> np.ndarray:
        rows = raw.shape[0]
        per_channel = raw.reshape(rows, len(self.mean), -1).transpose(1, 0, 2)  # a patch row is (channel, frame, y, x)
        out = rescaled_normalized(per_channel, self.rescale_factor, self.mean, self.std, self.reference)
        return np.ascontiguousarray(out.transpose(1, 0, 2).reshape(raw.shape))


# -- LLaVA and CLIP-style ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ClipStyleProcessor(RepeatedPlaceholder):
    placeholder_id: int
    tokens_per_image: int
    shortest_edge: int = 336
    crop: "tuple[int, int]" = (336, 336)
    do_center_crop: bool = True
    mean: "tuple[float, ...]" = OPENAI_CLIP_MEAN
    std: "tuple[float, ...]" = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3
    reference: str = "torchvision"
    family = "llava"
    flat_pixels_by = None
    cpu_tensors = ()

    @classmethod
    def from_config(cls, config: dict[str, Any], token_to_id: Callable[[str], "int | None"],
                    files: dict[str, Any]) -> "ClipStyleProcessor":
        model_config = files.get("config.json") or {}
        size = config.get("size", {"shortest_edge": 336})
        shortest = size.get("shortest_edge") if isinstance(size, dict) else size
        crop = config.get("crop_size", {"height": shortest, "width": shortest})
        crop = (crop.get("height"), crop.get("width")) if isinstance(crop, dict) else (crop, crop)
        vision = model_config.get("vision_config") if isinstance(model_config.get("vision_config"), dict) else {}
        patch = vision.get("patch_size", 14)
        if not (isinstance(shortest, int) and all(isinstance(c, int) and c > 0 for c in crop)
                and isinstance(patch, int) and patch > 0):
            raise ProcessorConfigError(f"preprocessor_config.json: unusable sizes {size} / {crop} / patch {patch}")
        # The vision tower's patches; the default strategy drops the CLS feature, "full" keeps it.
        tokens = (crop[0] // patch) * (crop[1] // patch)
        if model_config.get("vision_feature_select_strategy", "default") == "full":
            tokens += 1
        return cls(placeholder_id=_token_id(token_to_id, "<image>"), tokens_per_image=tokens, shortest_edge=shortest,
                   crop=crop, do_center_crop=config.get("do_center_crop", True) is True,
                   **_pixel_fields(config, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, 3))

    def describe(self) -> str:
        return f"{self.family}:{self.shortest_edge}:{self.crop}:{self.do_center_crop}:{self.mean}:{self.std}:" \
               f"{self.rescale_factor}:{self.resample}:{self.reference}"

    def size_problem(self, width: int, height: int) -> str | None:
        # Resized so its short side is shortest_edge, a 1 x 39,000,000 image would be 336 x 13 billion pixels before
        # the crop: refused past the same ratio as Qwen2-VL's (no photograph is 200:1).
        return aspect_problem(height, width)

    def process(self, image: Image.Image, normalize: bool) -> ProcessedImage:
        width, height = image.size
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(self.shortest_edge * long / short)  # transformers' size for shortest_edge: truncated
        size = (self.shortest_edge, new_long) if width <= height else (new_long, self.shortest_edge)
        pixels = resized(image, *size, self.resample, self.reference)
        if self.do_center_crop:
            pixels = _center_crop(pixels, *self.crop)
        raw = np.ascontiguousarray(pixels.transpose(2, 0, 1))  # CHW
        return ProcessedImage(raw, {}, self.tokens_per_image, self.normalized(raw) if normalize else None)

    def normalized(self, raw: np.ndarray) -> np.ndarray:
        return rescaled_normalized(raw, self.rescale_factor, self.mean, self.std, self.reference)


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre ``height`` x ``width`` of HWC pixels, padded with zeros where the image is smaller (as
    transformers' center_crop does)."""
    h, w = pixels.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return pixels[top:top + height, left:left + width]
    out = np.zeros((max(h, height), max(w, width), pixels.shape[2]), dtype=pixels.dtype)
    pad_top, pad_left = max(0, (height - h) // 2), max(0, (width - w) // 2)
    out[pad_top:pad_top + h, pad_left:pad_left + w] = pixels
    top, left = (out.shape[0] - height) // 2, (out.shape[1] - width) // 2
    return out[top:top + height, left:left + width]


# -- Gemma 3 ---------------------------------------------------------------------------------------------------

# Gemma 3's pan and scan: the processor's own defaults (Gemma3ProcessorKwargs), which decide it whatever the model's
# preprocessor_config.json says (transformers merges the processor's defaults over the image processor's settings,
# so vLLM's server crops only when a request's or the engine's mm_processor_kwargs turn it on).
PAN_AND_SCAN_DEFAULTS = {"do_pan_and_scan": False, "pan_and_scan_min_crop_size": 256,
                         "pan_and_scan_max_num_crops": 4, "pan_and_scan_min_ratio_to_activate": 1.2}
# Crops an image may be cut into here: each is a whole image's pixels and tokens (896 x 896, 256 tokens published),
# so a client's count is bounded as the media's other bounds are (vLLM's server takes any).
PAN_AND_SCAN_CROPS_MAX = 8


@dataclasses.dataclass(frozen=True)
class PanAndScan:
    """Gemma 3's pan and scan (Gemma3ImageProcessor.pan_and_scan): an image whose long side is at least
    ``min_ratio`` times its short one is also cut along its long side into 2 to ``max_crops`` crops of about its
    short side's length (no crop under ``min_crop_size``), each then processed as a whole image."""

    min_crop_size: int = 256
    max_crops: int = 4
    min_ratio: float = 1.2

    def crops(self, width: int, height: int) -> "list[tuple[int, int, int, int]]":
        """The crops' boxes (left, top, right, bottom) of a ``width`` x ``height`` image; none when it is not
        long enough or its crops would be too small. Integer arithmetic as the processor's (floor of the ratio
        plus a half, ceil of the side over the count); the last crop stops at the edge, and may be empty there
        (a tiny crop size on a thin image: ``process`` refuses it, as transformers fails on it)."""
        long_side, short_side = (width, height) if width >= height else (height, width)
        if long_side / short_side < self.min_ratio:
            return []
        count = min(long_side // self.min_crop_size, int(math.floor(long_side / short_side + 0.5)))
        count = min(self.max_crops, max(2, count))
        crop_w = math.ceil(width / count) if width >= height else width
        crop_h = height if width >= height else math.ceil(height / count)
        if min(crop_w, crop_h) < self.min_crop_size:
            return []
        if width >= height:
            return [(x, 0, max(x, min(x + crop_w, width)), height) for x in range(0, crop_w * count, crop_w)]
        return [(0, y, width, max(y, min(y + crop_h, height))) for y in range(0, crop_h * count, crop_h)]


@dataclasses.dataclass(frozen=True)
class Gemma3Processor:
    """Gemma 3 (Gemma3ImageProcessor): every image resized to one square (896 x 896 published, bilinear), rescaled,
    normalized (0.5, 0.5); it stands in the prompt as "\n\n<start_of_image>" + ``tokens_per_image`` soft tokens +
    "<end_of_image>\n\n" where the template wrote <start_of_image>, and those newlines join the newlines beside
    them as Gemma's tokenizer joins them ("\n" + "\n\n" is one token), as the processor vLLM's server runs does.

    With ``pan_and_scan`` (``with_request_kwargs``), an image it crops is the whole image and its crops, each
    resized as above (vLLM: ``num_patches`` = crops + 1), and stands in the prompt as Gemma3Processor writes it:
    "Here is the original image " + its sequence + " and here are some crops to help you see better " + the
    crops' sequences joined by spaces, that text tokenized with the model's tokenizer by itself (vLLM's
    get_image_repl), in the media threads (``ProcessedImage.prompt_ids``)."""

    placeholder_id: int  # <start_of_image>
    embed_id: int  # <image_soft_token>
    end_id: int  # <end_of_image>
    double_newline_id: int
    newline_pieces: "tuple[tuple[int, int], ...]" = ()
    tokens_per_image: int = 256
    height: int = 896
    width: int = 896
    mean: "tuple[float, ...]" = (0.5, 0.5, 0.5)
    std: "tuple[float, ...]" = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 2
    reference: str = "torchvision"
    pan_and_scan: "PanAndScan | None" = None
    # The mm_processor_kwargs applied so far (the node's, then a request's over them), as (key, value) pairs.
    settings: "tuple[tuple[str, Any], ...]" = dataclasses.field(default=(), compare=False)
    # The tokenizer's plain encode (no special tokens added), for pan and scan's text.
    encode_text: "Callable[[str], list[int]] | None" = dataclasses.field(default=None, compare=False)
    family = "gemma3"
    request_kwargs = tuple(PAN_AND_SCAN_DEFAULTS)  # the mm_processor_kwargs it takes
    flat_pixels_by = "num_patches"  # vLLM's layout: crops per image, the whole image first
    cpu_tensors = ("num_patches",)

    @classmethod
    def from_config(cls, config: dict[str, Any], token_to_id: Callable[[str], "int | None"],
                    files: dict[str, Any]) -> "Gemma3Processor":
        model_config = files.get("config.json") or {}
        # do_pan_and_scan and its settings here are not read: the processor's defaults win over them in
        # transformers (PAN_AND_SCAN_DEFAULTS), and vLLM's server crops with a request's kwargs only.
        size = config.get("size", {"height": 896, "width": 896})
        if not (isinstance(size, dict) and all(isinstance(size.get(k), int) and size[k] > 0
                                               for k in ("height", "width"))):
            raise ProcessorConfigError(f"preprocessor_config.json: size is {size!r}")
        tokens = config.get("image_seq_length", model_config.get("mm_tokens_per_image", 256))
        two = token_to_id("\n\n")
        if two is None:
            raise ProcessorConfigError("the tokenizer has no \"\\n\\n\" token for Gemma 3's image sequence")
        # Gemma's vocabulary has a token for each run of up to 31 newlines.
        pieces = tuple((token, n) for n in range(1, NEWLINE_RUN_MAX + 1)
                       if (token := token_to_id("\n" * n)) is not None)
        processor = cls(placeholder_id=_token_id(token_to_id, "<start_of_image>"),
                        embed_id=_token_id(token_to_id, "<image_soft_token>"),
                        end_id=_token_id(token_to_id, "<end_of_image>"), double_newline_id=two,
                        newline_pieces=pieces, tokens_per_image=_number({"n": tokens}, "n", 256, (int,)),
                        height=size["height"], width=size["width"],
                        **_pixel_fields(config, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 2))
        if processor.tokens_per_image < 1 or processor.resample not in RESAMPLE:
            raise ProcessorConfigError(f"preprocessor_config.json: unusable {processor}")
        return processor

    def with_request_kwargs(self, kwargs: dict[str, Any]) -> "Gemma3Processor":
        """This processor with ``mm_processor_kwargs`` applied over those it has (pan and scan's four, as vLLM's
        server takes them: each one never set the processor's default); ValueError naming the first it cannot
        take."""
        for key in kwargs:
            if key not in PAN_AND_SCAN_DEFAULTS:
                raise ValueError(f"{key!r} is not applied to Gemma 3's images here (these are: "
                                 f"{', '.join(PAN_AND_SCAN_DEFAULTS)})")
        applied = tuple(sorted({**dict(self.settings), **kwargs}.items()))
        settings = {**PAN_AND_SCAN_DEFAULTS, **dict(applied)}
        if not isinstance(settings["do_pan_and_scan"], bool):
            raise ValueError("'do_pan_and_scan' must be a boolean")
        if not settings["do_pan_and_scan"]:
            return dataclasses.replace(self, pan_and_scan=None, settings=applied)
        size, crops, ratio = (settings[k] for k in ("pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops",
                                                    "pan_and_scan_min_ratio_to_activate"))
        if type(size) is not int or size < 1:
            raise ValueError("'pan_and_scan_min_crop_size' must be a positive integer")
        if type(crops) is not int or not 2 <= crops <= PAN_AND_SCAN_CROPS_MAX:
            raise ValueError(f"'pan_and_scan_max_num_crops' must be an integer from 2 to {PAN_AND_SCAN_CROPS_MAX}")
        if type(ratio) not in (int, float) or not 1.0 <= ratio <= 1e6:
            raise ValueError("'pan_and_scan_min_ratio_to_activate' must be a number of at least 1")
        if self.encode_text is None:
            raise ValueError("pan and scan's prompt text needs the model's tokenizer")
        return dataclasses.replace(self, pan_and_scan=PanAndScan(size, crops, float(ratio)), settings=applied)

    def describe(self) -> str:
        crops = self.pan_and_scan
        cropped = "" if crops is None else f":pas:{crops.min_crop_size}:{crops.max_crops}:{crops.min_ratio!r}"
        return f"{self.family}:{self.height}x{self.width}:{self.tokens_per_image}:{self.mean}:{self.std}:" \
               f"{self.rescale_factor}:{self.resample}:{self.reference}{cropped}"

    def size_problem(self, width: int, height: int) -> str | None:
        return None  # every image becomes one square: no size is refused beyond decoding's pixel bound

    def process(self, image: Image.Image, normalize: bool) -> ProcessedImage:
        boxes = self.pan_and_scan.crops(*image.size) if self.pan_and_scan is not None else []
        if any(left == right or top == bottom for left, top, right, bottom in boxes):
            raise ValueError(f"pan and scan cuts this {image.size[0]}x{image.size[1]} image into an empty crop with "
                             "these settings: a larger pan_and_scan_min_crop_size avoids it")
        squares = [resized(image, self.width, self.height, self.resample, self.reference)]
        squares += [resized(image.crop(box), self.width, self.height, self.resample, self.reference) for box in boxes]
        raw = np.ascontiguousarray(np.stack(squares).transpose(0, 3, 1, 2))  # the image, then its crops; CHW
        prompt_ids = tuple(self.encode_text(self._cropped_text(len(boxes)))) if boxes else ()
        return ProcessedImage(raw, {}, self.tokens_per_image * len(squares),
                              self.normalized(raw) if normalize else None, prompt_ids=prompt_ids)

    def _cropped_text(self, crops: int) -> str:
        """Gemma3Processor's text for an image and its ``crops`` (its replace_image_token), the sequences
        written out."""
        assert self.encode_text is not None  # with_request_kwargs refuses pan and scan without it
        sequence = "\n\n<start_of_image>" + "<image_soft_token>" * self.tokens_per_image + "<end_of_image>\n\n"
        return (f"Here is the original image {sequence} and here are some crops to help you see better "
                + " ".join([sequence] * crops))

    def normalized(self, raw: np.ndarray) -> np.ndarray:
        return tiles_normalized(raw, self)

    def expansion(self, image: ProcessedImage) -> "list[int]":
        if image.prompt_ids:
            return list(image.prompt_ids)
        newline = self.double_newline_id
        return [newline, self.placeholder_id, *([self.embed_id] * image.tokens), self.end_id, newline]


# -- Pixtral, Mistral 3 ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PixtralProcessor(PlaceholderIsImageToken):
    """Pixtral and Mistral 3 (PixtralImageProcessor, PixtralProcessor): shrunk, keeping its aspect ratio, until
    its longest side fits ``longest_edge``, then each side rounded up to a whole number of (merged) patches;
    rescaled, normalized; kept at its own size. It stands in the prompt where the template wrote [IMG] as rows
    of [IMG] tokens, one a merged patch, each row ended by [IMG_BREAK], the last by [IMG_END]."""

    placeholder_id: int  # [IMG]
    break_id: int  # [IMG_BREAK]
    end_id: int  # [IMG_END]
    patch: int = 16  # the image processor's patch times the processor's spatial merge: one [IMG] a square
    longest_edge: int = 1024
    mean: "tuple[float, ...]" = OPENAI_CLIP_MEAN
    std: "tuple[float, ...]" = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3
    reference: str = "torchvision"
    family = "pixtral"
    flat_pixels_by = None  # one (3, h, w) an image, each its own size (vLLM's Mistral 3 and Pixtral layouts)
    cpu_tensors = ()

    @classmethod
    def from_config(cls, config: dict[str, Any], token_to_id: Callable[[str], "int | None"],
                    files: dict[str, Any]) -> "PixtralProcessor":
        model_config = files.get("config.json") or {}
        outer = files.get("processor_config.json") or {}  # PixtralProcessor's: its patch, merge and tokens
        size = config.get("size", {"longest_edge": 1024})
        longest = size.get("longest_edge") if isinstance(size, dict) else None
        patch = outer.get("patch_size", config.get("patch_size", {"height": 16, "width": 16}))
        patch = patch.get("height") if isinstance(patch, dict) and patch.get("height") == patch.get("width") else patch
        merge = outer.get("spatial_merge_size", model_config.get("spatial_merge_size", 1))
        if not (isinstance(longest, int) and longest > 0 and isinstance(patch, int) and patch > 0
                and isinstance(merge, int) and merge > 0):
            raise ProcessorConfigError(f"preprocessor_config.json: unusable sizes {size} / patch {patch} / merge "
                                       f"{merge}")
        tokens = {name: outer.get(key, default) for name, key, default in (
            ("image", "image_token", "[IMG]"), ("break", "image_break_token", "[IMG_BREAK]"),
            ("end", "image_end_token", "[IMG_END]"))}
        processor = cls(placeholder_id=_token_id(token_to_id, tokens["image"]),
                        break_id=_token_id(token_to_id, tokens["break"]), end_id=_token_id(token_to_id, tokens["end"]),
                        patch=patch * merge, longest_edge=longest,
                        **_pixel_fields(config, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, 3))
        if processor.resample not in RESAMPLE:
            raise ProcessorConfigError(f"preprocessor_config.json: resample {processor.resample}")
        return processor

    def describe(self) -> str:
        return f"{self.family}:{self.patch}:{self.longest_edge}:{self.mean}:{self.std}:{self.rescale_factor}:" \
               f"{self.resample}:{self.reference}"

    def size_problem(self, width: int, height: int) -> str | None:
        return aspect_problem(height, width)  # a 1 x 39,000,000 strip would still be 1024 patches long

    def target_size(self, width: int, height: int) -> "tuple[int, int]":
        """(width, height) it is resized to, as transformers' get_resize_output_image_size computes it."""
        ratio = max(height / self.longest_edge, width / self.longest_edge)
        if ratio > 1:
            height, width = int(math.floor(height / ratio)), int(math.floor(width / ratio))
        p = self.patch
        return ((width - 1) // p + 1) * p, ((height - 1) // p + 1) * p

    def process(self, image: Image.Image, normalize: bool) -> ProcessedImage:
        width, height = self.target_size(*image.size)
        raw = np.ascontiguousarray(resized(image, width, height, self.resample, self.reference).transpose(2, 0, 1))
        rows, columns = height // self.patch, width // self.patch
        return ProcessedImage(raw, {}, rows * (columns + 1), self.normalized(raw) if normalize else None)

    def normalized(self, raw: np.ndarray) -> np.ndarray:
        return rescaled_normalized(raw, self.rescale_factor, self.mean, self.std, self.reference)

    def expansion(self, image: ProcessedImage) -> "list[int]":
        rows, columns = image.raw.shape[1] // self.patch, image.raw.shape[2] // self.patch
        ids = ([self.placeholder_id] * columns + [self.break_id]) * rows
        ids[-1] = self.end_id
        return ids

"""The simulated engine as a vision model (``--vision``): a Qwen2-VL-style model that takes preprocessed images.

Its tokenizer bundle carries a Qwen2-VL image processor config (with a small pixel budget, so tests stay
cheap) and a chat template that writes ``<|vision_start|><|image_pad|><|vision_end|>`` for each image part,
as Qwen2-VL's does (this template is written here, in that format). A Generate carrying images is checked
as a real engine would need it to be: the pixel rows, one grid per image, the placeholder ranges over the
image token and as long as the grid says, one hash per image; a request that does not add up is refused
with INVALID_ARGUMENT naming what is off, so a gateway that preprocesses wrongly fails its tests. The
images are folded into the answer (its seed) and into the prefix cache's keys (two prompts that differ only
in an image share no cached blocks past it), as a real engine's encoder output and block hashes are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import struct
import zlib
from typing import Any

import numpy as np
from smg_grpc_proto.generated import common_pb2

IMAGE_TOKEN_ID = 151655  # <|image_pad|> in the Qwen tokenizers
VIDEO_TOKEN_ID = 151656  # <|video_pad|>
PATCH, TEMPORAL, MERGE = 14, 2, 2
PATCH_VALUES = 3 * TEMPORAL * PATCH * PATCH  # 1,176 values a patch row
PREPROCESSOR_CONFIG = {
    "image_processor_type": "Qwen2VLImageProcessorPil", "do_resize": True, "do_rescale": True,
    "do_normalize": True, "do_convert_rgb": True, "rescale_factor": 1 / 255, "resample": 3,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "patch_size": PATCH, "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
    "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64,  # at most 256 patches (64 tokens) an image
}
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'video' -%}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")


class ImagesRefused(ValueError):
    """A request's images that do not add up (what a real engine would fail on)."""


# What the bundle's config.json says of the model: Qwen2-VL, whose videos the gateway processes too.
MODEL_CONFIG = {"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
                "image_token_id": IMAGE_TOKEN_ID, "video_token_id": VIDEO_TOKEN_ID}


@dataclasses.dataclass(frozen=True)
class CheckedImages:
    digest: int  # folded into the answer's seed
    cache_ids: list[int]  # the prompt's ids with each image's tokens replaced by its hash's: prefix cache keys
    items: int = 0  # images (or videos) checked


def _array(data: bytes, shape: Any, dtype: str) -> np.ndarray:
    try:
        return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(tuple(shape))
    except (TypeError, ValueError) as e:
        raise ImagesRefused(f"a tensor's bytes do not match its shape {list(shape)} and dtype {dtype!r}: {e}") from None


def check_pixels_and_token(pixels: np.ndarray, shape: "tuple[int, ...]", raw: bool, im_token_id: int | None,
                           image_token: int, hashes: "list[str]", images: int, what: str) -> None:
    """What every family's engine checks first: the pixels' dtype (uint8 when the engine normalizes, else float32)
    and ``shape`` (``what`` says it in the refusal), the image token, one hash an image when hashes come."""
    kind = np.uint8 if raw else np.float32
    if pixels.shape != shape or pixels.dtype != kind:
        raise ImagesRefused(f"pixel_values is {pixels.dtype}{list(pixels.shape)}; this engine takes {kind.__name__} "
                            f"{what}")
    if im_token_id != image_token:
        raise ImagesRefused(f"im_token_id is {im_token_id}; this model's image token is {image_token}")
    if hashes and len(hashes) != images:
        raise ImagesRefused(f"{len(hashes)} mm_hashes for {images} images")


def placeholders(mm: Any) -> "tuple[list[tuple[int, int]], int | None]":
    """A request's placeholder ranges and the image token it names (None when it names none)."""
    return [(p.offset, p.length) for p in mm.mm_placeholders], mm.im_token_id if mm.HasField("im_token_id") else None


def tokenizer_with(tokenizer_json: bytes, special: "tuple[str, ...]", plain: "tuple[str, ...]" = ()) -> Any:
    """The tokenizer of ``tokenizer_json`` with a family's tokens added (special ones, then plain ones): what a
    family's simulated bundle carries, its ids above the base vocabulary."""
    import tokenizers
    tok = tokenizers.Tokenizer.from_str(tokenizer_json.decode())
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([tokenizers.AddedToken(t, normalized=False) for t in plain])
    return tok


def server_info(config: Any) -> dict[str, Any]:
    """What vLLM's GetServerInfo says of a vision engine: whether it normalizes on its device, its bounds."""
    if not config.vision:
        return {}
    info: dict[str, Any] = {"mm_device_do_normalize": not config.vision_takes_floats}
    if config.vision_images_max:
        info["mm_item_limits"] = f"image={config.vision_images_max}"
    if config.vision_image_tokens_max:
        info["mm_encoder_budget"] = config.vision_image_tokens_max
    return info


def check(input_ids: "list[int]", pixels: np.ndarray, grid: np.ndarray, ranges: "list[tuple[int, int]]",
          im_token_id: int | None, hashes: "list[str]", raw: bool = False, images_max: int = 0,
          image_tokens_max: int = 0, patch_values: int = PATCH_VALUES) -> CheckedImages:
    """The images against the prompt: shapes, placeholder ranges, token counts; ``raw``: the engine normalizes on
    its device and takes uint8 pixels (floats would be normalized twice: garbage, with no error in a real one)."""
    kind = np.uint8 if raw else np.float32
    if pixels.ndim != 2 or pixels.shape[1] != patch_values or pixels.dtype != kind:
        raise ImagesRefused(f"pixel_values is {pixels.dtype}{list(pixels.shape)}; this engine takes {kind.__name__} "
                            f"rows of {patch_values}" + (" (it normalizes on its device)" if raw else ""))
    if images_max and len(ranges) > images_max:
        raise ImagesRefused(f"{len(ranges)} images; this engine takes at most {images_max} a prompt")
    if grid.ndim != 2 or grid.shape[1] != 3 or len(grid) != len(ranges):
        raise ImagesRefused(f"image_grid_thw is {list(grid.shape)} for {len(ranges)} placeholder ranges")
    if int(grid.prod(axis=1).sum()) != pixels.shape[0]:
        raise ImagesRefused(f"the grids hold {int(grid.prod(axis=1).sum())} patches, pixel_values "
                            f"{pixels.shape[0]} rows")
    if im_token_id != IMAGE_TOKEN_ID:
        raise ImagesRefused(f"im_token_id is {im_token_id}; this model's image token is {IMAGE_TOKEN_ID}")
    if hashes and len(hashes) != len(ranges):
        raise ImagesRefused(f"{len(hashes)} mm_hashes for {len(ranges)} images")
    check_image_ranges(input_ids, grid, ranges, image_tokens_max)
    bounds = np.cumsum([0, *grid.prod(axis=1).tolist()])
    cache_ids = cache_ids_of(input_ids, [pixels[a:b] for a, b in zip(bounds, bounds[1:])], ranges, hashes,
                             [struct.pack("<III", *row) for row in grid.tolist()])
    digest = zlib.crc32(pixels.tobytes(), zlib.crc32(grid.tobytes()))
    return CheckedImages(digest, cache_ids)


def check_image_ranges(input_ids: "list[int]", grid: np.ndarray, ranges: "list[tuple[int, int]]",
                       image_tokens_max: int = 0) -> None:
    """Each image's range against its grid (t * h * w / merge^2 image tokens, where the prompt has them), and no
    image token outside the ranges."""
    for (t, h, w), (offset, length) in zip(grid.tolist(), ranges):
        if t != 1 or h % MERGE or w % MERGE or length != t * h * w // (MERGE * MERGE):
            raise ImagesRefused(f"an image of grid {(t, h, w)} takes {t * h * w // (MERGE * MERGE)} tokens, its "
                                f"range {length}")
        if image_tokens_max and length > image_tokens_max:
            raise ImagesRefused(f"an image of {length} tokens is over the encoder budget of {image_tokens_max}")
        if offset + length > len(input_ids) or any(i != IMAGE_TOKEN_ID for i in input_ids[offset:offset + length]):
            raise ImagesRefused(f"the range ({offset}, {length}) is not the image token in the prompt")
    placed = sum(length for _, length in ranges)
    if input_ids.count(IMAGE_TOKEN_ID) != placed:
        raise ImagesRefused(f"the prompt has {input_ids.count(IMAGE_TOKEN_ID)} image tokens outside the ranges' "
                            f"{placed}")


def cache_ids_of(input_ids: "list[int]", pixels: "list[np.ndarray] | np.ndarray", ranges: "list[tuple[int, int]]",
                 hashes: "list[str]", shapes: "list[bytes] | None" = None) -> "list[int]":
    """The ids the prefix cache keys by: each image's range replaced by ids of its own (from its hash, or its pixels'
    when the form carries none, as SGLang's; with its shape), above any vocabulary, as a real engine's block
    hashes take the image's."""
    if not hashes:  # (SGLang's form carries none: each image's rows say who it is)
        hashes = [hashlib.sha256(rows.tobytes()).hexdigest() for rows in pixels]
    cache_ids = list(input_ids)
    for index, ((offset, length), image_hash) in enumerate(zip(ranges, hashes)):
        shape = shapes[index] if shapes else b""
        key = int.from_bytes(hashlib.sha256(image_hash.encode() + shape).digest()[:4], "big")
        # Ids the cache hashes (as uint32) in place of the image's tokens: above any vocabulary, the image's own.
        cache_ids[offset:offset + length] = [(1 << 31) + (key + i) % (1 << 31) for i in range(length)]
    return cache_ids


def check_vllm(mm: Any, input_ids: "list[int]", config: Any, patch_values: int = PATCH_VALUES) -> CheckedImages:
    """vLLM's preprocessed path, as the servicer builds vLLM's inputs from it: pixel rows split by a sizes tensor
    (flat_keys), the grid one row per image (batched_keys)."""
    tensors = {key: _array(td.inline, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    pixels = _array(mm.pixel_values.inline, mm.pixel_values.shape, mm.pixel_values.dtype)
    grid = tensors.get("image_grid_thw")
    sizes_key = mm.flat_keys.get("pixel_values")
    if grid is None or sizes_key is None or sizes_key not in tensors or "image_grid_thw" not in mm.batched_keys:
        raise ImagesRefused("vLLM's Qwen2-VL layout is pixel_values flat by a sizes tensor, image_grid_thw batched")
    # vLLM computes M-RoPE positions from the grid on the CPU and strips every tensor not kept there from an
    # image whose tokens it already computed: without this a real engine fails at its next step (and dies).
    if "image_grid_thw" not in mm.keep_on_cpu_keys:
        raise ImagesRefused("image_grid_thw must be in keep_on_cpu_keys (vLLM reads M-RoPE grids on the CPU)")
    if mm.modality != common_pb2.IMAGE:
        raise ImagesRefused(f"the batch's modality is {mm.modality}, not IMAGE")
    if tensors[sizes_key].tolist() != grid.prod(axis=1).tolist():
        raise ImagesRefused(f"{sizes_key} is {tensors[sizes_key].tolist()}, the grids' patches "
                            f"{grid.prod(axis=1).tolist()}")
    return check(input_ids, pixels, grid, *placeholders(mm), list(mm.mm_hashes),
                 not config.vision_takes_floats, config.vision_images_max, config.vision_image_tokens_max,
                 patch_values)


def check_vllm_video(mm: Any, input_ids: "list[int]", config: Any) -> CheckedImages:
    """A VIDEO batch on vLLM's preprocessed path, as Qwen2-VL's videos need it (the servicer passes the pixels as
    pixel_values_videos): pixel rows flat by a sizes tensor, video_grid_thw batched and kept on the CPU, each range
    t * h * w / merge^2 of the video token, one hash a video."""
    pixels, grid, ranges = video_layout(mm, config, PATCH_VALUES)
    for (t, h, w), (offset, length) in zip(grid.tolist(), ranges):
        if h % MERGE or w % MERGE or length != t * h * w // (MERGE * MERGE):
            raise ImagesRefused(f"a video of grid {(t, h, w)} takes {t * h * w // (MERGE * MERGE)} tokens, its "
                                f"range {length}")
        if any(i != VIDEO_TOKEN_ID for i in input_ids[offset:offset + length]) or offset + length > len(input_ids):
            raise ImagesRefused(f"the range ({offset}, {length}) is not the video token in the prompt")
    return checked_video(mm, input_ids, pixels, grid, ranges)


def video_layout(mm: Any, config: Any, patch_values: int) -> "tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]":
    """(pixels, grid, ranges) of a VIDEO batch laid out as vLLM's Qwen-VL videos need it: pixel rows of
    ``patch_values`` flat by a sizes tensor, video_grid_thw batched and kept on the CPU, the video token, one grid
    and one hash a range."""
    tensors = {key: _array(td.inline, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    pixels = _array(mm.pixel_values.inline, mm.pixel_values.shape, mm.pixel_values.dtype)
    grid = tensors.get("video_grid_thw")
    sizes_key = mm.flat_keys.get("pixel_values")
    if grid is None or sizes_key is None or sizes_key not in tensors or "video_grid_thw" not in mm.batched_keys \
            or "video_grid_thw" not in mm.keep_on_cpu_keys:
        raise ImagesRefused("vLLM's Qwen-VL videos are pixel_values flat by a sizes tensor, video_grid_thw batched "
                            "and kept on the CPU")
    ranges, token = placeholders(mm)
    kind = np.float32 if config.vision_takes_floats else np.uint8
    if pixels.ndim != 2 or pixels.shape[1] != patch_values or pixels.dtype != kind:
        raise ImagesRefused(f"pixel_values (a video's) is {pixels.dtype}{list(pixels.shape)}; this engine takes "
                            f"{kind.__name__} rows of {patch_values}")
    if token != VIDEO_TOKEN_ID:
        raise ImagesRefused(f"im_token_id is {token}; this model's video token is {VIDEO_TOKEN_ID}")
    if grid.ndim != 2 or grid.shape[1] != 3 or len(grid) != len(ranges) or len(mm.mm_hashes) != len(ranges):
        raise ImagesRefused(f"video_grid_thw is {list(grid.shape)}, {len(mm.mm_hashes)} hashes, for {len(ranges)} "
                            "placeholder ranges")
    if tensors[sizes_key].tolist() != grid.prod(axis=1).tolist() or int(grid.prod(axis=1).sum()) != len(pixels):
        raise ImagesRefused(f"{sizes_key} is {tensors[sizes_key].tolist()}, the grids' patches "
                            f"{grid.prod(axis=1).tolist()}, pixel_values {len(pixels)} rows")
    return pixels, grid, ranges


def checked_video(mm: Any, input_ids: "list[int]", pixels: np.ndarray, grid: np.ndarray,
                  ranges: "list[tuple[int, int]]") -> CheckedImages:
    """A VIDEO batch whose ranges were checked: no video token outside them; its digest and cache ids."""
    inside = sum(input_ids[offset:offset + length].count(VIDEO_TOKEN_ID) for offset, length in ranges)
    if input_ids.count(VIDEO_TOKEN_ID) != inside:
        raise ImagesRefused("the prompt has video tokens outside the ranges")
    bounds = np.cumsum([0, *grid.prod(axis=1).tolist()])
    cache_ids = cache_ids_of(input_ids, [pixels[a:b] for a, b in zip(bounds, bounds[1:])], ranges,
                             list(mm.mm_hashes), [struct.pack("<III", *row) for row in grid.tolist()])
    return CheckedImages(zlib.crc32(pixels.tobytes(), zlib.crc32(grid.tobytes())), cache_ids, len(ranges))


def check_vllm_batches(request: Any, input_ids: "list[int]", image_check: Any, video_check: Any) -> CheckedImages:
    """Every batch of a vLLM request (mm_inputs, then extra_mm_inputs: one a modality), each by its modality's
    check (None: this model takes none of it), folded into one digest and one list of cache ids."""
    batches = [request.mm_inputs, *request.extra_mm_inputs]
    modalities = [mm.modality or common_pb2.IMAGE for mm in batches]
    if len(set(modalities)) != len(modalities):
        raise ImagesRefused(f"batches of modalities {modalities}: one batch a modality")
    digest, cache_ids, items = 0, list(input_ids), 0
    for mm, modality in zip(batches, modalities):
        check = video_check if modality == common_pb2.VIDEO else image_check
        if check is None:
            raise ImagesRefused(f"this model takes no {common_pb2.Modality.Name(modality).lower()} inputs")
        checked = check(mm, input_ids)
        for offset, length in placeholders(mm)[0]:
            cache_ids[offset:offset + length] = checked.cache_ids[offset:offset + length]
        digest = zlib.crc32(digest.to_bytes(4, "little"), checked.digest)
        items += len(mm.mm_placeholders)
    return CheckedImages(digest, cache_ids, items)


def check_sglang(mm: Any, input_ids: "list[int]") -> CheckedImages:
    """SGLang's: one item of every image's pixel rows, the grid among the model's tensors."""
    tensors = {key: _array(td.data, td.shape, td.dtype) for key, td in mm.model_specific_tensors.items()}
    if "image_grid_thw" not in tensors:
        raise ImagesRefused("image_grid_thw is missing")
    pixels = _array(mm.pixel_values.data, mm.pixel_values.shape, mm.pixel_values.dtype)
    return check(input_ids, pixels, tensors["image_grid_thw"], *placeholders(mm), [])


def check_tokenspeed(mm: Any, input_ids: "list[int]") -> CheckedImages:
    """TokenSpeed's items, one an image: its own pixel rows as the encoder input, its grid a batch of one row, one
    placeholder range, the image token, a content hash."""
    grids, ranges, hashes, token = tokenspeed_items(mm)
    pixels = [_array(item.encoder_input.inline, item.encoder_input.shape, item.encoder_input.dtype)
              for item in mm.items]
    return check(input_ids, np.concatenate(pixels), grids, ranges, token, hashes)


def tokenspeed_items(mm: Any) -> "tuple[np.ndarray, list[tuple[int, int]], list[str], int | None]":
    """(grids, placeholder ranges, content hashes, image token) of TokenSpeed's items, each checked for what every
    item carries: IMAGE, its image_grid_thw as one row, one placeholder range, a content hash; one image token."""
    grids, ranges, hashes = [], [], []
    token_ids = set()
    for item in mm.items:
        if item.modality != common_pb2.IMAGE:
            raise ImagesRefused(f"an item's modality is {item.modality}, not IMAGE")
        if "image_grid_thw" not in item.model_specific_tensors or len(item.placeholders) != 1 or not item.content_hash:
            raise ImagesRefused("an item needs its image_grid_thw, one placeholder range and its content hash")
        grid = item_grid(item)
        grids.append(grid)
        ranges.append((item.placeholders[0].offset, item.placeholders[0].length))
        hashes.append(item.content_hash.hex())
        token_ids.add(item.placeholder_token_id if item.HasField("placeholder_token_id") else None)
    if not grids or len(token_ids) != 1:
        raise ImagesRefused("items without images, or with different image tokens")
    return np.concatenate(grids), ranges, hashes, token_ids.pop()


def item_grid(item: Any) -> np.ndarray:
    td = item.model_specific_tensors["image_grid_thw"]
    grid = _array(td.inline, td.shape, td.dtype)
    if grid.shape != (1, 3):
        raise ImagesRefused(f"an item's image_grid_thw is {list(grid.shape)}, not one row of (t, h, w)")
    return grid


def encoded_item_digest(item: Any) -> int:
    """An encode worker's side of one TokenSpeed item (EPD): its pixel rows (floats, PATCH_VALUES wide, as many as
    its grid's patches) checked, and the digest standing for the embedding its tower would compute."""
    if item.modality != common_pb2.IMAGE or "image_grid_thw" not in item.model_specific_tensors:
        raise ImagesRefused("an item to encode is an IMAGE with its image_grid_thw")
    grid = item_grid(item)
    pixels = _array(item.encoder_input.inline, item.encoder_input.shape, item.encoder_input.dtype)
    if pixels.ndim != 2 or pixels.shape != (int(grid.prod()), PATCH_VALUES) or pixels.dtype != np.float32:
        raise ImagesRefused(f"an item's encoder input is {pixels.dtype}{list(pixels.shape)}; its grid {grid.tolist()} "
                            f"takes float32 rows of {PATCH_VALUES}, one a patch")
    return zlib.crc32(pixels.tobytes(), zlib.crc32(grid.tobytes()))


def check_tokenspeed_encoded(mm: Any, input_ids: "list[int]", digests: "list[int]") -> CheckedImages:
    """TokenSpeed's items whose embeddings came from encode workers (EPD, ``digests`` in item order): no pixels of
    their own, each range where its grid says; folded into the answer by their embeddings."""
    if any(item.HasField("encoder_input") for item in mm.items):
        raise ImagesRefused("an item encoded by an encode worker carries no pixels to the prefill")
    grids, ranges, hashes, token = tokenspeed_items(mm)
    if token != IMAGE_TOKEN_ID:
        raise ImagesRefused(f"the image token is {token}; this model's is {IMAGE_TOKEN_ID}")
    check_image_ranges(input_ids, grids, ranges)
    cache_ids = cache_ids_of(input_ids, [], ranges, hashes, [struct.pack("<III", *row) for row in grids.tolist()])
    digest = 0
    for item_digest in digests:
        digest = zlib.crc32(item_digest.to_bytes(4, "little"), digest)
    return CheckedImages(digest, cache_ids, len(ranges))


def _engine_grid(height: int, width: int) -> "tuple[int, int]":
    """(rows, columns) of patches the engine's own Qwen2-VL processor gives an image (its smart_resize, written here
    apart from the gateway's: a gateway that counts otherwise fails the check below)."""
    factor = PATCH * MERGE
    sides = (height, width)
    snapped = [round(side / factor) * factor for side in sides]
    if snapped[0] * snapped[1] > PREPROCESSOR_CONFIG["max_pixels"]:  # shrunk, each side down to whole patches
        beta = math.sqrt(height * width / PREPROCESSOR_CONFIG["max_pixels"])
        snapped = [max(factor, math.floor(side / beta / factor) * factor) for side in sides]
    elif snapped[0] * snapped[1] < PREPROCESSOR_CONFIG["min_pixels"]:  # grown, each side up to whole patches
        beta = math.sqrt(PREPROCESSOR_CONFIG["min_pixels"] / (height * width))
        snapped = [math.ceil(side * beta / factor) * factor for side in sides]
    return snapped[0] // PATCH, snapped[1] // PATCH


def image_runs(input_ids: "list[int]") -> "list[tuple[int, int]]":
    """The prompt's runs of the image token, (offset, length) each."""
    runs: list[tuple[int, int]] = []
    for index, token in enumerate(input_ids):
        if token != IMAGE_TOKEN_ID:
            continue
        if runs and runs[-1][0] + runs[-1][1] == index:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    return runs


def check_trtllm(mm: Any, input_ids: "list[int]") -> CheckedImages:
    """TensorRT-LLM's form (its SMG servicer): each image's encoded bytes, which the engine decodes and processes
    itself, beside a prompt whose image tokens are already one run an image, as long as the engine's own processor
    makes that image (the gateway expands them, as smg does)."""
    from PIL import Image
    runs = image_runs(input_ids)
    if len(runs) != len(mm.image_data):
        raise ImagesRefused(f"{len(mm.image_data)} images for {len(runs)} runs of the image token in the prompt")
    digest = 0
    for data, (_, length) in zip(mm.image_data, runs):
        try:
            with Image.open(io.BytesIO(data)) as image:
                height, width = image.height, image.width
                image.convert("RGB")
        except Exception as e:  # what the real one's _load_and_convert_image raises: its request's error
            raise ImagesRefused(f"an image does not decode: {e}") from None
        rows, columns = _engine_grid(height, width)
        if length != rows * columns // (MERGE * MERGE):
            raise ImagesRefused(f"an image of {width} x {height} takes {rows * columns // (MERGE * MERGE)} tokens, "
                                f"its run {length}")
        digest = zlib.crc32(data, digest)
    hashes = [hashlib.sha256(data).hexdigest() for data in mm.image_data]
    return CheckedImages(digest, cache_ids_of(input_ids, [], runs, hashes), len(runs))

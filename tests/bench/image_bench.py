"""What preprocessing an image costs the gateway, against transformers' own processor doing the same work.

    python tests/bench/image_bench.py

For three images (a 640 x 480 photo-like JPEG, a 1280 x 720 one, a 1920 x 1080 PNG of noise) under Qwen2-VL's
published processor config (min 56 x 56, max 28 x 28 x 1280 pixels: 1,280 tokens at most): decoding (Pillow, as
both do), then our processor's raw pixels (what vLLM takes when it normalizes on its device) and normalized
floats, with the default reference (transformers' torchvision processors' pixels: torch's integer resize in
numpy) and with --media-pixel-reference pil (Pillow's resize), against transformers' Qwen2VLImageProcessorPil (its
torchvision variant needs torch, absent here). Medians of 15 runs in one process, milliseconds per image, and the
bytes each form sends over gRPC. Run on an idle machine: it measures time, not instructions.
"""

from __future__ import annotations

import dataclasses
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gateway.media.decode import decode_image  # noqa: E402
from gateway.media.processors import QwenVisionProcessor  # noqa: E402

RUNS = 15
PIXELS_MAX = 40_000_000


def photo(width: int, height: int, fmt: str) -> bytes:
    x, y = np.meshgrid(np.linspace(0, 1, width), np.linspace(0, 1, height))
    pixels = np.stack([x * 255, y * 255, (1 - x * y) * 255], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def noise(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((height, width, 3)) * 255).astype(np.uint8)).save(out, "PNG")
    return out.getvalue()


def median_ms(work) -> float:
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    ours = QwenVisionProcessor(placeholder_id=151655, max_pixels=28 * 28 * 1280)
    pillow = dataclasses.replace(ours, reference="pil")
    try:
        from transformers import Qwen2VLImageProcessorPil
        reference = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    except ImportError:
        reference = None
    print("image                  decode   raw (torchvision / pil)  floats (torchvision / pil)  transformers PIL   "
          "tokens  raw MB  floats MB")
    for name, data in (("photo 640x480 JPEG", photo(640, 480, "JPEG")), ("photo 1280x720 JPEG", photo(1280, 720, "JPEG")),
                       ("noise 1920x1080 PNG", noise(1920, 1080))):
        decoded = decode_image(data, PIXELS_MAX)
        decode = median_ms(lambda: decode_image(data, PIXELS_MAX))
        raw = median_ms(lambda: ours.process(decoded, False))
        floats = median_ms(lambda: ours.process(decoded, True))
        raw_pil = median_ms(lambda: pillow.process(decoded, False))
        floats_pil = median_ms(lambda: pillow.process(decoded, True))
        theirs = median_ms(lambda: reference(images=[decoded], return_tensors="np")) if reference else float("nan")
        processed = ours.process(decoded, True)
        print(f"{name:21} {decode:7.1f}  {raw:11.1f} / {raw_pil:9.1f}  {floats:14.1f} / {floats_pil:9.1f}  "
              f"{theirs:16.1f}   {processed.tokens:6d}  "
              f"{processed.raw.nbytes / 1e6:6.2f}  {processed.normalized.nbytes / 1e6:9.2f}")


if __name__ == "__main__":
    main()

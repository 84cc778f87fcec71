"""Resizing as the processor vLLM's server runs computes it: transformers' torchvision-backed ("Fast") image
processors resize uint8 images with torch's antialiased kernel, which on a CPU computes in integers: each output
value a sum of the input values times weights rounded to int16 at a precision chosen per pass, horizontal first,
then vertical, each pass rounded and clamped to uint8. Pillow's kernel has the same weights at 22 bits in int32,
so the two differ by a level of the 255 on a few values; a model's answers can tell.

The weights, as torch and Pillow compute them (both from Pillow's resample.c): for output index i of a pass with
scale s = in / out, the support is half the filter's size times max(s, 1); the inputs from
int(centre - support + 0.5) to int(centre + support + 0.5) (within the image), centre = s * (i + 0.5), each
weighted by the filter at (input + 0.5 - centre) / max(s, 1), normalized to sum 1. torch's precision: the most
bits (up to 22) at which the largest weight of the pass, doubled, stays under 2^15.

No I/O; numpy, off the event loop (the media threads).
"""

from __future__ import annotations

import math

import numpy as np

BICUBIC_A = -0.5  # Pillow's and torch's antialiased cubic
BLOCK_VALUES = 1 << 18  # int32 values a block of rows holds (1 MiB): the pass's temporaries stay in cache
# A pass's weights (outputs x taps, float64 while computed): 32 MiB. The taps grow with how far a side shrinks, so a
# 1 x 4,000,000 strip brought to 896 would need 8 M of them (and as many passes over the image); every image the
# families' other bounds let through (200:1 at most, 40 M pixels) needs under a tenth of this.
WEIGHTS_MAX = 1 << 22


def _bilinear(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _bicubic(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    a = BICUBIC_A
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _sinc(x: np.ndarray) -> np.ndarray:
    safe = np.where(x == 0.0, 1.0, x)
    return np.where(x == 0.0, 1.0, np.sin(np.pi * safe) / (np.pi * safe))


def _lanczos(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < 3.0, _sinc(x) * _sinc(x / 3.0), 0.0)


# The filter and its half width, by the name torchvision's interpolation modes have.
FILTERS = {"bilinear": (_bilinear, 1.0), "bicubic": (_bicubic, 2.0), "lanczos": (_lanczos, 3.0)}


def pass_weights(in_size: int, out_size: int, kind: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(first input index per output, int16 weights per output and tap, the precision in bits) of one pass;
    ValueError when the pass would need more than WEIGHTS_MAX weights."""
    function, half_width = FILTERS[kind]
    scale = in_size / out_size
    stretch = max(scale, 1.0)
    support = half_width * stretch
    taps = int(math.ceil(support)) * 2 + 1
    if taps * out_size > WEIGHTS_MAX:
        raise ValueError(f"a side of {in_size} pixels cannot be resized to {out_size} here: its shape is too far "
                         "from the model's")
    centres = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    first = np.maximum((centres - support + 0.5).astype(np.int64), 0)  # truncated, as C casts
    ends = np.minimum((centres + support + 0.5).astype(np.int64), in_size)
    offsets = np.arange(taps, dtype=np.float64)
    weights = function((first[:, None] + offsets[None, :] - centres[:, None] + 0.5) / stretch)
    weights[offsets[None, :] >= (ends - first)[:, None]] = 0.0
    totals = weights.sum(axis=1, keepdims=True)
    weights = np.divide(weights, totals, out=np.zeros_like(weights), where=totals != 0)
    largest = float(weights.max())
    precision = 0
    while precision < 22 and int(0.5 + largest * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    rounded = np.trunc(scaled + np.where(scaled < 0, -0.5, 0.5)).astype(np.int32)
    return first, rounded, precision


def _one_pass(pixels: np.ndarray, axis: int, out_size: int, kind: str) -> np.ndarray:
    """One pass along ``axis`` (1: horizontal, 0: vertical) of HWC uint8 pixels, in blocks of rows small enough
    for the processor's cache (a 12-megapixel photo at once would be ~150 MB of int32 temporaries a tap)."""
    in_size = pixels.shape[axis]
    first, weights, precision = pass_weights(in_size, out_size, kind)
    taps = [tap for tap in range(weights.shape[1]) if weights[:, tap].any()]
    height, width, channels = pixels.shape
    out_shape = (height, out_size, channels) if axis == 1 else (out_size, width, channels)
    out = np.empty(out_shape, dtype=np.uint8)
    rounding = 1 << (precision - 1) if precision else 0
    rows_per_block = max(1, BLOCK_VALUES // (max(out_shape[1], in_size if axis == 1 else width) * channels))
    for start in range(0, out_shape[0], rows_per_block):
        stop = min(out_shape[0], start + rows_per_block)
        if axis == 1:
            source = pixels[start:stop].astype(np.int32)
            total = np.full((stop - start, out_size, channels), rounding, dtype=np.int32)
            column_shape = (1, out_size, 1)
        else:
            source = None
            total = np.full((stop - start, width, channels), rounding, dtype=np.int32)
            column_shape = (stop - start, 1, 1)
        buffer = np.empty_like(total)
        for tap in taps:
            if axis == 1:
                np.take(source, np.minimum(first + tap, in_size - 1), axis=1, out=buffer)
                np.multiply(buffer, weights[:, tap].reshape(column_shape), out=buffer)
            else:
                rows = np.minimum(first[start:stop] + tap, in_size - 1)
                np.multiply(pixels[rows], weights[start:stop, tap].reshape(column_shape), out=buffer)
            total += buffer
        total >>= precision
        np.clip(total, 0, 255, out=total)
        out[start:stop] = total
    return out


def resize_uint8(pixels: np.ndarray, width: int, height: int, kind: str) -> np.ndarray:
    """HWC uint8 ``pixels`` resized to ``width`` x ``height`` with torch's antialiased integer kernel."""
    if pixels.shape[1] != width:
        pixels = _one_pass(pixels, 1, width, kind)
    if pixels.shape[0] != height:
        pixels = _one_pass(pixels, 0, height, kind)
    return pixels

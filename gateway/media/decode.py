"""An image's bytes to the RGB image a processor takes: only formats vision processors take, a bounded size
checked before anything is decompressed, converted as vLLM converts what it loads.

Pillow reads a file's header first (``Image.open`` is lazy): the format and the dimensions are known before
the pixels are decoded, so a 100,000 x 100,000 PNG of a few kilobytes (a decompression bomb) is refused
without allocating its 30 GB. The conversion is vLLM's (``ImageMediaIO``): an RGBA image is composited over
white, any other mode converted to RGB as Pillow does it; the first frame of an animated image. Runs in a
worker thread (``MediaService``): decoding a large JPEG takes tens of milliseconds.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable

from PIL import Image, UnidentifiedImageError

# What vision processors take (vLLM's own loader opens any Pillow format; these are the ones clients send).
FORMATS = frozenset({"JPEG", "PNG", "WEBP", "GIF", "BMP"})
RGBA_BACKGROUND = (255, 255, 255)


class ImageRefused(ValueError):
    """Bytes that are not an image this node takes (unknown or unlisted format, too many pixels, truncated)."""


def decode_image(data: bytes, pixels_max: int, size_problem: "Callable[[int, int], str | None]" = lambda w, h: None
                 ) -> Image.Image:
    """The RGB image in ``data``; ImageRefused (saying why) for anything else. ``size_problem(width, height)``:
    why the processor refuses an image of that size (an aspect ratio), asked from the header, before decoding."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=sorted(FORMATS))
            width, height = image.size
            if width < 1 or height < 1 or width * height > pixels_max:
                raise ImageRefused(f"the image is {width} x {height} pixels; at most {pixels_max} pixels are taken")
            problem = size_problem(width, height)
            if problem is not None:  # a 1 x 39,000,000 PNG decoded for 3.5 s (+770 MiB) before its ratio was refused
                raise ImageRefused(problem)
            image.load()
    except ImageRefused:
        raise
    except UnidentifiedImageError:
        raise ImageRefused(f"not an image in a format taken here ({', '.join(sorted(FORMATS))})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageRefused(f"the image decompresses too large: {e}") from None
    except (OSError, SyntaxError, ValueError) as e:  # truncated or corrupt data, as Pillow reports it
        raise ImageRefused(f"the image cannot be decoded: {e}") from None
    if image.mode == "RGB":
        return image
    if image.mode == "RGBA":
        converted = Image.new("RGB", image.size, RGBA_BACKGROUND)
        converted.paste(image, mask=image.getchannel("A"))
        return converted
    return image.convert("RGB")

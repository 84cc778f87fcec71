"""An image's bytes to the RGB image a processor takes: only formats vision processors take, a bounded size
checked before anything is decompressed, converted as vLLM converts what it loads.

Pillow reads a file's header first (``Image.open`` is lazy): the format and the dimensions are known before
the pixels are decoded, so a 100,000 x 100,000 PNG of a few kilobytes (a decompression bomb) is refused
without allocating its 30 GB. Then what vLLM's loader does (``ImageMediaIO.load_bytes``), in its order: the
image turned as its EXIF orientation says (a phone's photo is stored sideways with a tag saying so: without
this the model sees it sideways, with the same token count, so nothing in the usage tells), then converted to
RGB: every image that carries transparency (RGBA, LA, PA, a palette or grey image with a transparent colour, a
GIF's transparent index) composited over white, any other converted as Pillow does it (an RGB image is taken as
it is, a transparent colour of it too: vLLM's loader returns an image already in RGB before it looks for
transparency); the first frame of an
animated image. Runs in a worker thread (``MediaService``): decoding a large JPEG takes tens of milliseconds.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable

from PIL import Image, ImageOps, UnidentifiedImageError

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
            image = _upright(image)
            image.load()
    except ImageRefused:
        raise
    except UnidentifiedImageError:
        raise ImageRefused(f"not an image in a format taken here ({', '.join(sorted(FORMATS))})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageRefused(f"the image decompresses too large: {e}") from None
    except (OSError, SyntaxError, ValueError) as e:  # truncated or corrupt data, as Pillow reports it
        raise ImageRefused(f"the image cannot be decoded: {e}") from None
    return _rgb(image)


def _upright(image: Image.Image) -> Image.Image:
    """The image as its EXIF orientation says it is seen (vLLM's ``normalize_image``: a tag that cannot be read
    leaves the image as it is)."""
    try:
        return ImageOps.exif_transpose(image)
    except Exception:  # a broken EXIF block: Pillow raises what its parser meets
        return image


def _has_transparency(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info


def _rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if _has_transparency(image):
        if image.mode != "RGBA":
            image = image.convert("RGBA")  # a palette's or grey image's transparent colour becomes alpha 0
        converted = Image.new("RGB", image.size, RGBA_BACKGROUND)
        converted.paste(image, mask=image.getchannel("A"))
        return converted
    return image.convert("RGB")

"""What images a node fetches and how much of them it takes.

Fetching an image a client names is an outbound request from inside the operator's network: nothing but
``data:`` URIs is fetched until ``--media-allowed-hosts`` lists hosts (names, ``.suffix`` for a domain and
its subdomains) or networks (CIDRs). Even then an address that is private, loopback, link-local,
multicast, reserved or unspecified is refused unless a listed network holds it: an allowed name that
resolves (or is rebound) to 127.0.0.1 gets nothing.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..base.options import Option
from .processors import REFERENCES as PIXEL_REFERENCES


@dataclasses.dataclass(frozen=True)
class MediaConfig:
    allowed_hosts: tuple[str, ...] = ()  # empty: data: URIs only
    # One fetch, from the first byte sent to the last received, redirects included.
    fetch_timeout_s: float = 10.0
    redirects_max: int = 3
    # One image's encoded bytes (OpenAI's bound is 20 MB per image) and its pixels once decoded: 40 M pixels
    # is a 6,300 x 6,300 image, ~120 MB as RGB; Pillow's own decompression-bomb bound is 89 M.
    image_bytes_max: int = 20 * 1024 * 1024
    image_pixels_max: int = 40_000_000
    # Images in one request (vLLM's default limit per prompt is model-dependent, OpenAI allows hundreds: each
    # here costs a decode and a resize of up to image_pixels_max), and their bytes together.
    images_per_request_max: int = 16
    request_bytes_max: int = 64 * 1024 * 1024
    # Videos (vLLM's video_url parts, for the models whose videos this node processes: gateway/media/video.py):
    # frames taken from a JPEG frame list (the first ones: vLLM's num_frames, 32 by default); the engine's
    # --media-io-kwargs video fps when it sets one (None: vLLM's defaults, two frames a second sampled from a video
    # file by its Qwen-VL loader, and a JPEG frame list said to be taken at one a second, which Qwen2.5-VL's
    # positions read); a video's encoded bytes, its sampled frames' pixels together (each frame within
    # image_pixels_max; 32 frames of 1080p are 66 M pixels, ~200 MB decoded), videos in one request.
    video_frames: int = 32
    video_fps: float | None = None
    # A video file is decoded in a child process of its own (FFmpeg on a client's bytes: a crash costs the child),
    # within this time and a CPU budget as long.
    video_decode_timeout_s: float = 30.0
    video_bytes_max: int = 48 * 1024 * 1024
    video_pixels_max: int = 1 << 26
    videos_per_request_max: int = 2
    # Fetched images (their bytes, by URL) and processed ones (their tensors, by content and processor) kept
    # for the next request that names them: bounded by bytes, least recently used out first.
    cache_bytes_max: int = 256 * 1024 * 1024
    # Decodes and resizes at once (in threads, off the event loop; Pillow and numpy release the GIL for
    # most of the work); 0: one per core. Handed out fairly between tenants (gateway/media/fair.py): a freed
    # thread goes to the next tenant in turn, so another tenant's image waits for one decode, not a queue.
    threads: int = 0
    # Image fetches at once (connections), and one tenant's share of them: a quarter, so one tenant's slow servers
    # (a byte a second, each held for fetch_timeout_s) leave three quarters to everyone else.
    fetch_connections: int = 64
    fetch_connections_per_tenant: int = 16
    # One tenant's images in flight: their bytes (fetched or decoded from data: URIs, held until the request's
    # images are processed: four requests at the per-request bound) and its decodes waiting for a thread. Past
    # either, its next request is refused (429) rather than queued.
    tenant_bytes_max: int = 256 * 1024 * 1024
    tenant_waiting_max: int = 64
    # Whose pixels the processors compute: "torchvision", as transformers' torchvision-backed processors do, which
    # vLLM's server runs (torchvision is a dependency of vLLM): bit for bit, but its resize costs about twice
    # Pillow's, in numpy (image_bench.py); or "pil", as transformers' PIL processors do (Pillow's kernel: a level of
    # the 255 off on a few values).
    pixel_reference: str = "torchvision"
    # Settings of the models' image and video processors, as vLLM's --mm-processor-kwargs (Gemma 3's pan and scan,
    # Qwen-VL's pixel bounds), applied to each model whose family takes them; a request's own mm_processor_kwargs
    # over them, and its media_io_kwargs over video_frames and video_fps, only when trust_request_kwargs is set
    # (vLLM's --trust-request-mm-kwargs, off by default for the same reason: a client's crops and frames multiply
    # what its media cost).
    processor_kwargs: "tuple[tuple[str, Any], ...]" = ()
    trust_request_kwargs: bool = False


def pixel_reference(value: str) -> str:
    if value not in PIXEL_REFERENCES:
        raise ValueError(f"--media-pixel-reference is one of {', '.join(PIXEL_REFERENCES)}")
    return value


def processor_kwargs(value: str) -> "tuple[tuple[str, Any], ...]":
    """A JSON object, as vLLM's --mm-processor-kwargs takes it."""
    try:
        kwargs = json.loads(value)
    except ValueError:
        kwargs = None
    if not isinstance(kwargs, dict):
        raise ValueError("--media-processor-kwargs is a JSON object, e.g. '{\"do_pan_and_scan\": true}'")
    return tuple(sorted(kwargs.items()))


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--media-allowed-hosts", "media.allowed_hosts", "list", "hosts (names, .domain for its subdomains) or "
           "networks (CIDRs) image URLs may be fetched from; default none: only data: URIs. Private, loopback and "
           "link-local addresses only when a listed network holds them", "security"),
    Option("--media-fetch-timeout-secs", "media.fetch_timeout_s", float, "longest one image fetch may take, "
           "redirects included", "engines"),
    Option("--media-max-image-bytes", "media.image_bytes_max", int, "largest image (encoded) a request may bring",
           "engines"),
    Option("--media-max-image-pixels", "media.image_pixels_max", int, "most pixels an image may decode to "
           "(decompression bombs are refused before they decompress)", "engines"),
    Option("--media-max-images", "media.images_per_request_max", int, "images one request may carry", "engines"),
    Option("--media-video-frames", "media.video_frames", int, "frames taken from a JPEG frame list (the first "
           "ones), as vLLM's num_frames", "engines"),
    Option("--media-video-fps", "media.video_fps", float, "the engine's --media-io-kwargs video fps, when it sets "
           "one (default: vLLM's, two frames a second sampled from a file, a JPEG frame list taken at one)",
           "engines"),
    Option("--media-video-decode-timeout-secs", "media.video_decode_timeout_s", float, "longest a video file's "
           "decode (in a child process of its own) may take", "engines"),
    Option("--media-max-video-bytes", "media.video_bytes_max", int, "largest video (encoded) a request may bring",
           "engines"),
    Option("--media-max-video-pixels", "media.video_pixels_max", int, "most pixels a video's sampled frames may "
           "decode to together", "engines"),
    Option("--media-max-videos", "media.videos_per_request_max", int, "videos one request may carry", "engines"),
    Option("--media-cache-bytes", "media.cache_bytes_max", int, "bytes of fetched and processed images kept for "
           "reuse; 0 turns the cache off", "performance"),
    Option("--media-max-tenant-bytes", "media.tenant_bytes_max", int, "bytes of one tenant's images in flight at "
           "once (fetched, not yet processed)", "security"),
    Option("--media-fetch-connections", "media.fetch_connections", int, "image fetches at once; one tenant takes at "
           "most a quarter (--media-fetch-connections-per-tenant)", "performance"),
    Option("--media-fetch-connections-per-tenant", "media.fetch_connections_per_tenant", int, "image fetches one "
           "tenant may have at once", "security"),
    Option("--media-threads", "media.threads", int, "image decodes and resizes at once, off the event loop "
           "(0: one per core)", "performance"),
    Option("--media-pixel-reference", "media.pixel_reference", pixel_reference, "whose pixels image processors "
           "compute: torchvision (transformers' torchvision processors, which vLLM's server runs; bit for bit) or "
           "pil (transformers' PIL processors: about half the resize's CPU)", "engines"),
    Option("--media-processor-kwargs", "media.processor_kwargs", processor_kwargs, "settings of the models' image "
           "and video processors as a JSON object, as vLLM's --mm-processor-kwargs: Gemma 3's do_pan_and_scan and "
           "pan_and_scan_*, Qwen-VL's min_pixels / max_pixels (applied to each model whose family takes them)",
           "engines"),
    Option("--media-trust-request-kwargs", "media.trust_request_kwargs", "bool", "take a request's own "
           "mm_processor_kwargs (over --media-processor-kwargs) and media_io_kwargs (over --media-video-frames and "
           "--media-video-fps), as vLLM's --trust-request-mm-kwargs: only when clients are trusted (a client's crops "
           "and frames multiply what its media cost)", "security"),
)

"""Images as a subsystem of the node (gateway/base/subsystem.py): their section, flags and bounds, and the service
that fetches (only where --media-allowed-hosts says), decodes, processes and caches them, fairly by tenant."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from ..net.outbound import HostPolicy
from .config import OPTIONS, MediaConfig
from .service import MediaService


def _check(config: Any) -> None:
    media = config.media
    if not (media.fetch_timeout_s > 0 and media.image_bytes_max > 0 and media.image_pixels_max > 0
            and media.images_per_request_max > 0 and media.cache_bytes_max >= 0 and media.threads >= 0
            and media.fetch_connections > 0 and media.fetch_connections_per_tenant > 0
            and media.tenant_bytes_max > 0 and media.tenant_waiting_max > 0 and media.video_frames > 0
            and (media.video_fps is None or media.video_fps > 0) and media.video_bytes_max > 0
            and media.video_pixels_max > 0 and media.videos_per_request_max > 0 and media.video_decode_timeout_s > 0):
        raise ConfigProblem("--media-* bounds must be positive (the cache's and threads' may be 0)")
    try:
        HostPolicy(media.allowed_hosts)
    except ValueError as e:
        raise ConfigProblem(str(e)) from None


async def _start(context: StartContext) -> MediaService:
    return MediaService(context.config.media)


SUBSYSTEM = Subsystem("media", MediaConfig(), OPTIONS, _check, _start)

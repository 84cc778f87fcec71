"""A request's images, from the references a client sent to what the engine takes (``MediaService.prepare``).

Per image: its bytes (a ``data:`` URI's, or fetched: ``fetch.Fetcher``), bounded; decoded and processed by
the model's processor in a worker thread (at most ``threads`` at once, so a burst of large images neither
blocks the event loop nor takes every core); the result kept in a cache of bounded bytes, keyed by the
image's content and the processor, so the same image in the next turn of a conversation costs a hash.
Fetched bytes are kept by URL for a few minutes too. What comes out (``MediaInputs``): the tensors, one
hash per image (content and processor: the engine's encoder cache key), and, once ``expand`` has seen the
prompt, where each image's tokens are in it.

Every image of a request counts against ``images_per_request_max``, and their bytes against ``request_bytes_max``
as they arrive (``_Budget``: what is in flight, fetched or not yet; 16 URLs of ~20 MiB were fetched at once and
checked only as each completed) and against the tenant's ``tenant_bytes_max`` until the request's images are
processed; a failure names the part it came from (``ImageRef.where``). Threads and fetch connections are shared
by tenant (``fair.FairLimiter``), so one tenant's large or slow images do not hold back another's.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import trio

from ..base.errors import InvalidInput, Overloaded
from ..observe.metrics import counter, gauge
from .config import MediaConfig
from .decode import ImageRefused, decode_image
from .fair import FairLimiter
from ..net.outbound import HostPolicy
from .fetch import Fetcher, FetchFailed, FetchRefused, FetchTimedOut, data_uri_bytes
from .processors import ImageProcessor, ProcessedImage
from .video import (JPEG_FRAMES_FPS, QWEN_FPS, VideoLoading, VideoRefused, decode_container_isolated,
                    decode_jpeg_frames, is_jpeg_frames, jpeg_frames_payload)

URL_CACHE_TTL_S = 300.0  # a fetched URL's bytes are reused this long: an image behind a URL may change


@dataclasses.dataclass(frozen=True, slots=True)
class ImageRef:
    """An image a request names: a URL (http(s), or data:) and where in the request it came from."""

    url: str
    where: str  # the request field, for errors: messages[0].content[1]
    detail: str = "auto"  # OpenAI's; no open model's processor reads it (as vLLM, accepted and left)
    modality = "image"


@dataclasses.dataclass(frozen=True, slots=True)
class VideoRef:
    """A video a request names (vLLM's ``video_url`` part): a URL (http(s), data: with a video file, or
    ``data:video/jpeg;base64,`` followed by frames) and where in the request it came from."""

    url: str
    where: str
    modality = "video"


class MediaError(InvalidInput):
    """An image or a video that cannot be used (its part named in ``param``)."""


@dataclasses.dataclass
class MediaInputs:
    """A request's processed items of one modality (its images, or its videos: ``modality``), in prompt
    order, and where their tokens are once ``expand`` placed them. (``images`` holds either: the field is older
    than videos, and the engines' runtimes read it by that name.)"""

    processor: ImageProcessor
    images: list[ProcessedImage]
    hashes: list[str]
    ranges: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (offset, length) in the prompt ids
    # Each image's encoded bytes as the client sent them (or its URL served them): TensorRT-LLM's engines take these
    # and process them themselves; the others take the processed items. (Empty for videos: no kind takes a file.)
    sources: list[bytes] = dataclasses.field(default_factory=list)

    def pixel_values(self, raw: bool) -> np.ndarray:
        """Every image's pixels in one tensor, rows concatenated (a flat layout) or stacked (one per image): raw
        (uint8, for an engine that normalizes on its device) or rescaled and normalized (float32). Normalized
        here, on the caller's thread, only for an engine unlike the others of its model (prepare was told
        which form they take)."""
        if raw:
            arrays = [image.raw for image in self.images]
        else:
            arrays = [image.normalized if image.normalized is not None else self.processor.normalized(image.raw)
                      for image in self.images]
        if self.processor.flat_pixels_by is not None:
            return np.concatenate(arrays, axis=0)
        return np.stack(arrays)

    def tensors(self) -> dict[str, np.ndarray]:
        """The model's other tensors, one row per image (those the processor lays out flat, like its pixels, each
        image's rows one after the other); with a flat layout, its pixel rows per image too."""
        flat = getattr(self.processor, "flat_tensors", ())
        out = {key: (np.concatenate if key in flat else np.stack)([image.tensors[key] for image in self.images])
               for key in self.images[0].tensors}
        if self.processor.flat_pixels_by is not None:
            out[self.processor.flat_pixels_by] = np.array([image.raw.shape[0] for image in self.images],
                                                          dtype=np.int64)
        return out

    @property
    def nbytes(self) -> int:
        return sum(image.nbytes for image in self.images)

    @property
    def modality(self) -> str:
        """"image", or "video" for a video processor's batch."""
        return getattr(self.processor, "modality", "image")

    def expand(self, ids: "list[int]") -> tuple[list[int], list[int]]:
        """(the prompt's ids with each image's placeholder replaced by its expansion, the same ids for routing):
        the chat template wrote the placeholder once per image, in order. A family whose expansion begins or ends
        with newlines has them joined with the text's as its tokenizer joins them (``joined_newlines``), each
        range then starting at the token holding its first newline, as vLLM places it. The routing ids carry each
        image's hash over its range, so two prompts that differ only in an image share no prefix past it."""
        processor = self.processor
        placeholder = processor.placeholder_id
        expanded: list[int] = []
        ranges: list[tuple[int, int]] = []
        found = 0
        start = 0
        for position, token_id in enumerate(ids):
            if token_id != placeholder:
                continue
            if found >= len(self.images):
                break
            expanded += ids[start:position]
            sequence = processor.expansion(self.images[found])
            ranges.append((len(expanded), len(sequence)))
            expanded += sequence
            found += 1
            start = position + 1
        if found != len(self.images) or placeholder in ids[start:]:
            kind = self.modality
            raise MediaError(f"the chat template placed {ids.count(placeholder)} {kind} placeholders for "
                             f"{len(self.images)} {kind}s: this model's template does not take {kind}s this way",
                             code=f"{kind}_placeholder_mismatch")
        expanded += ids[start:]
        if processor.newline_pieces:
            expanded, ranges = joined_newlines(expanded, ranges, dict(processor.newline_pieces))
        routing = list(expanded)
        for (offset, length), image_hash in zip(ranges, self.hashes):
            routing[offset:offset + length] = _routing_ids(image_hash, length)
        self.ranges = ranges
        return expanded, routing


def expand_batches(ids: "list[int]", batches: "tuple[MediaInputs, ...]") -> tuple[list[int], list[int]]:
    """``MediaInputs.expand`` for a prompt with several modalities (images and videos, each its own placeholder):
    each batch expanded in turn, the ranges of those expanded before moved by what the later ones inserted ahead of
    them; the routing ids from every batch's ranges. Only families that join no newlines take part (their
    expansions are the placeholder repeated): the one with videos, Qwen2-VL, is one."""
    if len(batches) == 1:
        return batches[0].expand(ids)
    if any(batch.processor.newline_pieces for batch in batches):
        raise MediaError("this model's media cannot be mixed in one request", code="mixed_media_not_supported")
    expanded = ids
    for index, batch in enumerate(batches):
        expanded, _ = batch.expand(expanded)
        grown, growths = 0, []  # (where a placeholder stood before this batch, how many tokens it added)
        for offset, length in batch.ranges:
            growths.append((offset - grown, length - 1))
            grown += length - 1
        for earlier in batches[:index]:
            earlier.ranges = [(offset + sum(g for at, g in growths if at < offset), length)
                              for offset, length in earlier.ranges]
    routing = list(expanded)
    for batch in batches:
        for (offset, length), item_hash in zip(batch.ranges, batch.hashes):
            routing[offset:offset + length] = _routing_ids(item_hash, length)
    return expanded, routing


def joined_newlines(ids: "list[int]", ranges: "list[tuple[int, int]]", pieces: "dict[int, int]"
                    ) -> "tuple[list[int], list[tuple[int, int]]]":
    """``ids`` with each run of newline tokens that an expansion begins or ends in written again as the tokenizer
    writes that many newlines (the longest token first, as it matches them), and the ranges moved onto it: from the
    token holding a range's first newline to the one holding its last. ``pieces``: newline token -> newlines. A
    run of the text's own newlines is left as the tokenizer made it, and so is one it has no tokens to write.
    Only the runs at the ranges' edges are visited: a long prompt costs its slices, not a look at every token."""
    by_count = {count: token for token, count in pieces.items()}
    runs: list[tuple[int, int, list[int]]] = []  # (start, end, its tokens written again), in order
    for edge in sorted({offset for offset, _ in ranges} | {offset + length - 1 for offset, length in ranges}):
        if ids[edge] not in pieces or (runs and runs[-1][0] <= edge < runs[-1][1]):
            continue
        start, end = edge, edge + 1
        while start > 0 and ids[start - 1] in pieces:
            start -= 1
        while end < len(ids) and ids[end] in pieces:
            end += 1
        written = _newline_tokens(sum(pieces[token] for token in ids[start:end]), by_count)
        if written is not None:
            runs.append((start, end, written))
    out: list[int] = []
    moved_to: dict[int, tuple[int, int]] = {}  # an old index in a run -> (new index of its first, of its last)
    shifts: list[tuple[int, int]] = []  # (old end of a run, how much it moved what follows)
    previous = 0
    for start, end, written in runs:
        out += ids[previous:start]
        base = len(out)
        starts = [0]  # the newline each new token starts at, within the run
        for token in written:
            starts.append(starts[-1] + pieces[token])
        at = 0
        for old in range(start, end):
            first = base + bisect.bisect_right(starts, at) - 1
            at += pieces[ids[old]]
            moved_to[old] = (first, base + bisect.bisect_right(starts, at - 1) - 1)
        out += written
        shifts.append((end, len(out) - end))
        previous = end
    out += ids[previous:]
    run_ends = [run_end for run_end, _ in shifts]

    def new_index(old: int, which: int) -> int:
        if old in moved_to:
            return moved_to[old][which]
        before = bisect.bisect_right(run_ends, old)
        return old + (shifts[before - 1][1] if before else 0)

    moved = []
    for offset, length in ranges:
        first = new_index(offset, 0)
        moved.append((first, new_index(offset + length - 1, 1) - first + 1))
    return out, moved


def _newline_tokens(count: int, by_count: "dict[int, int]") -> "list[int] | None":
    """``count`` newlines as tokens, the longest that fits first (a tokenizer's added tokens match longest first;
    Gemma's has one token for each run up to 31); None when its tokens cannot write that many."""
    out: list[int] = []
    while count:
        fits = [n for n in by_count if n <= count]
        if not fits:
            return None
        longest = max(fits)
        out.append(by_count[longest])
        count -= longest
    return out


def _routing_ids(image_hash: str, count: int) -> list[int]:
    """Stand-ins for an image's tokens in the KV routing key: from its hash, above any vocabulary."""
    base = int(image_hash[:15], 16)
    return [(1 << 62) + base + i for i in range(count)]


class _Budget:
    """One request's image bytes in flight, and its tenant's: counted as they arrive, given back at the end."""

    def __init__(self, service: "MediaService", tenant: str | None) -> None:
        self.service = service
        self.tenant = tenant
        self.total = 0

    def take(self, count: int, where: str) -> None:
        config = self.service.config
        self.total += count
        held = self.service.tenant_bytes
        held[self.tenant] += count
        if count > 0 and self.total > config.request_bytes_max:
            raise MediaError(f"the request's images and videos are more than {config.request_bytes_max} bytes together",
                             code="images_too_large", param=where)
        if count > 0 and held[self.tenant] > config.tenant_bytes_max:
            raise Overloaded(f"this caller's images in flight are more than {config.tenant_bytes_max} bytes "
                             "(--media-max-tenant-bytes): try again shortly", code="media_busy", retry_after_s=1)

    def close(self) -> None:
        held = self.service.tenant_bytes
        held[self.tenant] -= self.total
        if held[self.tenant] <= 0:
            del held[self.tenant]
        self.total = 0


class _ByteLru:
    """Values kept by key within a byte budget, least recently used out first; entries may expire."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: collections.OrderedDict[Any, tuple[Any, int, float]] = collections.OrderedDict()

    def get(self, key: Any, now: float) -> Any:
        entry = self._entries.get(key)
        if entry is None or entry[2] < now:
            if entry is not None:
                self._drop(key)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def put(self, key: Any, value: Any, size: int, expires_at: float = float("inf")) -> None:
        if size > self.bytes_max // 4:  # one entry never takes more than a quarter of the cache
            return
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (value, size, expires_at)
        self.bytes += size
        while self.bytes > self.bytes_max:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: Any) -> None:
        _, size, _ = self._entries.pop(key)
        self.bytes -= size


class MediaService:
    def __init__(self, config: MediaConfig, fetcher: Fetcher | None = None) -> None:
        self.config = config
        self.fetcher = fetcher or Fetcher(HostPolicy(config.allowed_hosts), config.fetch_timeout_s,
                                          config.redirects_max, config.image_bytes_max,
                                          connections_max=config.fetch_connections)
        self._cache = _ByteLru(config.cache_bytes_max)
        threads = config.threads or max(1, len(os.sched_getaffinity(0)))
        self.threads = FairLimiter(threads, threads, config.tenant_waiting_max, "image decodes")
        self.fetches = FairLimiter(config.fetch_connections, config.fetch_connections_per_tenant,
                                   config.tenant_waiting_max, "image fetches")
        self.tenant_bytes: collections.Counter[str | None] = collections.Counter()  # in flight, by tenant
        self.fetched = 0  # URLs fetched (cache misses)
        self.processed = 0  # images decoded and processed (cache misses)
        self.refused = collections.Counter()  # images refused, by code
        self.process_seconds = 0.0  # thread time spent decoding and processing
        self.loading = VideoLoading(config.video_frames, config.video_fps)  # how videos load unless a request says

    async def aclose(self) -> None:
        await self.fetcher.aclose()

    async def prepare_all(self, batches: "list[tuple[list[Any], Any, int | None]]", normalize: bool,
                          tenant: str | None = None, loading: "VideoLoading | None" = None) -> "list[MediaInputs]":
        """``prepare`` for each of a request's modalities, (refs, processor, items_max) each, one after the other:
        their bytes together within the request's bound (one budget), given back at the end."""
        budget = _Budget(self, tenant)
        try:
            return [await self.prepare(refs, processor, normalize, items_max, tenant, budget, loading)
                    for refs, processor, items_max in batches]
        finally:
            budget.close()

    async def prepare(self, refs: "list[ImageRef] | list[VideoRef]", processor: Any, normalize: bool,
                      images_max: int | None = None, tenant: str | None = None, budget: "_Budget | None" = None,
                      loading: "VideoLoading | None" = None) -> MediaInputs:
        """Every image (or every video) of a request, processed for ``processor``, in order (``normalize``: the
        normalized floats too, for engines that take them); MediaError for the first that fails. ``images_max``:
        the engines' own bound on items of this modality per prompt, when lower than this node's. ``tenant``:
        whose share of the threads, connections and bytes the request takes (None: the open data plane's).
        ``budget``: the request's, when its other modalities share it (``prepare_all`` closes it). ``loading``: how
        its videos are loaded, when the request says (else the node's)."""
        config = self.config
        modality = refs[0].modality
        own = config.images_per_request_max if modality == "image" else config.videos_per_request_max
        bound = own if images_max is None else min(own, images_max)
        if bound == 0:
            raise MediaError(f"this model's engines take no {modality}s (their --limit-mm-per-prompt)",
                             code=f"too_many_{modality}s", param=refs[0].where)
        if len(refs) > bound:
            raise MediaError(f"the request carries {len(refs)} {modality}s; at most {bound}",
                             code=f"too_many_{modality}s", param=refs[bound].where)
        images: list[ProcessedImage | None] = [None] * len(refs)
        hashes: list[str] = [""] * len(refs)
        sources: list[bytes] = [b""] * len(refs)
        failures: list[Exception] = []
        own_budget = budget is None
        budget = budget or _Budget(self, tenant)
        loading = loading or self.loading

        async def one(index: int, nursery: trio.Nursery) -> None:
            try:
                images[index], hashes[index], source = await self._image(refs[index], processor, normalize, budget,
                                                                         loading)
                if modality == "image":  # (a video's file, up to --media-max-video-bytes, is never sent as it came)
                    sources[index] = source
            except Exception as e:
                failures.append(e)
                nursery.cancel_scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                for index in range(len(refs)):
                    nursery.start_soon(one, index, nursery)
        finally:
            if own_budget:
                budget.close()
        if failures:
            raise failures[0]
        if processor.flat_pixels_by is None and len({image.raw.shape for image in images}) > 1:
            # One tensor carries a request's images when each is one entry of it (the contract has no list of
            # them), and an engine would read a padded image's padding as picture (Pixtral's own size each).
            sizes = ", ".join(f"{image.raw.shape[-1]}x{image.raw.shape[-2]}" for image in images)
            raise MediaError(f"this model's images keep their own size ({sizes} here) and the engine takes a "
                             "request's images as one tensor: send images that come out the same size, or one a "
                             "request", code="images_differ_in_size", param=refs[0].where)
        return MediaInputs(processor, images, hashes, sources=sources)

    async def _image(self, ref: "ImageRef | VideoRef", processor: Any, normalize: bool, budget: _Budget,
                     loading: VideoLoading) -> tuple[ProcessedImage, str, bytes]:
        try:
            data = await self._bytes(ref, budget)
        except (FetchRefused, FetchFailed, FetchTimedOut) as e:
            self.refused[e.code or "image_fetch_failed"] += 1
            e.param = ref.where
            raise
        except MediaError as e:
            self.refused[e.code or "images_too_large"] += 1
            raise
        digest = hashlib.blake2b(data, digest_size=32).digest()
        describe = processor.describe()
        if ref.modality == "video":  # the frames taken, and how they came: the same bytes give the same frames
            describe += f":{loading.describe()}:{is_jpeg_frames(ref.url)}"
        image_hash = hashlib.blake2b(digest + describe.encode(), digest_size=32).hexdigest()
        key = (ref.modality, image_hash, normalize)
        now = time.monotonic()
        cached = self._cache.get(key, now)
        if cached is not None:
            return cached, image_hash, data
        started = time.perf_counter()
        try:
            # Abandoned on cancel: a client that left does not wait for its decode (which the limiter still
            # counts until it ends, so abandoned work cannot pile up past the bound).
            processed = await trio.to_thread.run_sync(self._process, data, processor, normalize, ref, loading,
                                                      limiter=self.threads.for_tenant(budget.tenant),
                                                      abandon_on_cancel=True)
        except (ImageRefused, VideoRefused, ValueError) as e:  # not taken here, or a shape the processor refuses
            code = f"invalid_{ref.modality}"
            self.refused[code] += 1
            raise MediaError(f"{ref.where}: {e}", code=code, param=ref.where) from None
        finally:
            self.process_seconds += time.perf_counter() - started
        self.processed += 1
        self._cache.put(key, processed, processed.nbytes)
        return processed, image_hash, data

    def _process(self, data: bytes, processor: Any, normalize: bool, ref: "ImageRef | VideoRef",
                 loading: VideoLoading) -> ProcessedImage:
        config = self.config
        if ref.modality == "image":
            return processor.process(decode_image(data, config.image_pixels_max, processor.size_problem), normalize)
        if is_jpeg_frames(ref.url):
            video = decode_jpeg_frames(data, loading.frames, loading.fps or JPEG_FRAMES_FPS,
                                       config.image_pixels_max, config.video_pixels_max)
        else:  # in a child process: FFmpeg reading a client's file may crash (video.decode_container_isolated)
            video = decode_container_isolated(data, loading.fps or QWEN_FPS, config.image_pixels_max,
                                              config.video_pixels_max, config.video_decode_timeout_s, processor.loader)
        problem = processor.size_problem(video.frames.shape[2], video.frames.shape[1])
        if problem is not None:
            raise VideoRefused(problem)
        return processor.process_decoded(video, normalize)

    async def _bytes(self, ref: "ImageRef | VideoRef", budget: _Budget) -> bytes:
        """The item's bytes, each counted by ``budget`` as it arrives (a fetch's before it ends); a JPEG frame list's
        base64 text as it is (its frames are decoded in the thread)."""
        url = ref.url
        bytes_max = self.config.image_bytes_max if ref.modality == "image" else self.config.video_bytes_max
        if ref.modality == "video" and is_jpeg_frames(url):
            data = jpeg_frames_payload(url)
            if len(data) * 3 // 4 > bytes_max:
                raise MediaError(f"the video is larger than {bytes_max} bytes", code="video_too_large",
                                 param=ref.where)
            budget.take(len(data), ref.where)
            return data
        if url[:5].lower() == "data:":
            data = data_uri_bytes(url, bytes_max, ref.modality)
            budget.take(len(data), ref.where)
            return data
        key = ("url", url)
        now = time.monotonic()
        data = self._cache.get(key, now)
        if data is not None:
            budget.take(len(data), ref.where)
            return data
        data = await self.fetcher.fetch(url, lambda count: budget.take(count, ref.where),
                                        self.fetches.slot(budget.tenant), bytes_max, ref.modality)
        self.fetched += 1
        self._cache.put(key, data, len(data), now + URL_CACHE_TTL_S)
        return data

    def metric_families(self) -> Iterator[Any]:
        yield counter("smg_media_images", "Images fetched over http(s) and images decoded and processed (cache "
                      "misses)", ["step"], [(["fetched"], float(self.fetched)), (["processed"], float(self.processed))])
        yield counter("smg_media_refused", "Images refused, by reason", ["code"],
                      [([code], float(n)) for code, n in sorted(self.refused.items())])
        yield counter("smg_media_cache", "Media cache lookups", ["result"],
                      [(["hit"], float(self._cache.hits)), (["miss"], float(self._cache.misses))])
        yield gauge("smg_media_cache_bytes", "Bytes the media cache holds", [], [([], float(self._cache.bytes))])
        yield counter("smg_media_process_seconds", "Thread time spent decoding and processing images", [],
                      [([], self.process_seconds)])
        yield gauge("smg_media_slots_in_use", "Media threads and fetch connections in use", ["pool"],
                    [(["threads"], float(self.threads.in_use)), (["fetches"], float(self.fetches.in_use))])
        yield gauge("smg_media_waiting", "Image decodes and fetches waiting for a slot", ["pool"],
                    [(["threads"], float(self.threads.waiting)), (["fetches"], float(self.fetches.waiting))])
        yield gauge("smg_media_bytes_in_flight", "Bytes of requests' images fetched and not yet processed", [],
                    [([], float(sum(self.tenant_bytes.values())))])


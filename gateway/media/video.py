"""Videos, from a client's bytes to what a Qwen2-VL, Qwen2.5-VL or Qwen3-VL engine takes, as vLLM's own server
computes them.

vLLM's server reads a video two ways (vllm/multimodal/media/video.py, 0.32): ``data:video/jpeg;base64,`` followed
by frames, each a base64 JPEG, separated by commas (the first ``frames`` of them are taken, each decoded as an
image: ``decode_jpeg_frames``); or a container (MP4, WebM, AVI, ...), decoded by OpenCV's FFmpeg, its default
backend (``decode_container``): the frame count and rate from the container (the count checked against the frames
really there, as vLLM checks it), the frames the loader vLLM picks for the model's video processor samples (for
Qwen2VLVideoProcessor its "qwen2_vl" loader: two frames a second by default, ``qwen2_vl_indices``; for Qwen3-VL's
its "qwen3_vl" loader, ``qwen3_vl_indices``), each converted from OpenCV's BGR to RGB. OpenCV
(``opencv-python-headless``, the ``video`` extra) is imported only when a container arrives: without it a container
is refused with a 400 saying so, and JPEG frames still work.

Then Qwen2-VL's video processor (transformers' Qwen2VLVideoProcessor, torchvision-backed, which vLLM's server runs):
every frame resized to one size (``smart_resize`` of the first frame's, each side a multiple of patch x merge),
rescaled and normalized as its images are, the frame count padded to a multiple of temporal_patch_size by
repeating the last frame, cut into patches of temporal_patch_size frames ordered by time, then merge window; grid
(t, h, w); t*h*w / merge^2 ``<|video_pad|>`` tokens. Its numbers come from ``video_preprocessor_config.json`` when
the engine ships one, else from ``preprocessor_config.json`` (what transformers falls back to), with the video
processor's own defaults (128 x 28 x 28 to 768 x 28 x 28 pixels a frame) where neither says. Qwen3-VL's
(``Qwen3VideoProcessor``) bounds the pixels of the whole video and writes each temporal patch's time into the
prompt.

Bounds, each checked before the memory it guards is taken: the frames' sizes from the container's header (or each
JPEG's) against ``frame_pixels_max`` and the sampled frames together against ``pixels_max``; a frame of another
size than the first is refused (one tensor carries a video). No I/O; run in the media threads.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .decode import ImageRefused, decode_image
from .processors import (IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, ProcessedImage, ProcessorConfigError,
                         QwenVisionProcessor, _number, _token_id, aspect_problem, resized, smart_resize)

JPEG_FRAMES_TYPE = "video/jpeg"  # vLLM's media type for a list of JPEG frames in one data: URI
JPEG_FRAMES_FPS = 1.0  # the rate vLLM's loader says a JPEG frame list was taken at, without a media-io fps
# Qwen2VLVideoProcessor's own size bounds (pixels a frame), where neither config file gives one.
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28
MAX_VIDEO_TOKENS = 128_000  # its max_video_tokens: the total budget cap_pixels_per_frame shares between frames
# vLLM's "qwen2_vl" loader (vllm/multimodal/video.py, 0.32): frames a second by default (its load_bytes' fps, which
# --media-io-kwargs may change on the engine: --media-video-fps here), the most it takes, at least, and per patch.
QWEN_FPS = 2.0
QWEN_FPS_MAX = 30
QWEN_MIN_FRAMES = 4
QWEN_MAX_FRAMES = 768
QWEN_TEMPORAL = 2
QWEN3_UNKNOWN_FPS = 24.0  # the source rate vLLM's qwen3_vl loader and transformers take for a file that says none
# Every frame up to the last one sampled is decoded (as vLLM's reader does): a file may say it has this many at most
# (an hour and 12 minutes at 30 a second); past GRAB_FAILURES_MAX frames in a row that cannot be read, it has ended.
# A video file's child decoder: its address space (numpy, OpenCV's and FFmpeg's libraries and threads, and the
# frames: the sampled frames are at most --media-max-video-pixels, 200 MB of RGB by default); its environment: the
# log levels (FFmpeg's AV_LOG_QUIET, OpenCV's silent: a broken file would write thousands of lines into the node's
# log), and glibc's malloc arenas bounded (each reserves 64 MiB of address space and a thread may make one: on a
# machine of many cores FFmpeg's decoding threads alone could reserve the whole bound).
DECODER_MEMORY_BYTES = 4 << 30
QUIET_DECODERS = {"OPENCV_FFMPEG_LOGLEVEL": "-8", "OPENCV_LOG_LEVEL": "SILENT", "MALLOC_ARENA_MAX": "4"}
FRAMES_MAX = 1 << 17
GRAB_FAILURES_MAX = 64
TORCH_ARANGE_LANES = 8  # floats a vector of torch's CPU arange kernel computes from one base (its AVX2 width)


class VideoRefused(ValueError):
    """Bytes that are not a video this node takes (unreadable, too large, frames of different sizes)."""


# -- decoding ----------------------------------------------------------------------------------------------------

def is_jpeg_frames(url: str) -> bool:
    """Whether a video URL is vLLM's ``data:video/jpeg;base64,`` list of frames."""
    head = "data:" + JPEG_FRAMES_TYPE + ";base64,"
    return url[:len(head)].lower() == head


def jpeg_frames_payload(url: str) -> bytes:
    """The comma-separated base64 frames of a ``data:video/jpeg;base64,`` URL, as bytes (decoded in the thread)."""
    return url.partition(",")[2].encode("ascii", "replace")


@dataclasses.dataclass(frozen=True)
class DecodedVideo:
    frames: np.ndarray  # (T, H, W, 3) uint8 RGB
    # Frames a second of what was taken (transformers' VideoMetadata.sampled_fps of the metadata vLLM's loader
    # gives: frames taken / frames in the file x the file's rate): Qwen2.5-VL's positions read it.
    sampled_fps: float
    # The rest of that metadata, which Qwen3-VL's timestamps read: the frames' places in the source, its frame
    # count and rate (as the file says it: 0 when it does not), and whether the loader took every frame (vLLM's
    # do_sample_frames: the processor then samples them itself). A JPEG frame list: every frame, at the list's rate.
    indices: "tuple[int, ...]" = ()
    total_frames: int = 0
    source_fps: float = 0.0
    every_frame_taken: bool = False


# vLLM's VideoMediaIO num_frames when neither its --media-io-kwargs nor a request says one.
VIDEO_FRAMES_DEFAULT = 32
VIDEO_FPS_MAX = 1000.0  # a request's media_io fps at most (files are sampled at 30 a second at most anyway)
LOADING_KEYS = ("num_frames", "fps")  # the media_io_kwargs a request's videos take here


@dataclasses.dataclass(frozen=True)
class VideoLoading:
    """How a request's videos are loaded (vLLM's video media_io_kwargs, the node's --media-video-frames and
    --media-video-fps, a request's own over them): ``frames`` taken from a JPEG frame list, its first ones (None:
    every one; vLLM's num_frames, -1 for all; its Qwen-VL loaders ignore it for a file); ``fps``, the rate a file is
    sampled at and a JPEG frame list is said to be taken at (None: the loader's own, 2 a second for a file, 1 for a
    frame list)."""

    frames: "int | None" = VIDEO_FRAMES_DEFAULT
    fps: "float | None" = None

    def with_request(self, kwargs: "dict[str, Any]") -> "VideoLoading":
        """These settings with a request's media_io_kwargs over them, as vLLM's VideoMediaIO.merge_kwargs merges
        them: a request that sets one of num_frames and fps leaves the other to the loader's default, not the
        node's (the two interact). ValueError naming what is not taken here."""
        other = [key for key in kwargs if key != "video"]
        if other:
            raise ValueError(f"{', '.join(map(repr, other))}: only a video's loading is set per request here")
        video = kwargs.get("video")
        if not isinstance(video, dict):
            raise ValueError("'video' must be an object")
        unknown = [key for key in video if key not in LOADING_KEYS]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not applied "
                             f"to videos here (these are: {', '.join(LOADING_KEYS)})")
        frames, fps = self.frames, self.fps
        if "num_frames" in video:
            frames = video["num_frames"]
            if type(frames) is not int or not (frames == -1 or frames >= 1):
                raise ValueError("'num_frames' must be a positive integer, or -1 for every frame")
            frames = None if frames == -1 else frames
            if "fps" not in video:
                fps = None
        if "fps" in video:
            fps = video["fps"]
            if type(fps) not in (int, float) or not 0 < fps <= VIDEO_FPS_MAX:
                raise ValueError(f"'fps' must be a number above 0 and at most {VIDEO_FPS_MAX:g}")
            fps = float(fps)
            if "num_frames" not in video:
                frames = VIDEO_FRAMES_DEFAULT
        return VideoLoading(frames, fps)

    def describe(self) -> str:
        return f"{self.frames}:{self.fps}"


def decode_jpeg_frames(payload: bytes, frames: "int | None", fps: float, frame_pixels_max: int, pixels_max: int
                       ) -> DecodedVideo:
    """The first ``frames`` frames of a JPEG frame list (vLLM takes those, not a sample; None: every one), each
    decoded as an image is (EXIF orientation, RGB); ``fps``: the rate vLLM's loader says they were taken at (its
    media-io fps, 1 by default)."""
    if not payload:
        raise VideoRefused("the video has no frames")
    parts = payload.split(b",") if frames is None else payload.split(b",", frames)[:frames]
    out: list[np.ndarray] = []
    for index, part in enumerate(parts):
        try:
            data = base64.b64decode(part, validate=True)
        except (binascii.Error, ValueError):
            raise VideoRefused(f"frame {index} is not valid base64") from None
        try:
            image = decode_image(data, frame_pixels_max)
        except ImageRefused as e:
            raise VideoRefused(f"frame {index}: {e}") from None
        if out and image.size != (out[0].shape[1], out[0].shape[0]):
            raise VideoRefused(f"frame {index} is {image.size[0]} x {image.size[1]}, the first "
                               f"{out[0].shape[1]} x {out[0].shape[0]}: a video's frames are one size")
        if (index + 1) * image.size[0] * image.size[1] > pixels_max:
            raise VideoRefused(f"the video's frames are more than {pixels_max} pixels together")
        out.append(np.asarray(image))
    return DecodedVideo(np.stack(out), fps, tuple(range(len(out))), len(out), fps)


def _opencv() -> Any:
    try:
        import cv2
    except ImportError:
        raise VideoRefused("this node decodes no video files (opencv-python-headless is not installed: pip install "
                           "'smg-node[video]'); send the frames as data:video/jpeg;base64,<frame>,<frame>,...") \
            from None
    return cv2


def qwen2_vl_indices(total: int, source_fps: float, fps: float) -> "list[int]":
    """The frames vLLM's "qwen2_vl" loader takes (the one it picks for Qwen2VLVideoProcessor; a port of the
    processor's own fps sampling): ``fps`` a second of the video's length (at most 30), at least QWEN_MIN_FRAMES, at
    most QWEN_MAX_FRAMES and the video's own, rounded down to whole temporal patches; at the positions torch's
    float32 ``arange(0, total, total / n)`` gives, truncated (``torch_arange_truncated``), clamped to the last
    frame."""
    if source_fps <= 0:
        raise VideoRefused("the video's frame rate is unknown (variable or not said): Qwen2-VL's frames are sampled "
                           "by time")
    most = math.floor(min(QWEN_MAX_FRAMES, total) / QWEN_TEMPORAL) * QWEN_TEMPORAL
    wanted = total / source_fps * min(fps, QWEN_FPS_MAX)
    count = math.floor(min(max(wanted, QWEN_MIN_FRAMES), most, total) / QWEN_TEMPORAL) * QWEN_TEMPORAL
    if count < 1:
        raise VideoRefused(f"the video has {total} frame(s); Qwen2-VL takes at least {QWEN_TEMPORAL}")
    return np.minimum(torch_arange_truncated(total, count), total - 1).tolist()


def qwen3_vl_indices(total: int, source_fps: float, fps: float) -> "list[int]":
    """The frames vLLM's "qwen3_vl" loader takes (Qwen3VLVideoBackend, a port of Qwen3VLVideoProcessor.sample_frames):
    ``fps`` a second of the video's length (at most 30; a file that says no rate is taken as 24 a second, as both
    assume), at least QWEN_MIN_FRAMES, at most QWEN_MAX_FRAMES and the video's own, spread evenly from the first
    frame to the last (numpy's linspace, rounded half to even)."""
    count = int(total / (source_fps if source_fps > 0 else QWEN3_UNKNOWN_FPS) * min(fps, QWEN_FPS_MAX))
    count = min(max(count, QWEN_MIN_FRAMES), QWEN_MAX_FRAMES, total)
    return np.linspace(0, total - 1, count).round().astype(int).tolist()


# vLLM's loader for each video processor this node has, by the name vLLM registers it under.
LOADERS: "dict[str, Callable[[int, float, float], list[int]]]" = {"qwen2_vl": qwen2_vl_indices,
                                                                  "qwen3_vl": qwen3_vl_indices}


def torch_arange_truncated(total: int, count: int) -> np.ndarray:
    """``torch.arange(0, total, total / count).int()`` as torch's CPU kernel computes it (float32 output, double
    arithmetic): in vectors of TORCH_ARANGE_LANES values, two a turn, each vector's first value the float32 of
    ``step * index`` and the others that base plus k steps in double, rounded to float32; what is left after the
    last whole turn one value at a time, ``step * index`` rounded. Held equal to torch 2.13 on 830,000 (total, count)
    pairs; the plain formula, or 16 lanes, is off by one on about 1 pair in 250."""
    step = total / count
    size = math.ceil(total / step)
    positions = np.empty(size, dtype=np.float32)
    lane = np.arange(TORCH_ARANGE_LANES, dtype=np.float64) * step
    whole = size - size % (2 * TORCH_ARANGE_LANES)
    for start in range(0, whole, TORCH_ARANGE_LANES):
        positions[start:start + TORCH_ARANGE_LANES] = (float(np.float32(step * start)) + lane).astype(np.float32)
    for index in range(whole, size):
        positions[index] = np.float32(step * index)
    return positions.astype(np.int64)


def decode_container(data: bytes, sample: "Callable[[int, float], list[int]]", frame_pixels_max: int,
                     pixels_max: int) -> DecodedVideo:
    """The frames ``sample(frame count, frames a second)`` picks from a video file, read as vLLM's OpenCV decoder
    reads them."""
    cv2 = _opencv()
    stream = io.BytesIO(data)  # held until the capture is released: OpenCV keeps no reference to it
    capture = cv2.VideoCapture(stream, _stream_backend(cv2), [])
    try:
        if not capture.isOpened():
            raise VideoRefused("not a video this node can read")
        width, height = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)), int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
        if width < 1 or height < 1 or width * height > frame_pixels_max:
            raise VideoRefused(f"the video's frames are {width} x {height} pixels; at most {frame_pixels_max} "
                               "pixels a frame are taken")
        total = _frame_count(cv2, capture)
        source_fps = float(capture.get(cv2.CAP_PROP_FPS))
        if total > FRAMES_MAX:
            raise VideoRefused(f"the video has {total} frames; at most {FRAMES_MAX} are read")
        indices = sorted(set(sample(total, source_fps))) if total > 0 else []
        if not indices:
            raise VideoRefused("the video has no frames")
        if len(indices) * width * height > pixels_max:
            raise VideoRefused(f"{len(indices)} frames of {width} x {height} are more than {pixels_max} pixels")
        wanted = set(indices)
        out = np.empty((len(indices), height, width, 3), dtype=np.uint8)
        read = failed = 0
        taken: list[int] = []  # the frames really read (vLLM's valid_frame_indices)
        for index in range(indices[-1] + 1):
            if not capture.grab():
                # vLLM skips a frame that cannot be grabbed (and goes on to the count the header gave); a run of
                # them is the stream's end: stopped there, or a header claiming a billion frames costs a billion
                # calls.
                failed += 1
                if failed >= GRAB_FAILURES_MAX:
                    break
                continue
            failed = 0
            if index in wanted:
                ok, frame = capture.retrieve()
                if ok and frame is not None and frame.shape == (height, width, 3):
                    out[read] = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
                    taken.append(index)
                    read += 1
        if read == 0:
            raise VideoRefused("no frame of the video could be decoded")
        return DecodedVideo(out[:read], read / total * source_fps, tuple(taken), total, source_fps, read == total)
    finally:
        capture.release()
        del stream


def _stream_backend(cv2: Any) -> Any:
    """The first of OpenCV's backends that read from a buffer (its FFmpeg, built in), as vLLM picks it."""
    registry = cv2.videoio_registry
    for backend in registry.getStreamBufferedBackends():
        if not registry.hasBackend(backend):
            continue
        if not registry.isBackendBuiltIn(backend):
            _, abi, api = registry.getStreamBufferedBackendPluginVersion(backend)
            if abi < 1 or (abi == 1 and api < 2):
                continue
        return backend
    raise VideoRefused("this node's OpenCV reads no video from memory")


def _frame_count(cv2: Any, capture: Any) -> int:
    """The container's frame count, corrected as vLLM corrects it: a header that claims more frames than can be
    shown (seeking to the end says how many there are) is not believed."""
    total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    if total > 0 and capture.set(cv2.CAP_PROP_POS_AVI_RATIO, 1.0):
        visible = int(capture.get(cv2.CAP_PROP_POS_FRAMES))
        at_end = not capture.grab()
        capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
        if at_end and 0 < visible < total - 1:
            total = visible
    return max(total, 0)


# -- decoding a file apart -------------------------------------------------------------------------------------------

def decode_container_isolated(data: bytes, fps: float, frame_pixels_max: int, pixels_max: int, timeout_s: float,
                              loader: str = "qwen2_vl") -> DecodedVideo:
    """``decode_container`` with the sampling of vLLM's ``loader`` (``LOADERS``: "qwen2_vl", "qwen3_vl") at ``fps``,
    run in a child process of its own: FFmpeg's demuxers and decoders are native code reading a client's bytes, and a
    broken file was seen to crash OpenCV's reader (a 16 KB AVI with a few bytes changed: a segmentation fault, in
    vLLM's own server too). Here it costs the child, not the node: a child that dies, runs past ``timeout_s`` or past
    DECODER_MEMORY_BYTES is a VideoRefused. The child writes a JSON header (the frames' shape, rate and places, or why
    it refused) and the frames."""
    env = {**os.environ, **QUIET_DECODERS}
    try:
        done = subprocess.run([sys.executable, "-m", "gateway.media.video", repr(float(fps)), str(frame_pixels_max),
                               str(pixels_max), repr(float(timeout_s)), loader], input=data, capture_output=True,
                              timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise VideoRefused(f"the video was not decoded within {timeout_s:g} s") from None
    out = done.stdout
    if done.returncode != 0 or len(out) < 4:
        ended = f"signal {-done.returncode}" if done.returncode < 0 else f"status {done.returncode}"
        raise VideoRefused(f"the video could not be decoded (its decoder ended with {ended})")
    size = int.from_bytes(out[:4], "little")
    header = json.loads(out[4:4 + size])
    if "refused" in header:
        raise VideoRefused(header["refused"])
    shape = tuple(header["shape"])
    frames = np.frombuffer(out, dtype=np.uint8, offset=4 + size)
    if frames.size != math.prod(shape):
        raise VideoRefused("the video's decoder answered a short read")
    return DecodedVideo(frames.reshape(shape), float(header["sampled_fps"]), tuple(header["indices"]),
                        int(header["total_frames"]), float(header["source_fps"]), bool(header["every_frame_taken"]))


def _decode_in_this_child() -> None:
    """The child's side of ``decode_container_isolated``: its bounds set on itself first (memory, CPU seconds),
    the file on stdin, the answer on stdout."""
    import resource
    fps, frame_pixels_max, pixels_max, timeout_s = (float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                                    float(sys.argv[4]))
    sample = LOADERS[sys.argv[5]]
    resource.setrlimit(resource.RLIMIT_AS, (DECODER_MEMORY_BYTES, DECODER_MEMORY_BYTES))
    cpu_s = math.ceil(timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    data = sys.stdin.buffer.read()
    try:
        video = decode_container(data, lambda total, source_fps: sample(total, source_fps, fps), frame_pixels_max,
                                 pixels_max)
        header: dict[str, Any] = {"shape": list(video.frames.shape), "sampled_fps": video.sampled_fps,
                                  "indices": list(video.indices), "total_frames": video.total_frames,
                                  "source_fps": video.source_fps, "every_frame_taken": video.every_frame_taken}
        body = video.frames.tobytes()
    except VideoRefused as e:
        header, body = {"refused": str(e)}, b""
    encoded = json.dumps(header).encode()
    sys.stdout.buffer.write(len(encoded).to_bytes(4, "little") + encoded)
    sys.stdout.buffer.write(body)
    sys.stdout.buffer.flush()


# -- the Qwen-VL video processors ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class QwenVideoProcessor(QwenVisionProcessor):
    """Qwen2-VL's video processor (see the module's docstring): its image processor's numbers and normalization, its
    own size defaults and a frame budget; a video's frames in, its patches, grid and token count out (a
    ProcessedImage: the service keeps, hashes and caches videos as it does images)."""

    min_pixels: int = VIDEO_MIN_PIXELS
    max_pixels: int = VIDEO_MAX_PIXELS
    cap_pixels_per_frame: bool = False  # transformers 5.19's default (qwen-vl-utils' total budget when true)
    # Qwen2.5-VL's: each video's seconds per temporal step (second_per_grid_ts: temporal_patch_size / the rate its
    # frames were taken at), which its M-RoPE positions read on the CPU.
    seconds_per_step: bool = False
    modality = "video"
    loader = "qwen2_vl"  # vLLM's loader of its frames (LOADERS)
    flat_pixels_by = "patches_per_video"
    placeholder_token = "<|video_pad|>"  # written once per video by the template, repeated per token

    @property
    def cpu_tensors(self) -> "tuple[str, ...]":  # type: ignore[override]
        return ("video_grid_thw", "second_per_grid_ts") if self.seconds_per_step else ("video_grid_thw",)

    @classmethod
    def from_files(cls, files: "dict[str, dict[str, Any]]", token_to_id: Callable[[str], "int | None"],
                   reference: str = "torchvision") -> "QwenVideoProcessor":
        """From the model's video_preprocessor_config.json, or its preprocessor_config.json without one."""
        config = files.get("video_preprocessor_config.json") or files.get("preprocessor_config.json") or {}
        return dataclasses.replace(cls.from_config(config, token_to_id,
                                                   cap_pixels_per_frame=config.get("cap_pixels_per_frame") is True),
                                   reference=reference)

    def describe(self) -> str:
        return f"video:{super().describe()}:{self.cap_pixels_per_frame}:{self.seconds_per_step}"

    def frame_size(self, frames: int, height: int, width: int) -> "tuple[int, int]":
        """(height, width) every frame is resized to (Qwen2VLVideoProcessor.resize)."""
        factor = self.patch_size * self.merge_size
        max_pixels = self.max_pixels
        if self.cap_pixels_per_frame:
            total_pixels = int(MAX_VIDEO_TOKENS * factor * factor * 0.9)
            max_pixels = max(min(max_pixels, total_pixels * self.temporal_patch_size // frames),
                             int(self.min_pixels * 1.05))
        return smart_resize(height, width, factor, self.min_pixels, max_pixels)

    def process_decoded(self, video: DecodedVideo, normalize: bool) -> ProcessedImage:
        return self.process(video.frames, normalize, video.sampled_fps)

    def process(self, video: np.ndarray, normalize: bool, sampled_fps: float = 1.0) -> ProcessedImage:
        """``video``: (T, H, W, 3) uint8 RGB frames, taken at ``sampled_fps`` (DecodedVideo)."""
        from PIL import Image
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        count, height, width = video.shape[:3]
        h, w = self.frame_size(count, height, width)
        frames = np.stack([resized(Image.fromarray(frame), w, h, self.resample, self.reference).transpose(2, 0, 1)
                           for frame in video])  # (T, C, h, w)
        if count % t:
            frames = np.concatenate([frames, np.repeat(frames[-1:], t - count % t, axis=0)])
        gt, gh, gw = frames.shape[0] // t, h // p, w // p
        channels = frames.shape[1]
        # (time block, frame in block, channel, merge row, row in window, pixel row, merge col, col in window,
        # pixel col) -> patches by time block, merge window (row-major), place in window; each patch channel, frame,
        # pixel row, pixel column (Qwen2VLVideoProcessor.patchify).
        blocks = frames.reshape(gt, t, channels, gh // m, m, p, gw // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        raw = np.ascontiguousarray(blocks.reshape(gt * gh * gw, channels * t * p * p))
        tensors = {"video_grid_thw": np.array([gt, gh, gw], dtype=np.int64)}
        if self.seconds_per_step:  # Qwen2_5_VLProcessor's, a Python float made a float32 tensor
            tensors["second_per_grid_ts"] = np.array(t / sampled_fps, dtype=np.float32)
        return ProcessedImage(raw, tensors, gt * gh * gw // (m * m), self.normalized(raw) if normalize else None)


def qwen3_smart_resize(frames: int, height: int, width: int, temporal: int, factor: int, min_pixels: int,
                       max_pixels: int) -> "tuple[int, int]":
    """Qwen3-VL's video frame size (its video processor's smart_resize): as Qwen2-VL's, the pixel bounds over the
    whole video (frames rounded to whole temporal patches) rather than a frame; a side shorter than ``factor``
    scaled up first. ValueError for fewer frames than a temporal patch or past 200:1."""
    if frames < temporal:
        raise ValueError(f"the video has {frames} frame(s); Qwen3-VL takes at least {temporal}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    problem = aspect_problem(height, width)
    if problem is not None:
        raise ValueError(problem)
    h, w = round(height / factor) * factor, round(width / factor) * factor
    t = round(frames / temporal) * temporal
    if t * h * w > max_pixels:
        shrink = math.sqrt(frames * height * width / max_pixels)
        h = max(factor, math.floor(height / shrink / factor) * factor)
        w = max(factor, math.floor(width / shrink / factor) * factor)
    elif t * h * w < min_pixels:
        grow = math.sqrt(min_pixels / (frames * height * width))
        h, w = math.ceil(height * grow / factor) * factor, math.ceil(width * grow / factor) * factor
    return h, w


def frame_group_seconds(indices: "Sequence[int]", source_fps: float, temporal: int) -> "list[float]":
    """Each temporal patch's time (Qwen3VLProcessor._calculate_timestamps): the frames' indices padded to whole
    patches with the last one, each over the source's rate, the mean of a patch's first and last."""
    padded = list(indices) + [indices[-1]] * (-len(indices) % temporal)
    seconds = [index / source_fps for index in padded]
    return [(seconds[i] + seconds[i + temporal - 1]) / 2 for i in range(0, len(seconds), temporal)]


@dataclasses.dataclass(frozen=True)
class Qwen3VideoProcessor(QwenVideoProcessor):
    """Qwen3-VL's video processor (transformers' Qwen3VLVideoProcessor, as vLLM's server runs it): Qwen2-VL's
    patches, grid and normalization; its own frame size (``qwen3_smart_resize``: the pixel bounds over the whole
    video), defaults (ImageNet's 0.5 mean and deviation, 128 to 768 patches of 32 x 32 pixels in all) and per-frame
    cap; and its prompt (Qwen3VLProcessor, vLLM's get_video_repl): the placeholder replaced, for each temporal
    patch, by its time as text ("<1.5 seconds>", tokenized on its own), then <|vision_start|>, its tokens and
    <|vision_end|> (``prompt_ids``, made here). The frames: those vLLM's "qwen3_vl" loader took, or, when it took
    every frame of a file, the processor's own sample of them at its ``fps`` (vLLM's do_sample_frames); the times
    from their indices in the source and its rate (24 a second when a file says none). The pixel bounds of
    mm_processor_kwargs (``with_request_kwargs``) are over the whole video here, as vLLM folds them into this
    processor's ``size``."""

    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 768 * 32 * 32
    mean: "tuple[float, ...]" = IMAGENET_STANDARD_MEAN
    std: "tuple[float, ...]" = IMAGENET_STANDARD_STD
    fps: float = QWEN_FPS  # the processor's own rate, when it samples the frames itself
    min_frames: int = QWEN_MIN_FRAMES
    max_frames: int = QWEN_MAX_FRAMES
    max_video_tokens: int = 768  # the per-frame token ceiling of cap_pixels_per_frame
    vision_start_id: int = -1
    vision_end_id: int = -1
    # The tokenizer's plain encode of a timestamp's text (no special tokens added), as vLLM tokenizes it.
    encode_text: "Callable[[str], list[int]] | None" = dataclasses.field(default=None, compare=False)
    partial_size: bool = True
    family = "qwen3_vl"
    loader = "qwen3_vl"
    @classmethod
    def from_files(cls, files: "dict[str, dict[str, Any]]", token_to_id: Callable[[str], "int | None"],
                   reference: str = "torchvision", encode_text: "Callable[[str], list[int]] | None" = None
                   ) -> "Qwen3VideoProcessor":
        if encode_text is None:
            raise ProcessorConfigError("Qwen3-VL's video timestamps need the model's tokenizer")
        config = files.get("video_preprocessor_config.json") or files.get("preprocessor_config.json") or {}
        defaults = {"image_mean": list(IMAGENET_STANDARD_MEAN), "image_std": list(IMAGENET_STANDARD_STD),
                    "patch_size": 16, "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}}
        config = {**defaults, **config}
        processor = cls.from_config(
            config, token_to_id, cap_pixels_per_frame=config.get("cap_pixels_per_frame") is True,
            fps=_number(config, "fps", QWEN_FPS), min_frames=_number(config, "min_frames", QWEN_MIN_FRAMES, (int,)),
            max_frames=_number(config, "max_frames", QWEN_MAX_FRAMES, (int,)),
            max_video_tokens=_number(config, "max_video_tokens", 768, (int,)),
            vision_start_id=_token_id(token_to_id, "<|vision_start|>"),
            vision_end_id=_token_id(token_to_id, "<|vision_end|>"), encode_text=encode_text)
        if not (processor.fps > 0 and 1 <= processor.min_frames <= processor.max_frames):
            raise ProcessorConfigError(f"video_preprocessor_config.json: unusable frame sampling {processor}")
        return dataclasses.replace(processor, reference=reference)

    def describe(self) -> str:
        return f"{super().describe()}:{self.fps}:{self.min_frames}:{self.max_frames}:{self.max_video_tokens}"

    def frame_size(self, frames: int, height: int, width: int) -> "tuple[int, int]":
        """(height, width) of every frame (Qwen3VLVideoProcessor.resize: its own per-frame cap, then
        ``qwen3_smart_resize``)."""
        factor = self.patch_size * self.merge_size
        max_pixels = self.max_pixels
        if self.cap_pixels_per_frame:
            per_frame = max(min(self.max_video_tokens * factor * factor, self.max_pixels // frames),
                            int(self.min_pixels * 1.05))
            max_pixels = per_frame * frames
        return qwen3_smart_resize(frames, height, width, self.temporal_patch_size, factor, self.min_pixels,
                                  max_pixels)

    def process_decoded(self, video: DecodedVideo, normalize: bool) -> ProcessedImage:
        frames, indices = video.frames, video.indices
        source_fps = video.source_fps if video.source_fps > 0 else QWEN3_UNKNOWN_FPS
        if video.every_frame_taken:  # the processor samples them (Qwen3VLVideoProcessor.sample_frames)
            count = int(video.total_frames / source_fps * self.fps)
            count = min(max(count, self.min_frames), self.max_frames, video.total_frames)
            picked = np.linspace(0, video.total_frames - 1, count).round().astype(int)
            frames, indices = frames[picked], tuple(picked.tolist())
        processed = self.process(frames, normalize)
        seconds = frame_group_seconds(indices, source_fps, self.temporal_patch_size)
        per_group = processed.tokens // len(seconds)
        assert self.encode_text is not None  # from_files refuses without it
        prompt: list[int] = []
        for second in seconds:
            prompt += self.encode_text(f"<{second:.1f} seconds>")
            prompt.append(self.vision_start_id)
            prompt += [self.placeholder_id] * per_group
            prompt.append(self.vision_end_id)
        return dataclasses.replace(processed, prompt_ids=tuple(prompt))

    def expansion(self, image: ProcessedImage) -> "list[int]":
        return list(image.prompt_ids)


# Model types whose videos this node processes (config.json's model_type): Qwen2-VL, Qwen2.5-VL (the same
# processor and loader in vLLM, and the seconds per temporal step) and Qwen3-VL (its own, timestamps in the prompt).
VIDEO_MODEL_TYPES: "dict[str, Callable[..., QwenVideoProcessor]]" = {
    "qwen2_vl": lambda files, token_to_id, reference, encode_text=None: QwenVideoProcessor.from_files(
        files, token_to_id, reference),
    "qwen2_5_vl": lambda files, token_to_id, reference, encode_text=None: dataclasses.replace(
        QwenVideoProcessor.from_files(files, token_to_id, reference), seconds_per_step=True),
    "qwen3_vl": Qwen3VideoProcessor.from_files,
    "qwen3_vl_moe": Qwen3VideoProcessor.from_files,
}


def video_processor(files: "dict[str, dict[str, Any]]", token_to_id: Callable[[str], "int | None"],
                    reference: str = "torchvision", encode_text: "Callable[[str], list[int]] | None" = None
                    ) -> "QwenVideoProcessor | None":
    """The video processor a model's files call for, None when this node processes no videos for it;
    ``encode_text``: the model's tokenizer, for a family that writes text into a video's prompt (Qwen3-VL)."""
    make = VIDEO_MODEL_TYPES.get((files.get("config.json") or {}).get("model_type"))
    return make(files, token_to_id, reference, encode_text) if make is not None else None


if __name__ == "__main__":  # decode_container_isolated's child
    _decode_in_this_child()

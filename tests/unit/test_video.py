"""Videos in the gateway without an engine (gateway/media/video.py): Qwen2-VL's video processor equal to the bit to
transformers' Qwen2VLVideoProcessor (digests made with torch: tests/support/torchvision_goldens.py), the frames taken
as vLLM's loaders take them (the first of a JPEG frame list; a file's sampled by time as vLLM's Qwen2-VL loader
samples them, held to a digest of its own indices, decoded by OpenCV), each bound
checked before the memory it guards, a prompt with images and videos expanded, and the two batches a vLLM request
carries."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gateway.media.config import MediaConfig
from gateway.media.processors import ProcessedImage, ProcessorConfigError, QwenVisionProcessor
from gateway.media.service import ImageRef, MediaError, MediaInputs, MediaService, VideoRef, expand_batches
from gateway.media.video import (DecodedVideo, Qwen3VideoProcessor, QwenVideoProcessor, VideoRefused,
                                 decode_container, decode_container_isolated, decode_jpeg_frames,
                                 frame_group_seconds, is_jpeg_frames, jpeg_frames_payload, qwen2_vl_indices,
                                 qwen3_vl_indices, torch_arange_truncated, video_processor)
from gateway.tokenizer.bundled import default_tokenizer_dir
from tests.support.torchvision_goldens import (ARANGE_CASES, GOLDENS, QWEN3_VIDEO_CASES, VIDEO_CASES,
                                               VIDEO_INDEX_CASES, digest, image, index_digest, prompt_digest,
                                               qwen3_video, video_frames)

EXPECTED = json.loads(GOLDENS.read_text())["videos"]
IMAGE_PAD, VIDEO_PAD = 151655, 151656
TOKENS = {"<|image_pad|>": IMAGE_PAD, "<|video_pad|>": VIDEO_PAD}.get


@pytest.mark.parametrize("name", sorted(VIDEO_CASES))
def test_frames_equal_transformers_qwen2_vl_video_processor(name):
    config = VIDEO_CASES[name][0]
    processor = QwenVideoProcessor.from_files({"preprocessor_config.json": config}, TOKENS)
    out = processor.process(video_frames(name), True)
    (shape, want), grid = EXPECTED[name]
    assert digest(out.normalized) == [shape, want] and out.tensors["video_grid_thw"].tolist() == grid
    assert out.tokens == np.prod(grid) // 4 and processor.expansion(out) == [VIDEO_PAD] * out.tokens
    assert np.array_equal(processor.normalized(processor.process(video_frames(name), False).raw), out.normalized)


def test_its_numbers_come_from_the_video_config_else_the_image_one_else_its_own_defaults():
    image_config = {"min_pixels": 3136, "max_pixels": 200704, "patch_size": 14}
    video_config = {"size": {"shortest_edge": 6272, "longest_edge": 100352}, "temporal_patch_size": 2}
    both = QwenVideoProcessor.from_files({"preprocessor_config.json": image_config,
                                          "video_preprocessor_config.json": video_config}, TOKENS)
    assert (both.min_pixels, both.max_pixels) == (6272, 100352)
    fallback = QwenVideoProcessor.from_files({"preprocessor_config.json": image_config}, TOKENS)
    assert (fallback.min_pixels, fallback.max_pixels) == (3136, 200704)
    own = QwenVideoProcessor.from_files({}, TOKENS)
    assert (own.min_pixels, own.max_pixels, own.cap_pixels_per_frame) == (128 * 28 * 28, 768 * 28 * 28, False)
    for bad in ({"patch_size": 0}, {"min_pixels": 9, "max_pixels": 3}, {"merge_size": "2"}):
        with pytest.raises(ProcessorConfigError):
            QwenVideoProcessor.from_files({"preprocessor_config.json": bad}, TOKENS)
    with pytest.raises(ProcessorConfigError, match="video_pad"):
        QwenVideoProcessor.from_files({}, lambda token: None)
    # Qwen2-VL's and Qwen2.5-VL's videos (the second with its seconds per temporal step); Qwen3-VL's below.
    assert video_processor({"config.json": {"model_type": "qwen2_vl"}}, TOKENS).seconds_per_step is False
    qwen25 = video_processor({"config.json": {"model_type": "qwen2_5_vl"}}, TOKENS)
    assert qwen25.seconds_per_step and qwen25.cpu_tensors == ("video_grid_thw", "second_per_grid_ts")
    for model_type in ("llava", None):
        assert video_processor({"config.json": {"model_type": model_type}}, TOKENS) is None


# -- Qwen3-VL --------------------------------------------------------------------------------------------------

QWEN3_EXPECTED = json.loads(GOLDENS.read_text())["qwen3_videos"]


@pytest.fixture(scope="module")
def qwen_tokenizer():
    import tokenizers
    return tokenizers.Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))


def _qwen3(config, tokenizer, model_type="qwen3_vl"):
    return video_processor({"config.json": {"model_type": model_type}, "video_preprocessor_config.json": config},
                           tokenizer.token_to_id, "torchvision",
                           lambda text: tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("name", sorted(QWEN3_VIDEO_CASES))
def test_qwen3_vl_videos_equal_transformers_processor_pixels_grid_and_prompt(name, qwen_tokenizer):
    # Goldens from transformers' Qwen3VLProcessor (tests/support/torchvision_goldens.py): its video processor's
    # pixels and grid (its frame size bounds the whole video; a short file's frames sampled by the processor), and
    # the prompt its template's <|vision_start|><|video_pad|><|vision_end|> becomes, timestamps and all.
    config, _, _, _, total, source_fps, taken = QWEN3_VIDEO_CASES[name]
    processor = _qwen3(config, qwen_tokenizer)
    assert isinstance(processor, Qwen3VideoProcessor)
    frames, indices = qwen3_video(name)
    video = DecodedVideo(frames, len(indices) / total * source_fps, tuple(indices), total, source_fps,
                         taken == "every")
    out = processor.process_decoded(video, True)
    (shape, want), grid, prompt = QWEN3_EXPECTED[name]
    assert digest(out.normalized) == [shape, want] and out.tensors["video_grid_thw"].tolist() == grid
    start, end = qwen_tokenizer.token_to_id("<|vision_start|>"), qwen_tokenizer.token_to_id("<|vision_end|>")
    assert prompt_digest([start, *processor.expansion(out), end]) == prompt
    assert out.tokens == np.prod(grid) // 4 and processor.expansion(out).count(VIDEO_PAD) == out.tokens
    assert processor.embed_id == VIDEO_PAD


def test_qwen3_vl_timestamps_are_each_temporal_patchs_mean_time_as_text(qwen_tokenizer):
    assert frame_group_seconds([0, 12, 24, 36, 48], 10.0, 2) == [0.6, 3.0, 4.8]  # the last index padded
    processor = _qwen3({}, qwen_tokenizer)
    frames = np.stack([image(64, 64, seed) for seed in range(1, 5)])
    out = processor.process_decoded(DecodedVideo(frames, 1.0, (0, 1, 2, 3), 4, 1.0), False)  # a JPEG list at 1 fps
    text = qwen_tokenizer.decode(processor.expansion(out), skip_special_tokens=False)
    per_frame = "<|video_pad|>" * (out.tokens // 2)
    assert text == f"<0.5 seconds><|vision_start|>{per_frame}<|vision_end|>" \
                   f"<2.5 seconds><|vision_start|>{per_frame}<|vision_end|>"


def test_qwen3_vl_reads_its_own_config_and_defaults_and_needs_the_tokenizer(qwen_tokenizer):
    own = _qwen3({}, qwen_tokenizer, "qwen3_vl_moe")
    assert (own.patch_size, own.min_pixels, own.max_pixels, own.mean, own.fps, own.min_frames, own.max_frames) == (
        16, 128 * 32 * 32, 768 * 32 * 32, (0.5, 0.5, 0.5), 2, 4, 768)
    published = _qwen3({"size": {"shortest_edge": 4096, "longest_edge": 25165824}, "fps": 1, "max_frames": 64},
                       qwen_tokenizer)
    assert (published.min_pixels, published.max_pixels, published.fps, published.max_frames) == (
        4096, 25165824, 1, 64)
    assert published.describe() != own.describe()  # the media cache keeps each processor's items apart
    for bad in ({"fps": 0}, {"min_frames": 9, "max_frames": 3}, {"max_frames": "8"}):
        with pytest.raises(ProcessorConfigError):
            _qwen3(bad, qwen_tokenizer)
    with pytest.raises(ProcessorConfigError, match="tokenizer"):
        video_processor({"config.json": {"model_type": "qwen3_vl"}}, qwen_tokenizer.token_to_id)
    one_frame = DecodedVideo(np.stack([image(64, 64, 1)]), 1.0, (0,), 1, 1.0)
    with pytest.raises(ValueError, match="at least 2"):  # its smart_resize refuses it: the service's 400
        own.process_decoded(one_frame, False)


def test_qwen3_vl_videos_take_the_pixel_bounds_over_the_whole_video(qwen_tokenizer):
    """vLLM 0.32 folds Qwen3-VL's mm_processor_kwargs pixel bounds (flat, or in videos_kwargs) into its video
    processor's size: a bound on the pixels of every frame together, not a frame's."""
    from gateway.media.families import with_request_kwargs
    own = _qwen3({}, qwen_tokenizer)
    assert own.frame_size(8, 320, 480) == (256, 384)  # 8 frames of 320 x 480 are over its 768 x 32 x 32 together
    bounded = with_request_kwargs(own, {"videos_kwargs": {"max_pixels": 8 * 64 * 64}})
    assert bounded.max_pixels == 8 * 64 * 64 and bounded.frame_size(8, 320, 480) == (32, 64)
    assert with_request_kwargs(own, {"max_pixels": 8 * 64 * 64}).frame_size(8, 320, 480) == (32, 64)
    assert with_request_kwargs(own, {"images_kwargs": {"max_pixels": 1024}}).max_pixels == own.max_pixels
    grown = with_request_kwargs(own, {"size": {"shortest_edge": 4 * 320 * 480}})  # vLLM completes it for Qwen3-VL
    assert grown.frame_size(2, 32, 32) == (576, 576)
    assert bounded.describe() != own.describe()
    with pytest.raises(ValueError, match="'fps' is not applied"):
        with_request_kwargs(own, {"videos_kwargs": {"fps": 1}})


def test_qwen3_vl_loader_takes_the_frames_vllm_takes():
    # vLLM 0.32's Qwen3VLVideoBackend on every case of the grid (the digest made in the vLLM venv).
    golden = json.loads(GOLDENS.read_text())["video_indices"]
    sampled = [qwen3_vl_indices(total, source_fps, fps) for total, source_fps, fps in VIDEO_INDEX_CASES]
    assert index_digest(sampled) == golden["qwen3_digest"]
    assert qwen3_vl_indices(40, 10.0, 2.0) == [0, 6, 11, 17, 22, 28, 33, 39]  # 4 s: 8 frames, first to last
    assert qwen3_vl_indices(3, 30.0, 2.0) == [0, 1, 2]  # fewer than 4 in the file: all of them
    assert qwen3_vl_indices(48, 0.0, 2.0) == qwen3_vl_indices(48, 24.0, 2.0)  # no rate said: 24 a second


def test_qwen2_5_vl_gets_each_videos_seconds_per_temporal_step():
    # Qwen2_5_VLProcessor: temporal_patch_size / the rate the frames were taken at (VideoMetadata.sampled_fps), as
    # float32; kept on the CPU, where vLLM computes the positions.
    processor = QwenVideoProcessor(placeholder_id=VIDEO_PAD, min_pixels=3136, max_pixels=50176, seconds_per_step=True)
    frames = video_frames("tiny")
    for sampled_fps, seconds in ((2.0, 1.0), (1.0, 2.0), (0.8, 2.5), (29.97, 2 / 29.97)):
        out = processor.process(frames, False, sampled_fps).tensors["second_per_grid_ts"]
        assert out.dtype == np.float32 and out.shape == () and out == np.float32(seconds)
    plain = QwenVideoProcessor(placeholder_id=VIDEO_PAD, min_pixels=3136, max_pixels=50176)
    assert set(plain.process(frames, False, 2.0).tensors) == {"video_grid_thw"}
    assert plain.describe() != processor.describe()  # (cached apart)


def test_a_files_frames_are_sampled_as_vllms_loaders_sample_them():
    # Qwen2-VL's ("qwen2_vl", by time): equal to vLLM 0.32's own function on every case of the grid (the digest of
    # its indices, made in the vLLM venv), and the torch arange under it on pairs where a plainer emulation is off.
    golden = json.loads(GOLDENS.read_text())["video_indices"]
    sampled = [qwen2_vl_indices(total, source_fps, fps) for total, source_fps, fps in VIDEO_INDEX_CASES]
    assert len(sampled) == golden["cases"] and index_digest(sampled) == golden["digest"]
    aranges = [torch_arange_truncated(total, count).tolist() for total, count in ARANGE_CASES]
    assert len(aranges) == golden["arange_cases"] and index_digest(aranges) == golden["arange_digest"]
    assert qwen2_vl_indices(6, 10.0, 2.0) == [0, 1, 3, 4]  # 0.6 s: at least 4 frames
    assert qwen2_vl_indices(40, 10.0, 2.0) == [0, 5, 10, 15, 20, 25, 30, 35]  # 4 s: 8 frames
    assert len(qwen2_vl_indices(100_000, 30.0, 2.0)) == 768  # at most 768
    for total, source_fps, why in ((1, 30.0, "at least 2"), (30, 0.0, "frame rate is unknown")):
        with pytest.raises(VideoRefused, match=why):
            qwen2_vl_indices(total, source_fps, 2.0)



def _jpeg(pixels: np.ndarray) -> str:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95)
    return base64.b64encode(out.getvalue()).decode()


def _frames_url(*frames: np.ndarray) -> str:
    return "data:video/jpeg;base64," + ",".join(_jpeg(f) for f in frames)


def test_a_jpeg_frame_list_gives_its_first_frames_each_decoded_as_an_image_is():
    frames = [image(40, 30, seed) for seed in range(1, 6)]
    url = _frames_url(*frames)
    assert is_jpeg_frames(url) and is_jpeg_frames("DATA:Video/JPEG;BASE64,x") and not is_jpeg_frames(
        "data:video/mp4;base64,x")
    decoded = decode_jpeg_frames(jpeg_frames_payload(url), 3, 1.0, 10 ** 6, 10 ** 7)  # vLLM: the first num_frames
    assert decoded.frames.shape == (3, 30, 40, 3) and decoded.sampled_fps == 1.0
    for got, sent in zip(decoded.frames, frames):
        assert np.array_equal(got, np.asarray(Image.open(io.BytesIO(base64.b64decode(_jpeg(sent)))).convert("RGB")))
    with pytest.raises(VideoRefused, match="one size"):
        decode_jpeg_frames(jpeg_frames_payload(_frames_url(image(40, 30, 1), image(30, 40, 2))), 32, 1.0, 10 ** 6,
                           10 ** 7)
    with pytest.raises(VideoRefused, match="frame 1 is not valid base64"):
        decode_jpeg_frames(jpeg_frames_payload(url).replace(b",", b",%", 1), 32, 1.0, 10 ** 6, 10 ** 7)
    with pytest.raises(VideoRefused, match="frame 0: the image is 40 x 30 pixels; at most 1000"):
        decode_jpeg_frames(jpeg_frames_payload(url), 32, 1.0, 1000, 10 ** 7)
    with pytest.raises(VideoRefused, match="more than 3000 pixels together"):  # 1,200 a frame: the third is over
        decode_jpeg_frames(jpeg_frames_payload(url), 32, 1.0, 10 ** 6, 3000)
    with pytest.raises(VideoRefused, match="no frames"):
        decode_jpeg_frames(b"", 32, 1.0, 10 ** 6, 10 ** 7)
    assert decode_jpeg_frames(jpeg_frames_payload(url), None, 1.0, 10 ** 6, 10 ** 7).frames.shape[0] == 5  # every one
    with pytest.raises(VideoRefused, match="more than 3000 pixels together"):  # every frame asked: still bounded
        decode_jpeg_frames(jpeg_frames_payload(url), None, 1.0, 10 ** 6, 3000)


def test_a_requests_media_io_kwargs_load_its_videos_as_vllm_merges_them():
    """vLLM's VideoMediaIO.merge_kwargs: a request's num_frames or fps over the node's, the other of the two left to
    the loader's default when the request sets only one (they interact); what is not applied here is said."""
    from gateway.media.video import VIDEO_FRAMES_DEFAULT, VideoLoading
    node = VideoLoading(16, 4.0)
    assert node.with_request({"video": {"fps": 1}}) == VideoLoading(VIDEO_FRAMES_DEFAULT, 1.0)
    assert node.with_request({"video": {"num_frames": 3}}) == VideoLoading(3, None)
    assert node.with_request({"video": {"num_frames": -1, "fps": 5}}) == VideoLoading(None, 5.0)
    assert node.with_request({"video": {}}) == node
    assert node.with_request({"video": {"fps": 1}}).describe() != node.describe()  # the media cache's key
    for bad, says in [({"image": {}}, "only a video's"), ({"video": 3}, "object"),
                      ({"video": {"frame_recovery": True}}, "'frame_recovery' is not applied"),
                      ({"video": {"num_frames": 0}}, "positive"), ({"video": {"num_frames": 2.0}}, "positive"),
                      ({"video": {"num_frames": True}}, "positive"), ({"video": {"fps": 0}}, "above 0"),
                      ({"video": {"fps": float("nan")}}, "above 0"), ({"video": {"fps": 1e9}}, "at most"),
                      ({"video": {"fps": "2"}}, "above 0")]:
        with pytest.raises(ValueError, match=says):
            node.with_request(bad)


def _movie(path: str, count: int, width: int, height: int) -> None:
    """An MP4 of ``count`` (at most 40) frames of 96 x 64 at ``path``: frame k black but for a white 12 x 12 cell,
    the k-th of an 8 x 5 grid (which survives the codec)."""
    import cv2
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (width, height))
    for k in range(count):
        frame = np.zeros((height, width, 3), np.uint8)
        frame[12 * (k // 8):12 * (k // 8) + 12, 12 * (k % 8):12 * (k % 8) + 12] = 255
        writer.write(frame)
    writer.release()


def nearest_level(frame: np.ndarray) -> int:
    """Which of _movie's frames ``frame`` is: its brightest cell."""
    cells = frame[:60, :, 0].astype(float).reshape(5, 12, 8, 12).mean(axis=(1, 3))
    return int(np.argmax(cells))


def test_a_video_file_is_sampled_and_decoded_as_opencv_reads_it_frame_by_frame(tmp_path):
    cv2 = pytest.importorskip("cv2")
    path = str(tmp_path / "v.mp4")
    _movie(path, 40, 96, 64)
    data = open(path, "rb").read()
    uniform = lambda total, fps: np.linspace(0, total - 1, 32, dtype=int).tolist()  # noqa: E731  (32 of 40)
    decoded = decode_container(data, uniform, 10 ** 6, 10 ** 7)
    frames = decoded.frames
    assert decoded.sampled_fps == 32 / 40 * 10  # frames taken / frames in the file x its rate (VideoMetadata's)
    capture = cv2.VideoCapture(path)  # the file read in order, every frame
    every = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        every.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
    assert len(every) == 40 and frames.shape == (32, 64, 96, 3)
    assert all(np.array_equal(got, every[i]) for got, i in zip(frames, uniform(40, 10.0)))
    # A lossy codec, but the frames written, in order.
    assert [nearest_level(got) for got in frames] == uniform(40, 10.0)
    with pytest.raises(VideoRefused, match="96 x 64 pixels; at most 6000 pixels a frame"):
        decode_container(data, uniform, 6000, 10 ** 7)
    with pytest.raises(VideoRefused, match="32 frames of 96 x 64 are more than 100000 pixels"):
        decode_container(data, uniform, 10 ** 6, 100_000)
    by_time = decode_container(data, lambda total, fps: qwen2_vl_indices(total, fps, 2.0), 10 ** 6, 10 ** 7)
    assert [nearest_level(frame) for frame in by_time.frames] == [0, 5, 10, 15, 20, 25, 30, 35]  # 10 a second: 2
    assert by_time.sampled_fps == 2.0
    for garbage in (b"", os.urandom(4096), data[:len(data) // 3]):
        with pytest.raises(VideoRefused, match="not a video"):
            decode_container(garbage, uniform, 10 ** 6, 10 ** 7)


def test_a_file_is_decoded_in_a_child_process_the_same_and_broken_ones_cost_only_the_child(tmp_path, capfd):
    """A client's file with bytes changed or cut (a seeded sample of 24; ~900 more were run by hand) decodes to what
    it holds or is refused, in a child process: one of those (video_decoder_crash.avi, a 16 KB AVI with a few bytes
    changed) crashes OpenCV's reader with a segmentation fault, vLLM's own server's too; here it is a refusal, and
    the node's process goes on. The decoders' complaints stay out of the node's log."""
    pytest.importorskip("cv2")
    path = str(tmp_path / "v.mp4")
    _movie(path, 12, 96, 64)
    data = open(path, "rb").read()
    by_time = lambda total, fps: qwen2_vl_indices(total, fps, 2.0)  # noqa: E731
    here, there = decode_container(data, by_time, 10 ** 6, 10 ** 7), decode_container_isolated(data, 2.0, 10 ** 6,
                                                                                              10 ** 7, 30.0)
    assert here == dataclasses.replace(there, frames=here.frames) and np.array_equal(here.frames, there.frames)
    assert (there.indices, there.total_frames, there.source_fps, there.every_frame_taken) == ((0, 3, 6, 9), 12, 10.0,
                                                                                              False)
    # Qwen3-VL's loader (linspace, first to last), its metadata through the child too: 12 frames at 10 a second
    # make fewer than 4 by time, so 4 (every third), and a file of 3 frames is taken whole (the processor samples).
    qwen3 = decode_container_isolated(data, 2.0, 10 ** 6, 10 ** 7, 30.0, "qwen3_vl")
    assert qwen3.indices == (0, 4, 7, 11) and [nearest_level(frame) for frame in qwen3.frames] == [0, 4, 7, 11]
    assert qwen3.every_frame_taken is False and qwen3.total_frames == 12
    _movie(str(tmp_path / "short.mp4"), 3, 96, 64)
    short = decode_container_isolated((tmp_path / "short.mp4").read_bytes(), 2.0, 10 ** 6, 10 ** 7, 30.0, "qwen3_vl")
    assert short.indices == (0, 1, 2) and short.every_frame_taken
    crash = (Path(__file__).parent / "video_decoder_crash.avi").read_bytes()
    with pytest.raises(VideoRefused) as refused:
        decode_container_isolated(crash, 2.0, 10 ** 6, 10 ** 7, 30.0)
    if _crashes_in_process(crash):  # (OpenCV 5.0.0.93 does; a later release may refuse it in its own words)
        assert "could not be decoded (its decoder ended with signal" in str(refused.value)
    with pytest.raises(VideoRefused, match="not decoded within"):
        decode_container_isolated(data, 2.0, 10 ** 6, 10 ** 7, 0.001)
    with pytest.raises(VideoRefused, match="4 frames of 96 x 64 are more than 1000 pixels"):  # its own refusals
        decode_container_isolated(data, 2.0, 10 ** 6, 1000, 30.0)
    rng = np.random.default_rng(64)
    outcomes = {"read": 0, "refused": 0}
    for _ in range(24):
        broken = bytearray(data)
        for position in rng.integers(0, len(broken), rng.integers(1, 20)):
            broken[position] = rng.integers(0, 256)
        if rng.random() < 0.3:
            broken = broken[:rng.integers(0, len(broken))]
        try:
            video = decode_container_isolated(bytes(broken), 2.0, 10 ** 6, 10 ** 7, 30.0)
            assert video.frames.shape[1:] == (64, 96, 3) and 0 < len(video.frames) <= 12
            outcomes["read"] += 1
        except VideoRefused:
            outcomes["refused"] += 1
    assert outcomes["read"] and outcomes["refused"], outcomes
    assert capfd.readouterr().err == ""  # FFmpeg's complaints went to the child's pipe


def _crashes_in_process(data: bytes) -> bool:
    """Whether decoding ``data`` in a process kills that process (run in one of its own, to find out)."""
    probe = subprocess.run([sys.executable, "-c", "import sys\nfrom gateway.media.video import decode_container, "
                            "qwen2_vl_indices\ndecode_container(sys.stdin.buffer.read(), lambda total, fps: "
                            "qwen2_vl_indices(total, fps, 2.0), 10 ** 6, 10 ** 7)"], input=data, capture_output=True,
                           timeout=60, env={**os.environ, "OPENCV_FFMPEG_LOGLEVEL": "-8"})
    return probe.returncode < 0


def test_without_opencv_a_file_is_refused_saying_so_and_jpeg_frames_still_work(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 raises ImportError
    with pytest.raises(VideoRefused, match="opencv-python-headless is not installed.*data:video/jpeg"):
        decode_container(b"\x00" * 100, lambda total, fps: [0], 10 ** 6, 10 ** 7)
    assert decode_jpeg_frames(jpeg_frames_payload(_frames_url(image(8, 8, 1))), 32, 1.0, 10 ** 6, 10 ** 7
                              ).frames.shape == (1, 8, 8, 3)


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image(width, height, 3)).save(out, "PNG")
    return out.getvalue()


def _batch(processor, *tokens: int) -> MediaInputs:
    items = [ProcessedImage(np.zeros((n * 4, 1176), np.uint8), {"grid": np.array([1, 2, 2 * n])}, n) for n in tokens]
    return MediaInputs(processor, items, [f"{processor.placeholder_id:x}{i:063x}"[:64] for i in range(len(items))])


def test_images_and_videos_in_one_prompt_each_expanded_and_placed():
    images = _batch(QwenVisionProcessor(placeholder_id=IMAGE_PAD), 2, 3)
    videos = _batch(QwenVideoProcessor(placeholder_id=VIDEO_PAD), 4)
    expanded, routing = expand_batches([1, VIDEO_PAD, 2, IMAGE_PAD, 3, IMAGE_PAD, 4], (images, videos))
    assert expanded == [1] + [VIDEO_PAD] * 4 + [2] + [IMAGE_PAD] * 2 + [3] + [IMAGE_PAD] * 3 + [4]
    assert videos.ranges == [(1, 4)] and images.ranges == [(6, 2), (9, 3)]
    for batch, token in ((images, IMAGE_PAD), (videos, VIDEO_PAD)):
        assert all(expanded[o:o + n] == [token] * n for o, n in batch.ranges)
    assert [routing[i] for i in (0, 5, 8, 12)] == [1, 2, 3, 4]
    assert all(r >= 1 << 62 for r in routing[1:5] + routing[6:8] + routing[9:12])
    assert videos.modality == "video" and images.modality == "image"
    with pytest.raises(MediaError, match="2 video placeholders for 1 videos") as refused:
        expand_batches([VIDEO_PAD, IMAGE_PAD, VIDEO_PAD, IMAGE_PAD], (_batch(QwenVisionProcessor(
            placeholder_id=IMAGE_PAD), 1, 1), _batch(QwenVideoProcessor(placeholder_id=VIDEO_PAD), 1)))
    assert refused.value.code == "video_placeholder_mismatch"


def test_a_vllm_request_carries_images_then_videos_each_a_batch_of_its_modality():
    from smg_grpc_proto.generated import common_pb2

    from gateway.engine.messages import SamplingOptions
    from gateway.engine.runtimes import ENGINE_RUNTIMES
    images = _batch(QwenVisionProcessor(placeholder_id=IMAGE_PAD), 2)
    videos = _batch(QwenVideoProcessor(placeholder_id=VIDEO_PAD), 1)
    for batch in (images, videos):
        for item in batch.images:
            item.tensors.clear()
            item.tensors[f"{batch.modality}_grid_thw"] = np.array([1, 2, 2 * item.tokens])
    ids, _ = expand_batches([1, IMAGE_PAD, VIDEO_PAD, 2], (images, videos))
    request = ENGINE_RUNTIMES["vllm"].generate_request("r", ids, SamplingOptions(max_new_tokens=4), False,
                                                       media=(images, videos), raw_pixels=True)
    first, (second,) = request.mm_inputs, request.extra_mm_inputs
    assert (first.modality, second.modality) == (common_pb2.IMAGE, common_pb2.VIDEO)
    assert (first.im_token_id, second.im_token_id) == (IMAGE_PAD, VIDEO_PAD)
    assert dict(second.flat_keys) == {"pixel_values": "patches_per_video"} and \
        list(second.keep_on_cpu_keys) == ["video_grid_thw"]
    assert set(second.model_specific_tensors) == {"video_grid_thw", "patches_per_video"}
    assert [(p.offset, p.length) for p in second.mm_placeholders] == [(3, 1)] and len(second.mm_hashes) == 1


async def test_the_service_bounds_videos_by_count_and_bytes_and_keeps_what_it_processed():
    processor = QwenVideoProcessor(placeholder_id=VIDEO_PAD, min_pixels=3136, max_pixels=28 * 28 * 16)
    service = MediaService(MediaConfig(threads=1, video_bytes_max=20_000, videos_per_request_max=2))
    url = _frames_url(image(60, 40, 1), image(60, 40, 2), image(60, 40, 3))
    try:
        ref = VideoRef(url, "messages[0].content[0]")
        first = await service.prepare([ref], processor, True)
        assert first.images[0].tensors["video_grid_thw"].tolist() == [2, 4, 6] and first.modality == "video"
        again = await service.prepare([ref], processor, True)
        assert again.images[0] is first.images[0] and service.processed == 1  # kept: not decoded twice
        with pytest.raises(MediaError, match="3 videos; at most 2") as refused:
            await service.prepare([ref] * 3, processor, False)
        assert refused.value.code == "too_many_videos" and refused.value.param == "messages[0].content[0]"
        with pytest.raises(MediaError, match="engines take no videos") as refused:  # their limit says 0
            await service.prepare([ref], processor, False, images_max=0)
        assert refused.value.code == "too_many_videos"
        assert len((await service.prepare([ref], processor, False, images_max=1)).images) == 1
        large = "data:video/jpeg;base64," + "A" * 40_000
        with pytest.raises(MediaError, match="larger than 20000 bytes") as refused:
            await service.prepare([VideoRef(large, "messages[0].content[1]")], processor, False)
        assert refused.value.code == "video_too_large" and refused.value.param == "messages[0].content[1]"
        with pytest.raises(MediaError) as refused:
            await service.prepare([VideoRef("data:video/mp4;base64,AAAA", "m")], processor, False)
        assert refused.value.code == "invalid_video" and service.refused["invalid_video"] == 1
        assert service.tenant_bytes == {}  # every request's bytes given back
        # A request's images and videos count against one bound together.
        picture = "data:image/png;base64," + base64.b64encode(_png(64, 64)).decode()
        images = QwenVisionProcessor(placeholder_id=IMAGE_PAD)
        small = MediaService(MediaConfig(threads=1, request_bytes_max=len(url) + 100))  # (a frame list: its text)
        try:
            alone = await small.prepare_all([([ref], processor, None)], False)
            assert [batch.modality for batch in alone] == ["video"]
            with pytest.raises(MediaError, match="images and videos are more than") as refused:
                await small.prepare_all([([ImageRef(picture, "messages[0].content[1]")], images, None),
                                         ([ref], processor, None)], False)
            assert refused.value.code == "images_too_large" and small.tenant_bytes == {}
        finally:
            await small.aclose()
    finally:
        await service.aclose()


def test_the_simulated_qwen3_vl_takes_the_gateways_video_and_refuses_a_range_that_is_not_one(qwen_tokenizer):
    # chaos/sim_engine/vision_qwen3.py stands for vLLM's Qwen3-VL behind the servicer in the integration tests: it
    # must take what the gateway sends and refuse what a real one could not use.
    from chaos.sim_engine import vision_qwen3
    from chaos.sim_engine.config import SimEngineConfig
    from gateway.engine.messages import SamplingOptions
    from gateway.engine.runtimes import ENGINE_RUNTIMES
    processor = _qwen3(vision_qwen3.VIDEO_PREPROCESSOR_CONFIG, qwen_tokenizer)
    frames = np.stack([image(120, 90, seed) for seed in range(1, 6)])
    out = processor.process_decoded(DecodedVideo(frames, 1.0, tuple(range(5)), 5, 1.0), False)
    videos = MediaInputs(processor, [out], ["ab" * 32])
    start, end = qwen_tokenizer.token_to_id("<|vision_start|>"), qwen_tokenizer.token_to_id("<|vision_end|>")
    ids, _ = videos.expand([1, start, VIDEO_PAD, end, 2])
    tokens = vision_qwen3.Qwen3Tokens((default_tokenizer_dir() / "tokenizer.json").read_bytes())
    config = SimEngineConfig()

    def checked(prompt):
        request = ENGINE_RUNTIMES["vllm"].generate_request("r", prompt, SamplingOptions(max_new_tokens=1), False,
                                                           media=(videos,), raw_pixels=True)
        return vision_qwen3.check_vllm_video(tokens, request.mm_inputs, prompt, config)

    assert checked(ids).items == 1 and videos.ranges == [(2, len(out.prompt_ids))]
    offset, length = videos.ranges[0]
    first_start = ids.index(start, offset)
    swapped = list(ids)  # the first two temporal patches' times swapped: not rising
    stamp_a, stamp_b = ids[offset:first_start], processor.encode_text("<2.5 seconds>")
    assert ids[first_start + 14:first_start + 14 + len(stamp_b)] == stamp_b and len(stamp_a) == len(stamp_b)
    swapped[offset:first_start], swapped[first_start + 14:first_start + 14 + len(stamp_b)] = stamp_b, stamp_a
    no_time = ids[:offset] + ids[first_start:]  # the first patch's time left out
    short = list(ids)
    short[first_start + 1] = 3  # a video token short
    for broken, says in ((swapped, "do not rise"), (short, "not 12 video tokens"), (no_time, "its time as text")):
        videos.ranges = [(offset, length - (len(ids) - len(broken)))]
        with pytest.raises(vision_qwen3.ImagesRefused, match=says):
            checked(broken)

"""Videos on a real engine (issue 64), compared with vLLM's own OpenAI server on the same model and flags: the tiny
random Qwen2-VL of test_vllm_vision.py, a tiny Qwen2.5-VL (make_tiny_qwen2_5_vl.py) and a tiny Qwen3-VL
(make_tiny_qwen3_vl.py: its prompt carries each temporal patch's time as text), their videos decoded and
processed in the gateway (gateway/media/video.py) and sent as a VIDEO batch over the servicer's preprocessed path,
against vLLM's server decoding them with OpenCV and running the model's transformers video processor itself: the same
prompt tokens, the same greedy text and the same first token's probabilities, for a list of JPEG frames (vLLM's
data:video/jpeg), MP4 files (frames sampled by time, as vLLM's Qwen2-VL loader samples them), an AVI of Motion-JPEG,
and a video beside an image in one request (two batches).

Needs ``tests/real_engine/setup_vllm.sh`` and SMG_VLLM_PYTHON, SMG_VLLM_VISION_MODEL, SMG_VLLM_QWEN2_5_VL_MODEL,
SMG_VLLM_QWEN3_VL_MODEL, SMG_VLLM_VISION_PYTHONPATH.
"""

from __future__ import annotations

import base64
import io
import tempfile

import numpy as np
import openai
import pytest
from PIL import Image

from .media_engines import vision_pair
from .test_vllm_vision import IMAGES, LOGPROB_TOLERANCE

pytestmark = pytest.mark.real_engine
cv2 = pytest.importorskip("cv2")


# Qwen2-VL, Qwen2.5-VL (the same processor and loader; its positions read each video's seconds per step) and
# Qwen3-VL (its own processor and loader; each temporal patch's time written into the prompt).
MODELS = {"qwen2-vl": "SMG_VLLM_VISION_MODEL", "qwen2.5-vl": "SMG_VLLM_QWEN2_5_VL_MODEL",
          "qwen3-vl": "SMG_VLLM_QWEN3_VL_MODEL"}


@pytest.fixture(scope="module", params=sorted(MODELS))
def video(request):
    # A request's mm_processor_kwargs trusted on both sides (the pixel bounds, below).
    with vision_pair(MODELS[request.param], f"vllm-video-{request.param}", 18055, 18065,
                     '{"image": 2, "video": 2}', server_flags=("--trust-request-mm-kwargs",),
                     node_flags=("--media-trust-request-kwargs",)) as pair:
        yield pair


def _frame(width: int, height: int, seed: int) -> np.ndarray:
    """A moving gradient with noise: frames that differ from each other."""
    x, y = np.meshgrid(np.linspace(0, 1, width), np.linspace(0, 1, height))
    noise = np.random.default_rng(seed).random((height, width))
    shift = seed / 10
    return (np.stack([(x + shift) % 1, y, noise], axis=-1) * 255).astype(np.uint8)


def _jpeg_frames(count: int, width: int, height: int) -> str:
    frames = []
    for k in range(count):
        out = io.BytesIO()
        Image.fromarray(_frame(width, height, k)).save(out, "JPEG", quality=90)
        frames.append(base64.b64encode(out.getvalue()).decode())
    return "data:video/jpeg;base64," + ",".join(frames)


def _video_file(count: int, width: int, height: int, fourcc: str, suffix: str, mime: str, fps: float = 10.0) -> str:
    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        writer = cv2.VideoWriter(f.name, cv2.VideoWriter_fourcc(*fourcc), fps, (width, height))
        for k in range(count):
            writer.write(np.ascontiguousarray(_frame(width, height, k)[:, :, ::-1]))
        writer.release()
        data = open(f.name, "rb").read()
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# Sampled by vLLM's Qwen2-VL loader, two frames a second: 40 at 10 a second give 8; 6 give its minimum of 4; 451 at
# 30 a second (15 s) give 30, the last index clamped from torch's float32 arange.
VIDEOS = {"jpeg frames 5 of 120x90": _jpeg_frames(5, 120, 90),
          "mp4 40 frames of 96x64": _video_file(40, 96, 64, "mp4v", ".mp4", "video/mp4"),
          "mp4 451 frames at 30 a second": _video_file(451, 64, 48, "mp4v", ".mp4", "video/mp4", 30.0),
          "avi mjpeg 6 of 64x48": _video_file(6, 64, 48, "MJPG", ".avi", "video/x-msvideo"),
          # Qwen3-VL's loader takes all 3 frames of this one, so its processor samples them itself (vLLM's
          # do_sample_frames); Qwen2-VL's takes 2.
          "mp4 3 frames of 96x64": _video_file(3, 96, 64, "mp4v", ".mp4", "video/mp4")}


def _chat(client, model, videos, images=(), **kwargs):
    content = [{"type": "video_url", "video_url": {"url": uri}} for uri in videos] + \
        [{"type": "image_url", "image_url": {"url": uri}} for uri in images] + \
        [{"type": "text", "text": "What happens in the video?"}]
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=12, temperature=0, **kwargs)


@pytest.mark.parametrize("name", sorted(VIDEOS))
def test_a_video_gives_vllms_own_prompt_and_greedy_answer(video, name):
    ours, theirs, model = video
    mine, reference = _chat(ours, model, [VIDEOS[name]]), _chat(theirs, model, [VIDEOS[name]])
    assert mine.usage.prompt_tokens == reference.usage.prompt_tokens
    assert mine.choices[0].message.content == reference.choices[0].message.content


def test_a_video_beside_an_image_streamed(video):
    ours, theirs, model = video
    args = ([VIDEOS["jpeg frames 5 of 120x90"]], [IMAGES["noise 100x80"]])
    reference = _chat(theirs, model, *args)
    streamed = list(_chat(ours, model, *args, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        reference.choices[0].message.content
    assert streamed[-1].usage.prompt_tokens == reference.usage.prompt_tokens


def test_the_video_moves_the_models_probabilities_as_on_vllms_own_server(video):
    ours, theirs, model = video
    seen = set()
    for uri in VIDEOS.values():
        mine, reference = [{t.token: t.logprob for t in reply.choices[0].logprobs.content[0].top_logprobs}
                           for reply in (_chat(client, model, [uri], logprobs=True, top_logprobs=5)
                                         for client in (ours, theirs))]
        shared = mine.keys() & reference.keys()
        assert len(shared) >= 4, (mine, reference)
        assert max(abs(mine[t] - reference[t]) for t in shared) < LOGPROB_TOLERANCE, (mine, reference)
        seen.add(tuple(sorted(mine.items())))
    assert len(seen) == len(VIDEOS), "different videos gave the same probabilities"


# vLLM's mm_processor_kwargs for Qwen-VL: the pixel bounds, flat (images and videos), for one modality
# (images_kwargs, videos_kwargs), a bound alone (the other the processor's own) or as transformers' size (partial
# too: Qwen3-VL's only), and vLLM 0.32's precedence: a modality's own over the flat one, min_pixels / max_pixels over size's edges.
# Qwen3-VL's videos take them over the whole video.
PIXEL_KWARGS = [{"max_pixels": 28 * 28 * 6}, {"images_kwargs": {"max_pixels": 28 * 28 * 6}},
                {"videos_kwargs": {"max_pixels": 28 * 28 * 6}}, {"min_pixels": 28 * 28 * 300},
                {"size": {"shortest_edge": 28 * 28 * 2, "longest_edge": 28 * 28 * 10}},
                {"size": {"longest_edge": 28 * 28 * 12}},
                {"max_pixels": 28 * 28 * 40, "videos_kwargs": {"max_pixels": 28 * 28 * 8}},
                {"size": {"shortest_edge": 28 * 28 * 2, "longest_edge": 28 * 28 * 30}, "max_pixels": 28 * 28 * 9}]


@pytest.mark.parametrize("kwargs", PIXEL_KWARGS, ids=lambda kwargs: "-".join(kwargs))
def test_a_requests_pixel_bounds_give_vllms_own_prompt_and_answer(video, kwargs):
    ours, theirs, model = video
    args = ([VIDEOS["jpeg frames 5 of 120x90"]], [IMAGES["noise 100x80"]])
    if len(kwargs.get("size", {})) == 1 and not model.endswith("qwen3-vl"):
        # vLLM hands Qwen2-VL's and Qwen2.5-VL's to transformers, which refuses a size with one edge: both a 400.
        for client in (theirs, ours):
            with pytest.raises(openai.BadRequestError):
                _chat(client, model, *args, extra_body={"mm_processor_kwargs": kwargs})
        return
    reference = _chat(theirs, model, *args, extra_body={"mm_processor_kwargs": kwargs})
    mine = _chat(ours, model, *args, extra_body={"mm_processor_kwargs": kwargs})
    assert mine.usage.prompt_tokens == reference.usage.prompt_tokens != _chat(theirs, model, *args).usage.prompt_tokens
    assert mine.choices[0].message.content == reference.choices[0].message.content


# vLLM's media_io_kwargs for videos (its VideoMediaIO): a JPEG frame list's first num_frames frames and the rate it
# is said to be taken at (Qwen2.5-VL's positions and Qwen3-VL's timestamps read it), a file's sampling rate; a
# request setting one of the two leaves the other to the loader's default.
LOADING = [{"num_frames": 3}, {"fps": 1}, {"num_frames": 3, "fps": 5}, {"num_frames": -1, "fps": 0.5}]


@pytest.mark.parametrize("loading", LOADING, ids=lambda loading: "-".join(f"{k}={v}" for k, v in loading.items()))
@pytest.mark.parametrize("name", ["jpeg frames 5 of 120x90", "mp4 40 frames of 96x64"])
def test_a_requests_media_io_kwargs_load_its_video_as_vllms_own_server_does(video, loading, name):
    ours, theirs, model = video
    extra = {"extra_body": {"media_io_kwargs": {"video": loading}}, "logprobs": True, "top_logprobs": 5}
    mine, reference = (_chat(client, model, [VIDEOS[name]], **extra) for client in (ours, theirs))
    assert mine.usage.prompt_tokens == reference.usage.prompt_tokens
    assert mine.choices[0].message.content == reference.choices[0].message.content
    mine_top, reference_top = ({t.token: t.logprob for t in reply.choices[0].logprobs.content[0].top_logprobs}
                               for reply in (mine, reference))
    shared = mine_top.keys() & reference_top.keys()
    assert len(shared) >= 4 and max(abs(mine_top[t] - reference_top[t]) for t in shared) < LOGPROB_TOLERANCE

"""Videos in, for Qwen2-VL (issue 64): a real node, the simulated Qwen2-VL engine (chaos/sim_engine/vision.py checks
a VIDEO batch's tensors against the prompt, beside an IMAGE batch, and folds them into its answer), the openai SDK.

What is checked: a video_url as vLLM's JPEG frame list and as an MP4 file (made here with OpenCV), counted as the
model's video processor counts it; different videos, different answers; a video beside an image in one request (two
batches); streamed; and refused with a 400 naming why: a text model, a model whose engines are SGLang's, too many
videos, bytes that are no video, frames of different sizes, a video over the byte bound, a file that crashes its
decoder (the node goes on). Fetched over http from a real server on 127.0.0.2, the image fetch rules hold for
videos as attacks: hosts not allowed, loopback and metadata addresses, a redirect out, a declared or an endless
body past the video bound, a missing file, the crashing file served."""

from __future__ import annotations

import base64
import io
import os
import tempfile
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from chaos.processes import EngineProcess, NodeProcess

from gateway.media.video import QwenVideoProcessor, decode_jpeg_frames
from gateway.tokenizer.bundled import default_tokenizer_dir

from .test_vision import IMAGE_HOST, PROCESSOR, ImageServer, data_uri, png

cv2 = pytest.importorskip("cv2")
MODEL = "qwen2-vl-video-sim"
QWEN3_MODEL = "qwen3-vl-video-sim"  # chaos/sim_engine/vision_qwen3.py: timestamps in the prompt
VIDEO_PROCESSOR = QwenVideoProcessor(placeholder_id=151656, min_pixels=56 * 56, max_pixels=28 * 28 * 64)  # the sim's


def frame(width: int, height: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)


def jpeg_frames(count: int, width: int, height: int, seed: int = 0, sizes: "list[tuple[int, int]] | None" = None
                ) -> str:
    parts = []
    for k, (w, h) in enumerate(sizes or [(width, height)] * count):
        out = io.BytesIO()
        Image.fromarray(frame(w, h, seed + k)).save(out, "JPEG", quality=90)
        parts.append(base64.b64encode(out.getvalue()).decode())
    return "data:video/jpeg;base64," + ",".join(parts)


def mp4(count: int, width: int, height: int) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "v.mp4")
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (width, height))
        for k in range(count):
            writer.write(frame(width, height, 100 + k))
        writer.release()
        return open(path, "rb").read()


def video_tokens(url: str) -> int:
    frames = decode_jpeg_frames(url.partition(",")[2].encode(), 32, 1.0, 10 ** 8, 10 ** 9).frames
    return VIDEO_PROCESSOR.process(frames, False).tokens


@pytest.fixture(scope="module")
def engines(log_dir):
    started = [EngineProcess(["--vision", "--model-name", MODEL, "--zero-cost", "--services", "vllm"], log_dir,
                             "video-vllm"),
               EngineProcess(["--vision", "--model-name", "sglang-vision", "--zero-cost", "--services", "sglang"],
                             log_dir, "video-sglang"),
               EngineProcess(["--model-name", "text-sim", "--zero-cost"], log_dir, "video-text"),
               EngineProcess(["--vision", "--vision-family", "qwen3_vl", "--model-name", QWEN3_MODEL, "--zero-cost",
                              "--services", "vllm"], log_dir, "video-qwen3")]
    yield started
    for e in started:
        e.stop()


CRASH = (Path(__file__).parents[1] / "unit" / "video_decoder_crash.avi").read_bytes()  # (test_video.py's unit test)


@pytest.fixture(scope="module")
def server():
    served = ImageServer(IMAGE_HOST, {"/clip.mp4": ("video/mp4", mp4(40, 96, 64)),
                                      "/crash.avi": ("video/x-msvideo", CRASH),
                                      "/large.mp4": ("video/mp4", os.urandom(400_000))})
    yield served
    served.close()


@pytest.fixture(scope="module")
def client(engines, log_dir):
    node = NodeProcess(["--worker-urls", *(e.url for e in engines), "--media-max-videos", "2",
                        "--media-max-video-bytes", "300000", "--max-payload-size", "4000000",
                        "--media-allowed-hosts", f"{IMAGE_HOST}/32", "--media-fetch-timeout-secs", "5",
                        "--media-trust-request-kwargs"],
                       log_dir, "video-node")
    yield openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
    node.stop()


def ask(client, videos=(), images=(), model=MODEL, **kwargs):
    content = [{"type": "video_url", "video_url": {"url": url}} for url in videos] + \
        [{"type": "image_url", "image_url": {"url": url}} for url in images] + [{"type": "text", "text": "What?"}]
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=8, **kwargs)


FIVE, THREE = jpeg_frames(5, 120, 90), jpeg_frames(3, 200, 60, seed=9)


def test_a_video_is_counted_as_its_processor_counts_it_and_changes_the_answer(client):
    plain, five, three = ask(client), ask(client, [FIVE]), ask(client, [THREE])
    # Each video's tokens, and its <|vision_start|> and <|vision_end|>.
    assert five.usage.prompt_tokens - plain.usage.prompt_tokens == video_tokens(FIVE) + 2
    assert three.usage.prompt_tokens - plain.usage.prompt_tokens == video_tokens(THREE) + 2
    assert video_tokens(FIVE) == 3 * 12  # 5 frames padded to 6: 3 steps of 3 x 4 merged patches (112 x 84 a frame)
    answers = {r.choices[0].message.content for r in (plain, five, three)}
    assert len(answers) == 3  # each video reached the engine
    assert ask(client, [FIVE]).choices[0].message.content == five.choices[0].message.content
    models = {m.id: m.model_extra["tasks"] for m in client.models.list().data}
    assert models[MODEL] == ["generate", "vision", "video"] and models["text-sim"] == ["generate"]


def test_an_mp4_a_video_beside_an_image_and_streamed(client):
    movie = data_uri(mp4(40, 96, 64), "video/mp4")
    answered = ask(client, [movie])
    plain = ask(client)
    # 4 s at 10 frames a second: 8 frames taken (two a second, vLLM's Qwen2-VL loader), each 84 x 56: 4 steps of 2 x 3
    # merged patches.
    assert answered.usage.prompt_tokens - plain.usage.prompt_tokens == 4 * 6 + 2
    image = data_uri(png(120, 90, 1))
    both = ask(client, [FIVE], [image])
    image_only = ask(client, [], [image])
    assert both.usage.prompt_tokens == image_only.usage.prompt_tokens + video_tokens(FIVE) + 2
    assert both.choices[0].message.content not in (image_only.choices[0].message.content,
                                                   ask(client, [FIVE]).choices[0].message.content)
    chunks = ask(client, [FIVE], [image], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == both.choices[0].message.content
    assert PROCESSOR.max_pixels == 28 * 28 * 64  # (the image's own count is test_vision.py's)


def _refused(client, code: str, videos, model=MODEL) -> str:
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, videos, model=model)
    error = refused.value.body
    assert error["code"] == code, error
    return error["message"]


def test_videos_refused_with_a_400_naming_why(client):
    assert "does not take videos" in _refused(client, "videos_not_supported", [FIVE], model="text-sim")
    assert "sglang" in _refused(client, "videos_not_supported", [FIVE], model="sglang-vision")
    assert "at most 2" in _refused(client, "too_many_videos", [FIVE, THREE, FIVE])
    assert "not a video" in _refused(client, "invalid_video", [data_uri(os.urandom(3000), "video/mp4")])
    mixed = jpeg_frames(2, 0, 0, sizes=[(120, 90), (90, 120)])
    assert "one size" in _refused(client, "invalid_video", [mixed])
    large = data_uri(os.urandom(400_000), "video/mp4")
    assert "larger than 300000 bytes" in _refused(client, "video_too_large", [large])
    assert "not valid base64" in _refused(client, "invalid_video", ["data:video/jpeg;base64,%%%%"])
    # A file that crashes OpenCV's reader (a segmentation fault; in vLLM's own server too): it costs the child
    # process that decodes it, not the node.
    _refused(client, "invalid_video", [data_uri(CRASH, "video/x-msvideo")])
    # The node still answers.
    assert ask(client, [THREE]).choices[0].message.content


def test_a_video_fetched_over_http_is_the_same_video(client, server):
    fetched = ask(client, [f"{server.url}/clip.mp4"])
    sent = ask(client, [data_uri(mp4(40, 96, 64), "video/mp4")])
    assert fetched.usage.prompt_tokens == sent.usage.prompt_tokens
    assert fetched.choices[0].message.content == sent.choices[0].message.content
    assert ask(client, [f"{server.url}/redirect?to=/clip.mp4"]).choices[0].message.content == \
        sent.choices[0].message.content  # a redirect among the allowed hosts is followed


@pytest.mark.parametrize("url, code, says", [
    ("http://127.0.0.3:{port}/clip.mp4", "video_url_not_allowed", ""),  # not listed
    ("http://127.0.0.1:{port}/clip.mp4", "video_url_not_allowed", ""),  # loopback, not listed
    ("http://169.254.169.254/latest/meta-data/", "video_url_not_allowed", ""),  # the cloud metadata address
    ("http://[::1]:80/v.mp4", "video_url_not_allowed", ""),
    ("{url}/redirect?to=http://127.0.0.1:{port}/clip.mp4", "video_url_not_allowed", ""),  # a redirect out
    ("{url}/large.mp4", "video_too_large", "larger than 300000 bytes"),  # its length said, refused before reading
    ("{url}/endless", "video_too_large", "larger than 300000 bytes"),  # no length: counted as it arrives
    ("{url}/missing.mp4", "video_fetch_failed", "answered 404"),
    ("{url}/crash.avi", "invalid_video", ""),  # the decoder's crash costs its child process, not the node
    ("ftp://127.0.0.2/v.mp4", "invalid_video_url", ""),
])
def test_video_fetches_the_rules_refuse(client, server, url, code, says):
    url = url.format(url=server.url, port=server.server.server_address[1])
    assert says in _refused(client, code, [url])
    assert ask(client, [THREE]).choices[0].message.content  # the node still answers


def _times_tokens(*seconds: str) -> int:
    """Tokens of each temporal patch's time as Qwen3-VL writes it ("<0.5 seconds>"), tokenized on its own."""
    import tokenizers
    tokenizer = tokenizers.Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    return sum(len(tokenizer.encode(f"<{second} seconds>", add_special_tokens=False).ids) for second in seconds)


def test_a_qwen3_vl_video_carries_each_temporal_patchs_time_and_the_engine_takes_it(client):
    # The simulated Qwen3-VL refuses a video whose range is not, per temporal patch, its time as text, then
    # <|vision_start|>, its tokens and <|vision_end|> (vLLM's get_video_repl), or whose video tokens are not the
    # grid's count; the figures below are worked by hand from its configs.
    plain = ask(client, model=QWEN3_MODEL)
    five = ask(client, [FIVE], model=QWEN3_MODEL)
    # 5 JPEG frames of 120 x 90 at vLLM's 1 a second, padded to 6: 3 temporal patches at 0.5, 2.5 and 4.0 s (the
    # last pairs frame 4 with itself); each frame 128 x 96: 4 x 3 merged patches of 32, 12 tokens.
    assert five.usage.prompt_tokens - plain.usage.prompt_tokens == _times_tokens("0.5", "2.5", "4.0") + 3 * 14 + 2
    movie = ask(client, [data_uri(mp4(40, 96, 64), "video/mp4")], model=QWEN3_MODEL)
    # 4 s at 10 frames a second: 8 frames, first to last (vLLM's qwen3_vl loader: 0, 6, 11, 17, 22, 28, 33, 39), in
    # 4 temporal patches at 0.3, 1.4, 2.5 and 3.6 s; each frame 96 x 64: 3 x 2 merged patches, 6 tokens.
    assert movie.usage.prompt_tokens - plain.usage.prompt_tokens == _times_tokens("0.3", "1.4", "2.5", "3.6") + \
        4 * 8 + 2
    larger = ask(client, [jpeg_frames(4, 320, 240)], model=QWEN3_MODEL)
    # The video processor's own bounds (video_preprocessor_config.json, not the images'): 4 frames of 320 x 240 are
    # over its 262,144 pixels in all, so each frame becomes 288 x 192 (9 x 6 merged patches, 54 tokens) in 2 patches.
    assert larger.usage.prompt_tokens - plain.usage.prompt_tokens == _times_tokens("0.5", "2.5") + 2 * 56 + 2
    assert len({plain.choices[0].message.content, five.choices[0].message.content,
                movie.choices[0].message.content}) == 3  # each video reached the engine
    image = data_uri(png(120, 90, 1))
    both = ask(client, [FIVE], [image], model=QWEN3_MODEL)
    image_only = ask(client, [], [image], model=QWEN3_MODEL)
    assert both.usage.prompt_tokens - image_only.usage.prompt_tokens == five.usage.prompt_tokens - \
        plain.usage.prompt_tokens
    chunks = ask(client, [FIVE], [image], model=QWEN3_MODEL, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == both.choices[0].message.content
    one_frame = jpeg_frames(1, 120, 90)
    assert "at least 2" in _refused(client, "invalid_video", [one_frame], model=QWEN3_MODEL)
    models = {m.id: m.model_extra["tasks"] for m in client.models.list().data}
    assert models[QWEN3_MODEL] == ["generate", "vision", "video"]


def test_a_requests_media_io_and_processor_kwargs_load_and_size_its_videos(client):
    # Trusted by this node (--media-trust-request-kwargs; untrusted they are a 400: test_vision_gemma3.py), vLLM's
    # media_io_kwargs say how a request's videos load: a JPEG frame list's first num_frames frames, a file's rate.
    plain = ask(client)
    three = ask(client, [FIVE], extra_body={"media_io_kwargs": {"video": {"num_frames": 3}}})
    first_three = ask(client, [jpeg_frames(3, 120, 90)])  # FIVE's first three frames, sent alone
    assert three.usage.prompt_tokens == first_three.usage.prompt_tokens < ask(client, [FIVE]).usage.prompt_tokens
    assert three.choices[0].message.content == first_three.choices[0].message.content
    movie = data_uri(mp4(40, 96, 64), "video/mp4")
    slow = ask(client, [movie], extra_body={"media_io_kwargs": {"video": {"fps": 1}}})
    # 4 s at one frame a second: the loader's least, 4 frames (8 at its own two a second): 2 steps of 2 x 3.
    assert slow.usage.prompt_tokens - plain.usage.prompt_tokens == 2 * 6 + 2
    with pytest.raises(openai.BadRequestError, match="'max_frames' is not applied") as caught:
        ask(client, [movie], extra_body={"media_io_kwargs": {"video": {"max_frames": 4}}})
    assert caught.value.body["param"] == "media_io_kwargs"
    # Qwen3-VL's videos take mm_processor_kwargs' pixel bounds over the whole video, as vLLM folds them into its
    # video processor's size: 4 frames of 320 x 240 within 16,384 pixels in all are 32 x 64 each (2 tokens), in 2
    # temporal patches (the sim checks the grid against the tokens).
    qwen3_plain = ask(client, model=QWEN3_MODEL)
    for kwargs in ({"videos_kwargs": {"max_pixels": 4 * 64 * 64}}, {"max_pixels": 4 * 64 * 64},
                   {"size": {"longest_edge": 4 * 64 * 64}}):
        bounded = ask(client, [jpeg_frames(4, 320, 240)], model=QWEN3_MODEL,
                      extra_body={"mm_processor_kwargs": kwargs})
        assert bounded.usage.prompt_tokens - qwen3_plain.usage.prompt_tokens == \
            _times_tokens("0.5", "2.5") + 2 * 4 + 2, kwargs
    with pytest.raises(openai.BadRequestError, match="'fps' is not applied"):
        ask(client, [FIVE], model=QWEN3_MODEL, extra_body={"mm_processor_kwargs": {"videos_kwargs": {"fps": 1}}})

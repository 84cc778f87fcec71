"""Images in, for vision models (issue 37): a real node, a simulated Qwen2-VL-style engine (chaos/sim_engine/
vision.py checks every tensor against the prompt and folds the images into its answer), the openai and
anthropic SDKs, and a real HTTP image server on 127.0.0.2 for the fetches.

What is checked: chat image_url (data: and http), Responses input_image, Messages image blocks; usage counting
the image tokens the model's processor makes; different images, different answers (same image, same answer);
the fetch rules as attacks: hosts not allowed, private and loopback addresses, a redirect out of the allowed
hosts, oversized and slow images, decompression bombs, not-images, too many images; a text model refusing
images; tokenize counting them; streaming."""

from __future__ import annotations

import base64
import dataclasses
import http.server
import io
import socket
import struct
import threading
import time
import zlib

import anthropic
import httpx2
import numpy as np
import openai
import pytest
from PIL import Image

from chaos.processes import EngineProcess, NodeProcess

from gateway.media.processors import QwenVisionProcessor

MODEL = "qwen2-vl-sim"
IMAGE_HOST = "127.0.0.2"  # allowed by network; 127.0.0.3 is not
PROCESSOR = QwenVisionProcessor(placeholder_id=151655, max_pixels=28 * 28 * 64)  # the sim's published config


def png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8)).save(out, "PNG")
    return out.getvalue()


def family_client(log_dir, family: str, services: "dict[str, str]", node_name: str):
    """(a generator fixture's body) The openai client of a node in front of simulated engines of a vision family,
    one per service (model name: "vllm" or "sglang"); stopped after."""
    engines = [EngineProcess(["--vision", "--vision-family", family, "--model-name", name, "--zero-cost",
                              "--services", service], log_dir, name) for name, service in services.items()]
    node = NodeProcess(["--worker-urls", *(e.url for e in engines)], log_dir, node_name)
    try:
        yield openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
    finally:
        node.stop()
        for e in engines:
            e.stop()


def tiles_counted_and_answered(client, model: str, tiled: int, single: int, small: bytes) -> None:
    """For a tiling family (Llama 4, InternVL): RED and BLUE take ``tiled`` more prompt tokens than the text alone,
    ``small`` (one tile) ``single`` more, both in one request the sum; each request's answer is its own (the
    images reached the engine), and the two streamed give the whole answer."""
    from .test_vision_gemma3 import ask  # (here: that module imports this one; this one has an ask of its own)
    text_only, red, blue, one, mixed = (
        ask(client, model), ask(client, model, data_uri(RED)), ask(client, model, data_uri(BLUE)),
        ask(client, model, data_uri(small)), ask(client, model, data_uri(RED), data_uri(small)))
    assert red.usage.prompt_tokens - text_only.usage.prompt_tokens == tiled
    assert blue.usage.prompt_tokens == red.usage.prompt_tokens
    assert one.usage.prompt_tokens - text_only.usage.prompt_tokens == single
    assert mixed.usage.prompt_tokens - text_only.usage.prompt_tokens == tiled + single
    assert len({r.choices[0].message.content for r in (text_only, red, blue, one, mixed)}) == 5
    chunks = ask(client, model, data_uri(RED), data_uri(small), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == mixed.choices[0].message.content


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_tokens(data: bytes) -> int:
    return PROCESSOR.process(Image.open(io.BytesIO(data)).convert("RGB"), False).tokens


def bomb() -> bytes:
    """A PNG whose header claims 30,000 x 30,000 pixels."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


RED, BLUE = png(120, 90, 1), png(300, 200, 2)


class ImageServer:
    """A real HTTP server on an address of its own, serving images, redirects, slow and large answers."""

    def __init__(self, host: str, more: "dict[str, tuple[str, bytes]] | None" = None) -> None:
        routes = {"/red.png": RED, "/blue.png": BLUE, "/bomb.png": bomb(), "/text": b"hello, not an image",
                  "/large.png": png(600, 600, 3)}
        kinds = {path: kind for path, (kind, _) in (more or {}).items()}
        routes.update({path: body for path, (_, body) in (more or {}).items()})

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path
                if path.startswith("/redirect?to="):
                    self.send_response(302)
                    self.send_header("location", path.split("=", 1)[1])
                    self.end_headers()
                    return
                if path == "/slow.png":
                    time.sleep(3)
                if path == "/endless":  # no length said, bytes until the reader goes (or 64 MiB)
                    self.send_response(200)
                    self.send_header("content-type", "application/octet-stream")
                    self.end_headers()
                    try:
                        for _ in range(1024):
                            self.wfile.write(b"\0" * 65536)
                    except OSError:
                        pass
                    return
                body = routes.get(path, RED if path == "/slow.png" else None)
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("content-type", kinds.get(path, "image/png"))
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def images():
    servers = ImageServer(IMAGE_HOST), ImageServer("127.0.0.3")
    yield servers
    for s in servers:
        s.close()


@pytest.fixture(scope="module")
def engines(log_dir):
    started = [EngineProcess(["--vision", "--model-name", MODEL, "--zero-cost", "--services", "vllm"], log_dir,
                             "vision-vllm"),
               EngineProcess(["--model-name", "text-sim", "--zero-cost"], log_dir, "vision-text")]
    yield started
    for e in started:
        e.stop()


@pytest.fixture(scope="module")
def node(engines, log_dir):
    n = NodeProcess(["--worker-urls", *(e.url for e in engines), "--media-allowed-hosts", f"{IMAGE_HOST}/32",
                     "localhost", "--media-max-image-bytes", "200000", "--media-fetch-timeout-secs", "1",
                     "--media-max-images", "3", "--max-payload-size", "4000000", "--media-trust-request-kwargs"],
                    log_dir, "vision-node")
    yield n
    n.stop()


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)


def ask(client, *images: str, text: str = "What is in the picture?", **kwargs):
    content = [{"type": "image_url", "image_url": {"url": url}} for url in images] + [{"type": "text", "text": text}]
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=8, **kwargs)


def test_an_image_in_a_chat_is_counted_and_changes_the_answer(client, node):
    plain = client.chat.completions.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    red, blue = ask(client, data_uri(RED)), ask(client, data_uri(BLUE))
    assert red.choices[0].message.content != blue.choices[0].message.content  # the images reach the engine
    assert ask(client, data_uri(RED)).choices[0].message.content == red.choices[0].message.content
    both = ask(client, data_uri(RED), data_uri(BLUE))
    assert both.choices[0].message.content not in (red.choices[0].message.content, blue.choices[0].message.content)
    # The prompt holds each image's tokens, as many as the model's processor says (the engine checked the ranges).
    assert red.usage.prompt_tokens - blue.usage.prompt_tokens == image_tokens(RED) - image_tokens(BLUE)
    assert both.usage.prompt_tokens == red.usage.prompt_tokens + image_tokens(BLUE) + 2  # its <|vision_start|>, _end|>
    assert plain.usage.prompt_tokens < red.usage.prompt_tokens
    models = {m.id: m.model_extra["tasks"] for m in client.models.list().data}
    assert models == {MODEL: ["generate", "vision", "video"], "text-sim": ["generate"]}  # (the sim is a Qwen2-VL)


def test_a_requests_pixel_bounds_resize_the_image_as_the_processor_would(client):
    # vLLM's mm_processor_kwargs for Qwen-VL (trusted by this node): the image kept within max_pixels, so fewer
    # tokens (the engine checks the grid against the range); an unknown setting is a 400, not an answer otherwise.
    large = data_uri(png(200, 150, 7))
    bounded = ask(client, large, extra_body={"mm_processor_kwargs": {"max_pixels": 28 * 28 * 16}})
    in_images = ask(client, large, extra_body={"mm_processor_kwargs": {"images_kwargs": {"max_pixels": 28 * 28 * 16}}})
    plain = ask(client, large)
    small = dataclasses.replace(PROCESSOR, max_pixels=28 * 28 * 16)
    tokens = small.process(Image.open(io.BytesIO(png(200, 150, 7))).convert("RGB"), False).tokens
    assert plain.usage.prompt_tokens - bounded.usage.prompt_tokens == image_tokens(png(200, 150, 7)) - tokens > 0
    assert in_images.usage.prompt_tokens == bounded.usage.prompt_tokens
    assert bounded.choices[0].message.content != plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="'fps' is not applied") as caught:
        ask(client, large, extra_body={"mm_processor_kwargs": {"fps": 2}})
    assert caught.value.body["param"] == "mm_processor_kwargs"


def test_streamed_and_fetched_over_http_from_an_allowed_host(client, images):
    allowed = images[0]
    fetched = ask(client, f"{allowed.url}/red.png")
    assert fetched.choices[0].message.content == ask(client, data_uri(RED)).choices[0].message.content
    chunks = list(ask(client, f"{allowed.url}/blue.png", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        ask(client, data_uri(BLUE)).choices[0].message.content
    # A redirect that stays among the allowed hosts is followed.
    assert ask(client, f"{allowed.url}/redirect?to=/red.png").choices[0].message.content == \
        fetched.choices[0].message.content


@pytest.mark.parametrize("url, code", [
    ("{other}/red.png", "image_url_not_allowed"),  # 127.0.0.3: not listed
    ("http://127.0.0.1:1/red.png", "image_url_not_allowed"),  # loopback, not listed
    ("http://localhost:{port}/red.png", "image_url_not_allowed"),  # a listed name resolving to loopback
    ("http://[::1]:80/x.png", "image_url_not_allowed"),
    ("http://169.254.169.254/latest/meta-data/", "image_url_not_allowed"),  # the cloud metadata address
    ("http://10.0.0.1/x.png", "image_url_not_allowed"),
    ("{allowed}/redirect?to={other}/red.png", "image_url_not_allowed"),  # a redirect out of the allowed hosts
    ("{allowed}/redirect?to=http://127.0.0.1:{port}/red.png", "image_url_not_allowed"),
    ("{allowed}/large.png", "image_too_large"),  # over --media-max-image-bytes
    ("{allowed}/bomb.png", "invalid_image"),  # 900 M pixels claimed in a few bytes
    ("{allowed}/text", "invalid_image"),
    ("{allowed}/missing.png", "image_fetch_failed"),
    ("ftp://127.0.0.2/x.png", "invalid_image_url"),
    ("http://user:pass@127.0.0.2/x.png", "invalid_image_url"),
    ("data:image/png;base64,@@@", "invalid_image_url"),
    ("data:image/png,plain", "invalid_image_url"),
])
def test_fetches_the_rules_refuse(client, images, url, code):
    allowed, other = images
    url = url.format(allowed=allowed.url, other=other.url, port=allowed.server.server_address[1])
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, data_uri(RED), url)
    assert e.value.body["code"] == code, e.value.body
    assert e.value.body["param"] == "messages[0].content[1]"


def test_a_slow_image_times_out_without_holding_the_request(client, images):
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e:
        ask(client, f"{images[0].url}/slow.png")
    assert e.value.status_code == 504 and e.value.body["code"] == "image_fetch_timeout"
    assert time.monotonic() - started < 2.5  # --media-fetch-timeout-secs 1


def test_too_many_images_and_a_text_model_are_refused(client):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, *[data_uri(RED)] * 4)  # --media-max-images 3
    assert e.value.body["code"] == "too_many_images"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="text-sim", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_uri(RED)}}]}])
    assert e.value.body["code"] == "images_not_supported"


def test_each_engine_gets_the_pixels_it_takes_and_the_engines_bounds_hold(log_dir):
    # One model on two engines: one normalizes on its device (uint8 pixels in, vLLM's default for Qwen-VL), one
    # takes floats; each checks the form (the other would be normalized twice, or not at all: garbage, silently,
    # on a real one). Their bounds (GetServerInfo): the lower holds, refused here, not by an engine.
    raw = EngineProcess(["--vision", "--model-name", "mixed-vl", "--zero-cost", "--services", "vllm",
                         "--vision-images-max", "2", "--vision-image-tokens-max", "40"], log_dir, "vision-raw")
    floats = EngineProcess(["--vision", "--model-name", "mixed-vl", "--zero-cost", "--services", "vllm",
                            "--vision-takes-floats", "--vision-images-max", "3"], log_dir, "vision-floats")
    node = NodeProcess(["--worker-urls", raw.url, floats.url, "--policy", "round_robin"], log_dir, "vision-mixed")
    try:
        mixed = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)

        def ask_mixed(*images: str):
            content = [{"type": "image_url", "image_url": {"url": url}} for url in images]
            return mixed.chat.completions.create(model="mixed-vl", max_tokens=4,
                                                 messages=[{"role": "user", "content": content}])
        assert image_tokens(RED) <= 40 < image_tokens(BLUE)
        answers = [ask_mixed(data_uri(RED), data_uri(RED)).choices[0].message.content for _ in range(4)]
        assert len(set(answers)) == 2  # round robin: each engine twice, each its own form (and so its own answer)
        with pytest.raises(openai.BadRequestError) as e:
            ask_mixed(*[data_uri(RED)] * 3)
        assert e.value.body["code"] == "too_many_images" and "at most 2" in e.value.body["message"]
        with pytest.raises(openai.BadRequestError) as e:
            ask_mixed(data_uri(BLUE))
        assert e.value.body["code"] == "image_too_large" and e.value.body["param"] == "messages[0].content[0]"
    finally:
        node.stop()
        raw.stop()
        floats.stop()


def test_responses_input_image_and_messages_image_blocks(client, node):
    chat = ask(client, data_uri(RED), text="Describe it.").choices[0].message.content
    response = client.responses.create(model=MODEL, max_output_tokens=8, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": data_uri(RED)}, {"type": "input_text", "text": "Describe it."}]}])
    assert response.output_text == chat
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input=[{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-123"}]}])
    assert e.value.body["code"] == "unsupported_value"
    messages = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0)
    reply = messages.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(RED).decode()}},
        {"type": "text", "text": "Describe it."}]}])
    assert reply.content[0].text == chat
    count = messages.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(RED).decode()}},
        {"type": "text", "text": "Describe it."}]}])
    assert count.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens


def test_tokenize_counts_the_image_tokens(node):
    def count(content):
        r = httpx2.post(node.url + "/v1/tokenize", json={"model": MODEL, "messages": [
            {"role": "user", "content": content}]})
        assert r.status_code == 200, r.text
        return r.json()["count"]
    text = count([{"type": "text", "text": "x"}])
    assert count([{"type": "image_url", "image_url": {"url": data_uri(RED)}}, {"type": "text", "text": "x"}]) == \
        text + image_tokens(RED) + 2  # <|vision_start|>, the pads, <|vision_end|>


def test_a_port_that_never_answers_and_the_metrics(node):
    # (An allowed address where nothing listens: a clear error, fast.)
    sock = socket.socket()
    sock.bind((IMAGE_HOST, 0))
    port = sock.getsockname()[1]
    sock.close()
    r = httpx2.post(node.url + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"http://{IMAGE_HOST}:{port}/x"}}]}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "image_fetch_failed"
    metrics = httpx2.get(node.url + "/metrics").text
    assert 'smg_media_images_total{step="processed"}' in metrics and 'smg_media_refused_total{code=' in metrics

"""Issue 59: images were first come, first served across tenants, and a request's image bytes were checked only
as each fetch completed. Performed against a real node and real HTTP servers:

- one tenant's requests full of large-but-legal PNGs held every media thread while another tenant's small image
  waited behind all of them (30.3 s); now it waits for about one decode;
- one tenant's slow image servers (a byte a second) held the shared fetch connections, so another tenant's fetch
  took 9.6 s of its 10 s; now a tenant holds at most its share of them;
- 16 URLs of ~20 MiB were fetched at once and their 64 MiB total checked only as each completed (six refused
  requests left the node +1.1 GiB); now the total counts what is in flight, declared lengths at once.
"""

from __future__ import annotations

import base64
import http.server
import io
import threading
import time

import httpx2
import pytest
from PIL import Image

from chaos.processes import EngineProcess, NodeProcess
from tests.support.waiting import eventually

MODEL = "qwen2-vl-sim"
HOST = "127.0.0.2"
KEY_A, KEY_B = "sk-tenant-a-0123456789abcdef", "sk-tenant-b-0123456789abcdef"
BIG_BYTES = 20 * 1024 * 1024 - 1  # an image at --media-max-image-bytes' default


def solid_png(side: int, shade: int) -> bytes:
    """A PNG that is small to send and slow to decode (side x side pixels of one colour)."""
    out = io.BytesIO()
    Image.new("RGB", (side, side), (shade, 255 - shade, 40)).save(out, "PNG")
    return out.getvalue()


def data_uri(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


class Images:
    """/slow.png: a byte a second; /small.png: at once; /big.png: 20 MiB declared, sent in 1 MiB pieces a tenth of
    a second apart; /big-chunked.png: the same without a length. ``sent`` counts what each path wrote."""

    def __init__(self) -> None:
        small = solid_png(64, 7)
        self.sent: dict[str, int] = {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _write(self, data: bytes) -> None:
                self.wfile.write(data)
                key = self.path.split("?")[0]
                owner.sent[key] = owner.sent.get(key, 0) + len(data)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                self.send_response(200)
                self.send_header("content-type", "image/png")
                try:
                    if path == "/small.png":
                        self.send_header("content-length", str(len(small)))
                        self.end_headers()
                        self._write(small)
                    elif path == "/slow.png":
                        self.send_header("content-length", "1000")
                        self.end_headers()
                        for _ in range(1000):
                            self._write(b"\0")
                            time.sleep(1)
                    elif path in ("/big.png", "/big-chunked.png"):
                        chunked = path == "/big-chunked.png"
                        if chunked:
                            self.send_header("transfer-encoding", "chunked")
                        else:
                            self.send_header("content-length", str(BIG_BYTES))
                        self.end_headers()
                        left = BIG_BYTES
                        while left:
                            piece = b"\0" * min(left, 1 << 20)
                            self._write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                            left -= len(piece)
                            time.sleep(0.1)
                        if chunked:
                            self._write(b"0\r\n\r\n")
                except OSError:
                    pass
                self.close_connection = True

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def images():
    server = Images()
    yield server
    server.close()


@pytest.fixture(scope="module")
def node(log_dir):
    engine = EngineProcess(["--vision", "--model-name", MODEL, "--zero-cost", "--services", "vllm"], log_dir,
                           "fair-vision")
    n = NodeProcess(["--worker-urls", engine.url, "--media-allowed-hosts", f"{HOST}/32", "--media-threads", "1",
                     "--media-fetch-connections", "32", "--media-fetch-connections-per-tenant", "16",
                     "--media-fetch-timeout-secs", "6", "--media-cache-bytes", "0", "--max-payload-size", "16000000",
                     "--tenant-api-key", f"a:{KEY_A}", f"b:{KEY_B}"], log_dir, "fair-node")
    yield n
    n.stop()
    engine.stop()


def _ask(node, key: str, urls: "list[str]", timeout_s: float = 120) -> httpx2.Response:
    content = [{"type": "image_url", "image_url": {"url": url}} for url in urls] + [{"type": "text", "text": "?"}]
    return httpx2.post(node.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                       timeout=timeout_s, json={"model": MODEL, "max_tokens": 4,
                                                "messages": [{"role": "user", "content": content}]})


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def _in_background(call) -> "tuple[threading.Thread, list]":
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def _metric(node, name: str, label: str) -> float:
    for line in httpx2.get(node.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name) and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_another_tenants_image_waits_for_one_decode_not_for_a_queue(node, images):
    heavy = [[data_uri(solid_png(3000, 16 * r + i)) for i in range(8)] for r in range(2)]  # 16 decodes, 1 thread
    started = time.monotonic()
    attacks = [_in_background(lambda batch=batch: _ask(node, KEY_A, batch)) for batch in heavy]
    eventually(lambda: _metric(node, "smg_media_waiting", 'pool="threads"') >= 8, 60,  # queued behind the thread
               "tenant a's decodes never queued", interval_s=0.02)
    asked = time.monotonic()
    r = _ask(node, KEY_B, [data_uri(solid_png(64, 3))])
    b_s = time.monotonic() - asked
    for thread, _ in attacks:
        thread.join(120)
    a_s = time.monotonic() - started
    assert r.status_code == 200 and all(out[0].status_code == 200 for _, out in attacks)
    # First come, first served, b would have waited for most of a's 16 decodes; in turn, it waits for about one.
    assert b_s < a_s / 4, f"tenant b waited {b_s:.2f} s while tenant a's 16 decodes took {a_s:.2f} s"


def test_one_tenants_slow_servers_leave_the_other_tenants_share_of_the_connections(node, images):
    slow = [_in_background(lambda r=r: _ask(node, KEY_A, [f"{images.url}/slow.png?{r}-{i}" for i in range(16)], 30))
            for r in range(2)]  # 32 fetches: first come, first served, they would take all 32 connections
    eventually(lambda: _metric(node, "smg_media_waiting", 'pool="fetches"') >= 16, 30,
               "tenant a's fetches never queued", interval_s=0.02)
    assert _metric(node, "smg_media_slots_in_use", 'pool="fetches"') == 16  # its share: 16 of 32
    asked = time.monotonic()
    r = _ask(node, KEY_B, [f"{images.url}/small.png"])
    assert r.status_code == 200 and time.monotonic() - asked < 3  # not behind a's fetches (6 s each)
    for thread, out in slow:
        thread.join(40)
        assert out[0].status_code == 504  # a's slow images time out, as before (waiting for a slot included)


@pytest.mark.parametrize("path", ["/big.png", "/big-chunked.png"])
def test_a_requests_image_bytes_are_bounded_while_they_arrive(node, images, path):
    before = _rss_bytes(node.process.pid)
    sent_before = images.sent.get(path, 0)
    for attempt in range(3):
        r = _ask(node, KEY_A, [f"{images.url}{path}?{attempt}-{i}" for i in range(16)], 60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "images_too_large", r.text
    grown = _rss_bytes(node.process.pid) - before
    sent = (images.sent.get(path, 0) - sent_before) / 3
    # 16 x 20 MiB could arrive before; now at most the request's 64 MiB is read (declared lengths: none needed).
    assert sent < 80 * 2 ** 20, f"{sent / 2 ** 20:.0f} MiB sent a request"
    assert grown < 200 * 2 ** 20, f"the node grew {grown / 2 ** 20:.0f} MiB"
    assert _metric(node, "smg_media_bytes_in_flight", "") == 0

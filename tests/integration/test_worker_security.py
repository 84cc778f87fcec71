"""Attacks through the worker registry and the proxy, on real processes: registering a "worker" at the
node's own admin endpoint, and clients' credentials reaching a worker."""

from __future__ import annotations

import http.server
import json
import threading

import httpx2
import openai
import pytest

from chaos.processes import NodeProcess


class _RecordingWorker(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible worker that remembers the headers of every request it gets."""

    seen: list[dict[str, str]] = []

    def log_message(self, *args) -> None:
        pass

    def _answer(self, value: dict) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        self._answer({"object": "list", "data": [{"id": "rec-model", "object": "model"}]}
                     if self.path == "/v1/models" else {"status": "ok"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        self._answer({"id": "c", "object": "chat.completion", "created": 0, "model": "rec-model",
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": "hi"}}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


@pytest.fixture
def recording_worker():
    _RecordingWorker.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingWorker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_client_credentials_never_reach_a_worker_and_its_own_key_does(recording_worker, log_dir):
    node = NodeProcess(["--worker-urls", recording_worker, "--worker-api-key", "worker-own-key"], log_dir,
                       "cred-node")
    try:
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="client-secret-key", max_retries=0,
                               default_headers={"x-api-key": "client-secret-2", "cookie": "session=client-cookie"})
        reply = client.chat.completions.create(model="rec-model", messages=[{"role": "user", "content": "x"}])
        assert reply.choices[0].message.content == "hi"
        posted = [h for h in _RecordingWorker.seen if "content-type" in h]
        assert posted, _RecordingWorker.seen
        for headers in _RecordingWorker.seen:
            text = json.dumps(headers)
            assert "client-secret" not in text and "client-cookie" not in text, headers
            assert headers.get("authorization") == "Bearer worker-own-key"
        listed = httpx2.get(node.url + "/workers", headers=node.admin_headers).text
        assert "worker-own-key" not in listed  # the worker's key is never shown
    finally:
        node.kill()


def test_a_worker_url_with_a_path_is_refused_and_the_admin_endpoint_stays_closed(node, http):
    admin = "127.0.0.1:17373"
    for url in (f"http://{admin}/v1/keyring/install?", f"http://{admin}/v1/leave?a", f"http://{admin}?"):
        r = http.post("/workers", json={"url": url})
        assert r.status_code == 400 and r.json()["error"]["code"] == "worker_error", r.text


def test_the_control_plane_is_closed_without_the_admin_key(node):
    for method, path, body in (("DELETE", "/workers/w-anything", None), ("POST", "/workers", {"url": "grpc://x:1"}),
                               ("PUT", "/admin/rate-limits", {"limits": []}), ("GET", "/workers", None)):
        for headers in ({}, {"authorization": "Bearer unused"}):
            r = httpx2.request(method, node.url + path, json=body, headers=headers, timeout=10)
            assert r.status_code == 401, (method, path, r.text)
            assert r.headers["www-authenticate"].startswith('Bearer realm="smg-node"')
            assert r.json()["error"]["code"] in ("missing_api_key", "invalid_api_key")


def test_the_node_itself_is_refused_as_its_own_worker(node, http):
    port = node.url.rpartition(":")[2]
    for url in (node.url, f"http://localhost:{port}", f"http://[::1]:{port}", node.url + "/"):
        r = http.post("/workers", json={"url": url})
        assert r.status_code == 400 and r.json()["error"]["code"] == "worker_is_this_node", (url, r.text)
    assert all(w["url"] != node.url for w in http.get("/workers").json()["workers"])

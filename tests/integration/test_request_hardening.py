"""Issue 33's low findings, performed against real nodes: two Authorization headers, Content-Length with chunked
through hypercorn, keys on the command lines of a node's processes, tokenizing past a rate limit."""

from __future__ import annotations

import os
import socket

import httpx2
import pytest

from chaos.processes import NodeProcess
from tests.support.waiting import eventually

MODEL = "qwen3-sim"
KEY = "sk-hardening-0123456789abcdef"


def _raw_request(url: str, head: bytes, body: bytes = b"") -> tuple[bytes, bool]:
    """Send ``head`` and ``body`` on a fresh connection; (what came back, whether the server closed it)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return data, True  # closed before (or without) a whole head
            data += chunk
        s.settimeout(2)
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return data, True
                data += chunk
        except TimeoutError:
            return data, False


def _children(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(entry))
    return pids


def _command_line(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def node(log_dir):
    n = NodeProcess(["--sim-engines", "1", "--api-key", KEY], log_dir, "hardening-node")
    yield n
    n.stop()


def test_two_authorization_headers_are_a_400_whichever_comes_last(node):
    body = b'{"model": "qwen3-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
    for first, second in ((b"Bearer wrong-key-123", KEY.encode()), (KEY.encode(), b"Bearer wrong-key-123")):
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                b"authorization: " + first + b"\r\nauthorization: Bearer " + second.removeprefix(b"Bearer ") +
                b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n")
        answer, _ = _raw_request(node.url, head, body)
        assert answer.startswith(b"HTTP/1.1 400") and b"duplicate_credential" in answer


def test_keys_given_as_flags_never_reach_the_command_lines_of_a_nodes_processes(log_dir):
    node = NodeProcess(["--sim-engines", "1", "--workers", "2", "--api-key", KEY], log_dir, "hardening-workers")
    try:
        command_lines = [_command_line(pid) for pid in _children(node.process.pid)]
        gateways = [line for line in command_lines if b"gateway.cli" in line]
        assert len(gateways) == 2 and not any(KEY.encode() in line for line in gateways)
        for _ in range(6):  # both processes (the kernel picks one per connection) know the key
            r = httpx2.post(node.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                            timeout=30)
            assert r.status_code == 200
        assert "can be read by every local user" in node.log_text()
    finally:
        node.stop()


def test_hypercorn_refuses_content_length_with_chunked_and_closes(log_dir):
    node = NodeProcess(["--sim-engines", "1", "--http-server", "hypercorn", "--workers", "1"], log_dir,
                       "hardening-hypercorn")
    try:
        smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        body = b"0\r\n\r\n" + smuggled
        head = (b"POST /v1/tokenize HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            answer, closed = _raw_request(node.url, head, body)
        except ConnectionResetError:  # hypercorn closes with the rest unread: the kernel may reset instead
            answer, closed = b"", True
        assert closed and answer.count(b"HTTP/1.1 ") <= 1  # the connection ended after one answer at most
        assert not answer or (answer.startswith(b"HTTP/1.1 400") and b"ambiguous_framing" in answer)
        # What the node did, from its access log: the POST refused, the request behind it never served.
        eventually(lambda: "POST /v1/tokenize 400" in node.log_text(), 10, "the refused POST in the access log")
        assert "GET /v1/models" not in node.log_text()
    finally:
        node.stop()


def test_tokenizing_counts_against_the_rate_limits(log_dir, tmp_path):
    limits = tmp_path / "limits.toml"
    limits.write_text('[[limits]]\nname = "tokens"\nscope = "api_key"\nunit = "tokens"\nlimit = 2000\n'
                      'window_s = 3600\n')
    node = NodeProcess(["--sim-engines", "1", "--api-key", KEY, "--rate-limits", str(limits)], log_dir,
                       "hardening-limits")
    try:
        statuses = []
        with httpx2.Client(base_url=node.url, headers={"authorization": f"Bearer {KEY}"}, timeout=30) as http:
            for _ in range(4):
                r = http.post("/v1/tokenize", json={"model": MODEL, "prompt": "word " * 600})  # ~600 tokens
                statuses.append(r.status_code)
            counted = http.post("/v1/messages/count_tokens", json={
                "model": MODEL, "messages": [{"role": "user", "content": "word " * 600}]}).status_code
        # 2,000 tokens an hour: three tokenizations fit, the fourth does not, and count_tokens neither.
        assert statuses == [200, 200, 200, 429] and counted == 429
    finally:
        node.stop()

"""What a balancer may take a node out for, and what it may send twice (issue 40), with a real nginx and a real
HAProxy rendered from deploy/'s templates in front of real nodes.

- One model's outage is not a node's: two nodes serve two models on separate simulated engines; the engines of
  one are killed; through either balancer the other model answers every request for the whole fault, and the
  dead model answers 503 naming it. (nginx took both nodes out after two 503s: the live model got 502s.)
- A POST that stores something is not sent twice: a node that stored a turn and died before answering (here a
  proxy in front of a real node that forwards the request, waits for the node's answer, then drops the
  connection) leaves the turn stored once, the client told of a failure; a chat request that met the same fate
  is retried on the other node, as it has no side effect.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess
from deploy.balancer import start_balancer, stop_balancer

from tests.support.real_servers import free_port
from tests.support.nodes import MODEL

OTHER_MODEL = "other-sim"
FAULT_S = 6.0  # longer than nginx's fail_timeout (5 s) and HAProxy's check bound (inter 1 s x fall 2)
FAST_HEALTH = ["--health-check-interval-secs", "0.5", "--health-failure-threshold", "2"]


@pytest.fixture(params=["nginx", "haproxy"])
def lb(request):
    if shutil.which(request.param) is None:
        pytest.skip(f"{request.param} not installed (.ci/run installs it: apt-get install {request.param})")
    return request.param


def balancer(lb: str, prefix, addrs: "list[str]"):
    port = free_port()
    return start_balancer(lb, prefix, port, addrs), f"http://127.0.0.1:{port}"


def test_one_models_outage_leaves_the_other_model_and_every_node_in(lb, log_dir):
    engines = [EngineProcess(["--zero-cost"], log_dir, f"{lb}-model-a"),
               EngineProcess(["--zero-cost", "--model-name", OTHER_MODEL], log_dir, f"{lb}-model-b")]
    nodes, process = [], None
    try:
        nodes = [NodeProcess(["--worker-urls", *[e.url for e in engines], *FAST_HEALTH], log_dir, f"{lb}-two-models{i}")
                 for i in range(2)]
        process, url = balancer(lb, log_dir / f"{lb}-two-models", [n.url.removeprefix("http://") for n in nodes])
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)

        def ask(model: str, i: int):
            return client.chat.completions.create(model=model, messages=[{"role": "user", "content": f"q{i}"}],
                                                  max_tokens=2)

        assert ask(MODEL, 0).choices and ask(OTHER_MODEL, 0).choices
        engines[1].kill()
        live_ok, dead_statuses, i = 0, [], 0
        end = time.monotonic() + FAULT_S
        while time.monotonic() < end:
            i += 1
            assert ask(MODEL, i).usage.completion_tokens == 2  # raises on any error: zero allowed
            live_ok += 1
            with pytest.raises(openai.APIStatusError) as caught:
                ask(OTHER_MODEL, i)
            assert OTHER_MODEL in caught.value.message, caught.value.message  # named
            dead_statuses.append(caught.value.status_code)
            time.sleep(0.02)
        assert set(dead_statuses) == {503} and live_ok >= 20, (set(dead_statuses), live_ok)
        # Every node stayed ready: the outage is the model's, not theirs.
        assert all(httpx2.get(n.url + "/readiness").status_code == 200 for n in nodes)
    finally:
        if process is not None:
            stop_balancer(lb, process)
        for p in (*nodes, *engines):
            p.stop()


class StoresThenDies:
    """A node that did the work and died before answering: forwards each request to ``target`` (a real node)
    and waits for its answer; a POST's answer is then dropped with the connection, anything else is relayed
    (so health checks pass). Counts the POSTs it dropped."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.dropped = 0
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.addr = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._http = httpx2.Client(base_url=target, timeout=30)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # (HAProxy's checks end their connections with a reset)
            self._relay(conn)

    def _relay(self, conn: socket.socket) -> None:
        buffered = b""
        while True:
            while b"\r\n\r\n" not in buffered:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buffered += chunk
            head, _, buffered = buffered.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            length = int({k.lower(): v for k, v in headers.items()}.get("content-length", 0))
            while len(buffered) < length:
                buffered += conn.recv(65536)
            body, buffered = buffered[:length], buffered[length:]
            answer = self._http.request(method, path, content=body, headers={
                k: v for k, v in headers.items() if k.lower() in ("content-type", "authorization")})
            if method == "POST":
                self.dropped += 1
                return  # the node stored it (if it stores) and is gone before answering
            conn.sendall(b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
                answer.status_code, answer.headers.get("content-type", "text/plain").encode(),
                len(answer.content)) + answer.content)

    def close(self) -> None:
        self._listener.close()
        self._http.close()


@pytest.fixture(scope="module")
def node(log_dir):
    engine = EngineProcess(["--zero-cost"], log_dir, "retry-engine")
    n = NodeProcess(["--worker-urls", engine.url], log_dir, "retry-node")
    yield n
    n.stop()
    engine.stop()


def test_a_stored_turn_is_never_sent_twice_and_a_chat_request_is_retried(lb, node, log_dir):
    direct = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
    # A balancer each: nginx takes the dying node out for fail_timeout after its first failure.
    with through_a_dying_node(lb, node, log_dir) as (client, stub):
        conversation = direct.conversations.create()
        failed = []
        for turn in range(6):  # round robin: some through the node that dies, some straight to the node
            try:
                client.responses.create(model=MODEL, conversation=conversation.id, input=f"turn {turn}",
                                        max_output_tokens=2)
            except openai.APIStatusError as e:
                assert e.status_code in (502, 503), e  # told, and not sent to another node
                failed.append(turn)
                break
        assert failed and stub.dropped == 1, (failed, stub.dropped)
        inputs = [item.content[0].text for item in direct.conversations.items.list(conversation.id, order="asc")
                  if item.role == "user"]
        assert inputs == [f"turn {t}" for t in range(failed[0] + 1)]  # each turn once, the lost answer's too
    with through_a_dying_node(lb, node, log_dir) as (client, stub):
        for i in range(4):  # a chat request has no side effect: the one the dying node took is retried
            assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"c{i}"}],
                                                  max_tokens=2).choices
        assert stub.dropped >= 1  # it did go through the dying node


@contextlib.contextmanager
def through_a_dying_node(lb: str, node: NodeProcess, log_dir):
    stub = StoresThenDies(node.url)
    process, url = balancer(lb, log_dir / f"{lb}-retry-{free_port()}", [stub.addr, node.url.removeprefix("http://")])
    try:
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30), stub
    finally:
        stop_balancer(lb, process)
        stub.close()

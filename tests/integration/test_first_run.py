"""What a newcomer meets on the first day (issue 34), performed as one would: two nodes on one port, a port
another program holds, ..."""

from __future__ import annotations

import socket
import subprocess
import sys

from chaos.processes import NodeProcess


def _serve(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_second_node_on_a_port_in_use_refuses_to_start_and_names_the_holder(log_dir):
    port = _free_port()
    first = NodeProcess(["--port", str(port), "--workers", "2", "--sim-engines", "1"], log_dir, "first-run-a")
    try:
        second = _serve("--port", str(port), "--sim-engines", "1")
        assert second.returncode == 1
        (line,) = second.stderr.strip().splitlines()  # one line, no traceback
        assert f"port {port} on 127.0.0.1 is in use by pid" in line and "gateway.cli serve" in line
        assert first.alive  # and the first node was not disturbed
    finally:
        first.stop()


def test_a_port_held_by_another_program_is_one_line():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        for workers in ("1", "2"):
            refused = _serve("--port", str(port), "--workers", workers)
            assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
            assert f"port {port} on 127.0.0.1 is in use" in refused.stderr


def test_a_mesh_port_held_by_another_program_stops_the_start_in_one_line():
    """CI: a node whose mesh port another process held (a UDP port the test had picked, taken in between) printed a
    traceback and, supervised, restarted forever without READY or an exit. Now it stops, saying why."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        for workers in ("1", "2"):
            refused = _serve("--mesh-bind", f"127.0.0.1:{port}", "--mesh-preset", "local", "--workers", workers,
                             "--log-level", "error")
            assert refused.returncode == 1, refused.stderr
            assert f"smg-node serve: cannot listen for the mesh on 127.0.0.1:{port}: Address already in use" \
                in refused.stderr.splitlines()
            assert "Traceback" not in refused.stderr
    with socket.socket() as holder:  # the mesh's admin API (--rpc-addr) likewise
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        refused = _serve("--mesh-bind", "127.0.0.1:0", "--rpc-addr", f"127.0.0.1:{port}", "--mesh-preset", "local",
                         "--workers", "1", "--log-level", "error")
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert f"cannot listen for the mesh's admin API on 127.0.0.1:{port}: Address already in use" in refused.stderr


def test_discovery_without_a_way_to_the_api_server_is_a_start_up_error(tmp_path):
    """--service-discovery outside a pod and with no kubeconfig: one line naming what was looked for, before the
    node serves, whatever discovery is for (engines, or only the mesh's seeds)."""
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)
    for flags in (["--selector", "app=sglang"], ["--router-selector", "app=smg-node", "--mesh-bind", "127.0.0.1:0",
                                                   "--mesh-preset", "local"]):
        refused = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--service-discovery", *flags,
                                  "--workers", "1", "--log-level", "error"], capture_output=True, text=True,
                                 timeout=60, env=env)
        assert refused.returncode == 1 and "READY" not in refused.stdout, refused.stderr
        assert f"no kubeconfig at {tmp_path}/.kube/config (set KUBECONFIG)" in refused.stderr
        assert "Traceback" not in refused.stderr


def test_a_mistaken_worker_url_is_a_start_up_error():
    refused = _serve("--worker-urls", "127.0.0.1:30001", "--workers", "1")
    assert refused.returncode == 2 and "--worker-urls 127.0.0.1:30001" in refused.stderr
    assert "grpc://" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_a_configured_engine_that_does_not_answer_is_named_in_a_503_not_a_404(log_dir):
    import httpx2

    from chaos.processes import EngineProcess
    port = _free_port()
    url = f"grpc://127.0.0.1:{port}"
    node = NodeProcess(["--worker-urls", url], log_dir, "first-run-no-engine")
    engine = None
    try:
        r = httpx2.post(node.url + "/v1/chat/completions", timeout=30, json={
            "model": "qwen3-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unreachable" and url in r.text
        assert "not registered yet" in node.log_text() and url in node.log_text()  # said at start
        ready = node.ready_match.string
        assert f"(0 workers, not answering yet: {url}" in ready, ready  # and on its READY line
        engine = EngineProcess(["--port", str(port)], log_dir, "first-run-late-engine")
        for _ in range(200):  # the node retries with a growing wait (at most 10 s)
            r = httpx2.post(node.url + "/v1/chat/completions", timeout=30, json={
                "model": "qwen3-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
            if r.status_code == 200:
                break
            __import__("time").sleep(0.1)
        assert r.status_code == 200
    finally:
        node.stop()
        if engine is not None:
            engine.stop()


def _node_in_a_terminal(port: int, log_path, *args: str) -> subprocess.Popen:
    """A node started as from a terminal: the leader of its own process group, so that a Ctrl-C (SIGINT to the
    group) reaches whatever of it stays in the group."""
    import os
    log = open(log_path, "wb")
    process = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), *args],
                               stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ})
    for line in iter(process.stdout.readline, b""):
        if line.startswith(b"READY "):
            return process
    raise AssertionError(f"the node did not start: {open(log_path).read()[-2000:]}")


def test_ctrl_c_drains_like_sigterm_and_a_second_exits_now(log_dir):
    """Issue 34: the terminal's SIGINT reached the supervisor and every process, and the supervisor's forwarded
    signal was each process's second: streams in flight were cut instead of drained."""
    import os
    import signal
    import threading
    import time

    import httpx2
    port = _free_port()
    node = _node_in_a_terminal(port, log_dir / "ctrl-c.log", "--workers", "2", "--sim-engines", "1",
                               "--sim-engine-args=--itl-base-s 0.05 --itl-per-running-s 0")
    try:
        answer = {}

        def stream() -> None:
            with httpx2.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
                    "model": "qwen3-sim", "messages": [{"role": "user", "content": "go"}], "max_tokens": 40,
                    "ignore_eos": True, "stream": True}) as r:
                answer["text"] = b"".join(r.iter_bytes())

        reader = threading.Thread(target=stream)
        reader.start()
        time.sleep(0.5)  # the stream is under way (40 tokens at 50 ms: 2 s)
        os.killpg(node.pid, signal.SIGINT)  # Ctrl-C
        reader.join(30)
        assert b'"finish_reason":"length"' in answer["text"] and answer["text"].endswith(b"data: [DONE]\n\n")
        assert node.wait(30) == 0
        assert "exiting now" not in open(log_dir / "ctrl-c.log").read()
    finally:
        if node.poll() is None:
            node.kill()
    second = _node_in_a_terminal(_free_port(), log_dir / "ctrl-c-twice.log", "--workers", "2")
    os.killpg(second.pid, signal.SIGINT)
    time.sleep(0.2)
    os.killpg(second.pid, signal.SIGINT)
    assert second.wait(15) == 0 and "exit now" in open(log_dir / "ctrl-c-twice.log").read()


def test_a_nodes_own_processes_find_each_other_without_a_warning(log_dir):
    """Issue 34: the quick start logged 'join attempt 1 failed' between its own two processes at every start."""
    node = NodeProcess(["--workers", "2", "--sim-engines", "1"], log_dir, "first-run-quiet")
    try:
        assert "join attempt" not in node.log_text() and " WARNING " not in node.log_text()
    finally:
        node.stop()

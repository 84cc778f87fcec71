"""The real-engine tests run only when asked: they need vLLM (several GB, minutes to start).

    tests/real_engine/setup_vllm.sh                          # once: venv + tiny Qwen3 model
    SMG_VLLM_PYTHON=.venv-vllm/bin/python SMG_VLLM_MODEL=.cache/tiny-qwen3 \\
        python -m pytest -m real_engine tests/real_engine     # starts vLLM itself (~2 min)
    SMG_VLLM_URL=grpc://127.0.0.1:18051 python -m pytest -m real_engine tests/real_engine   # or reuse one
    # (SMG_VLLM_OPENAI_URL=http://127.0.0.1:18061: vLLM's own OpenAI server on the same model, to compare)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest

from chaos.processes import NodeProcess, default_log_dir

VLLM_START_TIMEOUT_S = 600


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SMG_VLLM_URL") or (os.environ.get("SMG_VLLM_PYTHON") and os.environ.get("SMG_VLLM_MODEL")):
        return
    skip = pytest.mark.skip(reason="real vLLM engine not configured: run tests/real_engine/setup_vllm.sh and set "
                                   "SMG_VLLM_PYTHON and SMG_VLLM_MODEL (or SMG_VLLM_URL); see tests/real_engine/README.md")
    for item in items:
        if "real_engine" in item.keywords:
            item.add_marker(skip)


def _wait_serving(target: str, process: subprocess.Popen, timeout_s: float) -> None:
    """Poll the engine until it answers and is idle (it gives no other sign of readiness)."""
    import grpc
    from smg_grpc_proto.generated import vllm_engine_pb2 as vl, vllm_engine_pb2_grpc as vl_grpc
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited with {process.returncode}: see {getattr(process, 'log_path', '?')}")
        try:
            with grpc.insecure_channel(target) as channel:
                stub = vl_grpc.VllmEngineStub(channel)
                # Healthy, and done with its warm-up requests (they run after it starts serving).
                if stub.HealthCheck(vl.HealthCheckRequest(), timeout=5).healthy and not any(
                        x.num_running_reqs or x.num_waiting_reqs for x in stub.GetLoads(vl.GetLoadsRequest()).loads):
                    return
        except grpc.RpcError:
            pass
        time.sleep(2)
    raise RuntimeError(f"vLLM did not serve within {timeout_s}s")


def _start_vllm(entrypoint: str, port: int, extra: "list[str]", log_name: str,
                env_extra: "dict[str, str] | None" = None, model: "str | None" = None) -> subprocess.Popen:
    log_dir = default_log_dir()
    env = {**os.environ, **(env_extra or {}), "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           # Else the servicer opens a ZMQ publisher on 0.0.0.0.
           "SMG_VLLM_SERVICER_KV_EVENTS": "0", "VLLM_CACHE_ROOT": str(log_dir / f"{log_name}-cache")}
    # No whitespace between JSON tokens under constraints: random weights would otherwise write
    # whitespace until max_tokens (the grammar allows it), and no structured answer would end.
    argv = [os.environ["SMG_VLLM_PYTHON"], "-m", entrypoint, "--model", model or os.environ["SMG_VLLM_MODEL"],
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "2048",
            "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}', *extra]
    with open(log_dir / f"{log_name}.log", "wb") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    process.log_path = log_dir / f"{log_name}.log"  # what the engine logs (its stats, for the tests to read)
    return process


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="session")
def vllm_openai_url():
    """vLLM's own OpenAI server on the same model, to compare answers with (SMG_VLLM_OPENAI_URL, or started
    like the gRPC one; tool_choice required/named needs its --enable-auto-tool-choice)."""
    if os.environ.get("SMG_VLLM_OPENAI_URL"):
        yield os.environ["SMG_VLLM_OPENAI_URL"]
        return
    if not os.environ.get("SMG_VLLM_PYTHON"):
        pytest.skip("set SMG_VLLM_OPENAI_URL (or SMG_VLLM_PYTHON and SMG_VLLM_MODEL) to compare with vLLM's server")
    port = 18062
    process = _start_vllm("vllm.entrypoints.openai.api_server", port,
                          ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], "vllm-openai")
    try:
        _wait_http(f"http://127.0.0.1:{port}", process, VLLM_START_TIMEOUT_S)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(process)


def _wait_http(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    """Poll vLLM's OpenAI server until its /health answers."""
    import httpx2
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM's OpenAI server exited with {process.returncode}: see {process.log_path}")
        try:
            if httpx2.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM's OpenAI server did not start: see {process.log_path}")
        time.sleep(2)


@contextlib.contextmanager
def engine_pair(name: str, model: str, grpc_port: int, http_port: int, extra: "list[str]",
                env_extra: "dict[str, str] | None" = None, http_extra: "tuple[str, ...]" = ()):
    """A gRPC engine and vLLM's own OpenAI server on the same model and flags (``http_extra``: the server's own,
    which the gRPC launcher does not take), started together (each takes minutes; they overlap), stopped at the
    end: yields their URLs."""
    grpc_engine = _start_vllm("vllm.entrypoints.launchers.grpc_server", grpc_port, extra, name, env_extra, model)
    http_engine = _start_vllm("vllm.entrypoints.openai.api_server", http_port, [*extra, *http_extra],
                              f"{name}-openai", env_extra, model)
    try:
        _wait_serving(f"127.0.0.1:{grpc_port}", grpc_engine, VLLM_START_TIMEOUT_S)
        _wait_http(f"http://127.0.0.1:{http_port}", http_engine, VLLM_START_TIMEOUT_S)
        yield f"grpc://127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"
    finally:
        _stop(grpc_engine)
        _stop(http_engine)


@pytest.fixture(scope="session")
def vllm_url():
    if os.environ.get("SMG_VLLM_URL"):
        yield os.environ["SMG_VLLM_URL"]
        return
    port = 18052
    process = _start_vllm("vllm.entrypoints.launchers.grpc_server", port, [], "vllm")
    try:
        _wait_serving(f"127.0.0.1:{port}", process, VLLM_START_TIMEOUT_S)
        yield f"grpc://127.0.0.1:{port}"
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def node(vllm_url):
    # No --tokenizer-path: the node must fetch the tokenizer with GetTokenizer.
    n = NodeProcess(["--worker-urls", vllm_url, "--health-check-interval-secs", "2"], default_log_dir(), "node-vllm")
    yield n
    n.stop()


@pytest.fixture(scope="module")
def client(node):
    import openai
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id

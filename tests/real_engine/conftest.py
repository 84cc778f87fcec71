"""The real-engine tests run only when asked: they need vLLM (several GB, minutes to start).

    tests/real_engine/setup_vllm.sh                          # once: venv + tiny Qwen3 model
    SMG_VLLM_PYTHON=.venv-vllm/bin/python SMG_VLLM_MODEL=.cache/tiny-qwen3 \\
        python -m pytest -m real_engine tests/real_engine     # starts vLLM itself (~2 min)
    SMG_VLLM_URL=grpc://127.0.0.1:18051 python -m pytest -m real_engine tests/real_engine   # or reuse one
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from chaos.processes import default_log_dir

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
            raise RuntimeError(f"vLLM exited with {process.returncode}")
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


@pytest.fixture(scope="session")
def vllm_url():
    if os.environ.get("SMG_VLLM_URL"):
        yield os.environ["SMG_VLLM_URL"]
        return
    log_dir = default_log_dir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           # Else the servicer opens a ZMQ publisher on 0.0.0.0.
           "SMG_VLLM_SERVICER_KV_EVENTS": "0", "VLLM_CACHE_ROOT": str(log_dir / "vllm-cache")}
    port = 18052
    argv = [os.environ["SMG_VLLM_PYTHON"], "-m", "vllm.entrypoints.launchers.grpc_server",
            "--model", os.environ["SMG_VLLM_MODEL"], "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "bfloat16", "--max-model-len", "2048"]
    with open(log_dir / "vllm.log", "wb") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_serving(f"127.0.0.1:{port}", process, VLLM_START_TIMEOUT_S)
        yield f"grpc://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()

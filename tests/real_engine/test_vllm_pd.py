"""A real prefill/decode pair (issue 35): two vLLM CPU engines behind smg-grpc-servicer, the prefill a NIXL
kv_producer and the decode its kv_consumer (NIXL over UCX with host buffers: vLLM's CPU platform supports
kv_buffer_device cpu), and a node pairing them as vLLM's own PD proxy does: the prefill first with
kv_transfer_params asking for a remote decode, then the decode with the parameters the prefill returned.

Needs ``nixl`` in the vLLM venv (setup_vllm.sh installs it) and SMG_VLLM_PYTHON/SMG_VLLM_MODEL: the pair is
started here (~2 min each), never reused from SMG_VLLM_URL.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid

import httpx2
import pytest

from chaos.processes import NodeProcess, default_log_dir

from .conftest import VLLM_START_TIMEOUT_S, _start_vllm, _stop, _wait_serving

pytestmark = pytest.mark.real_engine

PREFILL_PORT, DECODE_PORT = 18055, 18056


def _nixl(role: str) -> "list[str]":
    return ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": role,
                                                "kv_buffer_device": "cpu"})]


@pytest.fixture(scope="module")
def pair():
    if not os.environ.get("SMG_VLLM_PYTHON"):
        pytest.skip("a prefill/decode pair is started here: set SMG_VLLM_PYTHON and SMG_VLLM_MODEL")
    started = []
    try:
        for port, role, side_channel in ((PREFILL_PORT, "kv_producer", "5611"), (DECODE_PORT, "kv_consumer", "5612")):
            started.append(_start_vllm("vllm.entrypoints.launchers.grpc_server", port, _nixl(role), f"vllm-{role}",
                                       {"VLLM_NIXL_SIDE_CHANNEL_PORT": side_channel,
                                        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "UCX_TLS": "tcp,self,sm"}))
        for port, process in zip((PREFILL_PORT, DECODE_PORT), started):
            _wait_serving(f"127.0.0.1:{port}", process, VLLM_START_TIMEOUT_S)
        yield f"grpc://127.0.0.1:{PREFILL_PORT}", f"grpc://127.0.0.1:{DECODE_PORT}", started[1].log_path
    finally:
        for process in started:
            _stop(process)


def _metric(node: NodeProcess, name: str) -> float:
    text = httpx2.get(node.url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _transfers(decode_log) -> "tuple[int, int]":
    """(successful, failed) NIXL transfers the decode engine reported (vLLM logs its KV-transfer stats every
    10 s: each line counts its interval). The decode's usage does not say: vLLM counts only local prefix-cache
    hits as cached tokens."""
    text = decode_log.read_text(errors="replace")
    done = sum(int(n) for n in re.findall(r"KV Transfer metrics: Num successful transfers=(\d+)", text))
    failed = sum(int(n) for n in re.findall(r"Num failed transfers=(\d+)", text))
    return done, failed


def test_a_vllm_nixl_pair_serves_with_the_kv_handed_over(pair):
    prefill, decode, decode_log = pair
    node = NodeProcess(["--pd-disaggregation", "--prefill", prefill, "--decode", decode,
                        "--health-check-interval-secs", "2"], default_log_dir(), "node-vllm-pd")
    try:
        workers = {w["url"]: w for w in httpx2.get(node.url + "/workers", headers=node.admin_headers,
                                                   timeout=30).json()["workers"]}
        assert workers[prefill]["worker_type"] == "prefill" and workers[decode]["worker_type"] == "decode"
        assert workers[prefill]["pairing"]["kv_connector"] == "NixlConnector"
        model = httpx2.get(node.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        # A prompt neither engine saw (several of vLLM's CPU blocks long: whole blocks are what NIXL moves).
        prompt = f"Say something about {uuid.uuid4().hex} and the sea, in a few words. " * 8
        for stream in (False, True):
            r = httpx2.post(node.url + "/v1/chat/completions", timeout=300, json={
                "model": model, "messages": [{"role": "user", "content": prompt + str(stream)}], "max_tokens": 8,
                "temperature": 0, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})})
            assert r.status_code == 200, r.text
            if stream:
                usage = json.loads([line for line in r.text.splitlines() if '"usage":{' in line][-1][6:])["usage"]
            else:
                usage = r.json()["usage"]
            assert usage["completion_tokens"] >= 1 and usage["prompt_tokens"] > 300
        assert _metric(node, "smg_pd_kv_transfer_failures_total") == 0  # the prefill returned its parameters
        assert _metric(node, "smg_pd_pair_selections_total") >= 2
        # The decode pulled the prompt's KV from the prefill over NIXL, once per request, none failed.
        deadline = time.monotonic() + 60
        while _transfers(decode_log)[0] < 2:
            assert time.monotonic() < deadline, f"NIXL transfers the decode reported: {_transfers(decode_log)}"
            time.sleep(1)
        assert _transfers(decode_log)[1] == 0
    finally:
        node.stop()

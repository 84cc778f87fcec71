"""Classification on a real engine (issue 64): vLLM's own OpenAI server serving a tiny random Qwen3 as a
sequence classifier (``--runner pooling --convert classify``) behind a node as an OpenAI-compatible HTTP worker:
``/v1/classify`` and ``/classify`` through the node answer exactly as the server's own ``/classify`` does (vLLM 0.32
serves no ``/v1/classify``) (the gRPC contract
cannot ask an engine for a classification, so classifiers are served this way; tests/integration covers the 400 for
a model of gRPC engines).

Needs ``tests/real_engine/setup_vllm.sh`` and SMG_VLLM_PYTHON, SMG_VLLM_MODEL.
"""

from __future__ import annotations

import os

import httpx2
import pytest

from .conftest import VLLM_START_TIMEOUT_S, _start_vllm, _stop, _wait_http
from .media_engines import configured, node_on

pytestmark = pytest.mark.real_engine


@pytest.fixture(scope="module")
def classifier():
    configured("SMG_VLLM_MODEL")
    port = 18067
    server = _start_vllm("vllm.entrypoints.openai.api_server", port, ["--runner", "pooling", "--convert", "classify"],
                         "vllm-classify", model=os.environ["SMG_VLLM_MODEL"])
    try:
        _wait_http(f"http://127.0.0.1:{port}", server, VLLM_START_TIMEOUT_S)
        node = node_on(f"http://127.0.0.1:{port}", "node-vllm-classify")
        try:
            yield node.url, f"http://127.0.0.1:{port}"
        finally:
            node.stop()
    finally:
        _stop(server)


@pytest.mark.parametrize("path", ["/v1/classify", "/classify"])
def test_classify_through_the_node_is_vllms_own_answer(classifier, path):
    ours, theirs = classifier
    model = httpx2.get(theirs + "/v1/models").json()["data"][0]["id"]
    for body in ({"model": model, "input": "a fine day for a walk"},
                 {"model": model, "input": ["first text", "a second, longer text to classify"]}):
        mine = httpx2.post(ours + path, json=body, timeout=120)
        reference = httpx2.post(theirs + "/classify", json=body, timeout=120)
        assert mine.status_code == reference.status_code == 200, (mine.text, reference.text)
        got, want = mine.json(), reference.json()
        assert got["data"] == want["data"] and got["usage"] == want["usage"]
        assert len(got["data"]) == (1 if isinstance(body["input"], str) else 2) and got["data"][0]["probs"]
    bad = {"model": model, "input": 3}
    mine, reference = httpx2.post(ours + path, json=bad, timeout=120), httpx2.post(theirs + "/classify", json=bad,
                                                                                   timeout=120)
    assert mine.status_code == reference.status_code and mine.status_code >= 400  # the server's own error, relayed

"""A node follows an engine's KV events only while another engine serves its model (routing has a choice)."""

from __future__ import annotations

import httpx2
import openai

from chaos.processes import EngineProcess, NodeProcess

from tests.support.nodes import MODEL
from tests.support.waiting import eventually

# ~35 blocks of 16 tokens.
PROMPT = "The lone engine keeps this prefix in its cache while nobody indexes it. " * 40


def kv_state(http: httpx2.Client, url: str) -> dict:
    return next(w for w in http.get("/workers").json()["workers"] if w["url"] == url)["kv_index"]


def test_events_are_followed_only_while_a_second_engine_shares_the_model(log_dir):
    first = EngineProcess(["--zero-cost", "--block-size", "16"], log_dir, "lone-engine")
    second = EngineProcess(["--zero-cost", "--block-size", "16"], log_dir, "second-engine")
    node = NodeProcess(["--worker-urls", first.url, "--health-check-interval-secs", "1"], log_dir, "lazy-kv-node")
    try:
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
        with httpx2.Client(base_url=node.url, timeout=30, headers=node.admin_headers) as http:
            # Alone: nothing to choose between, so its stream is not followed and its blocks not indexed.
            full_blocks = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1).usage.prompt_tokens // 16
            alone = kv_state(http, first.url)
            assert (alone["needed"], alone["following"], alone["blocks"]) == (False, False, 0), alone

            # A second engine for the same model: both are followed, and the first one's index catches up
            # with what it cached while nobody listened (the engine sends a snapshot from sequence 0).
            assert http.post("/workers", json={"url": second.url}).status_code == 201
            eventually(lambda: kv_state(http, first.url)["following"] and kv_state(http, second.url)["following"],
                       20, lambda: (kv_state(http, first.url), kv_state(http, second.url)))
            eventually(lambda: kv_state(http, first.url)["blocks"] >= full_blocks, 20, lambda: kv_state(http, first.url))

            # The second one leaves: the first is alone again and its stream is let go.
            worker_id = next(w["id"] for w in http.get("/workers").json()["workers"] if w["url"] == second.url)
            assert http.delete(f"/workers/{worker_id}").status_code in (200, 202)
            eventually(lambda: not kv_state(http, first.url)["following"], 20, lambda: kv_state(http, first.url))
            assert kv_state(http, first.url)["needed"] is False
    finally:
        node.kill()
        first.kill()
        second.kill()

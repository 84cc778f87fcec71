"""Prefill/decode disaggregation (issue 35) with real processes: simulated prefill and decode engines that hand
the KV over on a real socket (chaos/sim_engine/handover.py), smg-node in front, the openai SDK as the client.

The simulated decode engine produces nothing without the prefill's hand-over of the same prompt under the same
room (SGLang) or transfer (vLLM): a gateway that skips the prefill or sends mismatched rooms fails every test here
(test_the_engines_refuse_a_wrong_hand_over shows the engines refusing both).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import grpc
import httpx2
import openai
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg, sglang_scheduler_pb2_grpc as sg_grpc

from chaos.processes import EngineProcess, NodeProcess

from tests.support.nodes import MODEL, prompt_ids
from tests.support.waiting import eventually

RUNTIMES = ("sglang", "vllm", "tokenspeed")  # the kinds with prefill/decode legs
HANDOVER = ["--handover-timeout-s", "3"]
ENGINE = ["--itl-base-s", "0.002", "--itl-per-running-s", "0", "--prefill-s-per-token", "0.000001"]


def _engine(runtime: str, role: str, log_dir, name: str, env_args: "list[str]" = ()) -> EngineProcess:
    return EngineProcess([*ENGINE, *HANDOVER, "--services", runtime, "--role", role, *env_args], log_dir, name)


def _pd_args(prefills: "list[EngineProcess]", decodes: "list[EngineProcess]") -> list[str]:
    args = ["--pd-disaggregation", "--health-check-interval-secs", "0.5", "--health-failure-threshold", "2"]
    for p in prefills:
        args += ["--prefill", p.url, str(p.bootstrap_port)]
    for d in decodes:
        args += ["--decode", d.url]
    return args


def _stop(*processes) -> None:
    for p in processes:
        if p is not None:
            p.kill()


@pytest.fixture(scope="module", params=RUNTIMES)
def pd_cluster(request, log_dir):
    runtime = request.param
    prefills = [_engine(runtime, "prefill", log_dir, f"pd-{runtime}-prefill{i}") for i in range(2)]
    decodes = [_engine(runtime, "decode", log_dir, f"pd-{runtime}-decode{i}") for i in range(2)]
    node = NodeProcess(_pd_args(prefills, decodes), log_dir, f"pd-{runtime}-node")
    yield runtime, node, prefills, decodes
    _stop(node, *prefills, *decodes)


def _client(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _metric(node: NodeProcess, name: str) -> float:
    text = httpx2.get(node.url + "/metrics").text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name))


def test_pairs_answer_as_one_engine_would(pd_cluster, predict):
    runtime, node, prefills, decodes = pd_cluster
    client = _client(node)
    messages = [{"role": "user", "content": f"tell me about {runtime}"}]
    with httpx2.Client(base_url=node.url) as http:
        ids = prompt_ids(http, messages)
    expected = predict(ids, 12)
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
    assert answer.choices[0].message.content == expected
    assert answer.usage.completion_tokens == 12
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, stream=True) if chunk.choices)
    assert streamed == expected
    for i in range(8):  # every pair serves: each prefill and each decode engine takes requests
        client.completions.create(model=MODEL, prompt=f"count {i}", max_tokens=3)
    assert _metric(node, "smg_pd_ttft_seconds_count") >= 10
    assert _metric(node, "smg_pd_prefill_duration_seconds_count") >= 10
    assert _metric(node, "smg_pd_bootstrap_failures_total") == 0
    workers = httpx2.get(node.url + "/workers", headers=node.admin_headers).json()["workers"]
    roles = {w["url"]: (w["worker_type"], w["bootstrap_port"], w["pairing"].get("mode")) for w in workers}
    assert roles == {**{p.url: ("prefill", p.bootstrap_port, "prefill") for p in prefills},
                     **{d.url: ("decode", None, "decode") for d in decodes}}
    assert all(e.alive for e in (*prefills, *decodes))


def test_the_engines_refuse_a_wrong_hand_over(log_dir):
    """What makes the other tests fail for a gateway that gets pairing wrong: a decode given another room than its
    prefill, or no prefill at all, fails (ABORTED, FAILED_PRECONDITION) instead of answering."""
    prefill = _engine("sglang", "prefill", log_dir, "wrong-prefill", ["--handover-timeout-s", "1"])
    decode = _engine("sglang", "decode", log_dir, "wrong-decode", ["--handover-timeout-s", "1"])

    def request(room: "int | None") -> sg.GenerateRequest:
        r = sg.GenerateRequest(request_id=f"r{room}", sampling_params=sg.SamplingParams(max_new_tokens=3), stream=True)
        r.tokenized.input_ids.extend([1, 2, 3])
        if room is not None:
            r.disaggregated_params.bootstrap_host = "127.0.0.1"
            r.disaggregated_params.bootstrap_port = prefill.bootstrap_port
            r.disaggregated_params.bootstrap_room = room
        return r

    async def run(target: str, r: sg.GenerateRequest):
        async with grpc.aio.insecure_channel(target) as channel:
            try:
                return [m.WhichOneof("response") async for m in sg_grpc.SglangSchedulerStub(channel).Generate(r)]
            except grpc.aio.AioRpcError as e:
                return e.code()

    async def scenario():
        same = await asyncio.gather(run(prefill.target, request(7)), run(decode.target, request(7)))
        crossed = await asyncio.gather(run(prefill.target, request(8)), run(decode.target, request(9)))
        skipped = await run(decode.target, request(None))
        return same, crossed, skipped

    try:
        same, crossed, skipped = asyncio.run(scenario())
    finally:
        _stop(prefill, decode)
    assert same == [["complete"], ["chunk", "chunk", "chunk", "complete"]]
    assert crossed == [grpc.StatusCode.ABORTED, grpc.StatusCode.ABORTED]
    assert skipped == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_dead_prefill_is_retried_on_another_pair(runtime, log_dir, predict):
    prefills = [_engine(runtime, "prefill", log_dir, f"dead-{runtime}-prefill{i}") for i in range(2)]
    decode = _engine(runtime, "decode", log_dir, f"dead-{runtime}-decode")
    node = None
    try:
        # Health checks far apart: requests meet the dead prefill before a check takes it out.
        node = NodeProcess([*_pd_args(prefills, [decode]), "--health-check-interval-secs", "60",
                            "--prefill-policy", "round_robin"], log_dir, f"dead-{runtime}-node")
        client = _client(node)
        prefills[0].kill()
        for i in range(6):  # round robin meets the dead prefill every other request
            answer = client.completions.create(model=MODEL, prompt=f"retry {i}", max_tokens=4)
            assert answer.usage.completion_tokens == 4
        assert _metric(node, "smg_retries_total") >= 1
        assert _metric(node, 'smg_pd_bootstrap_failures_total{reason="prefill_failed"}') >= (1 if runtime == "sglang"
                                                                                               else 0)
    finally:
        _stop(node, *prefills, decode)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_failing_decode_aborts_its_prefill(runtime, log_dir):
    prefill = _engine(runtime, "prefill", log_dir, f"abort-{runtime}-prefill")
    # A decode that refuses every request (a full queue): each attempt fails after the prefill started.
    decode = _engine(runtime, "decode", log_dir, f"abort-{runtime}-decode", ["--queue-size-max", "0"])
    node = None
    try:
        node = NodeProcess([*_pd_args([prefill], [decode]), "--retry-max-retries", "1"], log_dir,
                           f"abort-{runtime}-node")
        with pytest.raises(openai.APIStatusError):
            _client(node).completions.create(model=MODEL, prompt="no decode", max_tokens=4)
        eventually(lambda: "prefill of request" in prefill.log_text(), 10, "the prefill engine was never told to abort")
        if runtime == "vllm":  # the KV its prefill kept for the decode is freed at once, not at the timeout
            assert "is freed" in prefill.log_text()
    finally:
        _stop(node, prefill, decode)


def test_a_missing_side_or_an_incompatible_pair_is_a_clear_503(log_dir):
    prefill = _engine("sglang", "prefill", log_dir, "lone-prefill", ["--pairing-protocol", "mooncake-v1"])
    decodes = []
    node = None
    try:
        node = NodeProcess(_pd_args([prefill], []), log_dir, "lone-node")
        client = _client(node)
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert caught.value.status_code == 503
        assert caught.value.body["code"] == "no_decode_worker" and "decode" in caught.value.message
        # A decode of another pairing protocol, registered at run time: still no pair, and the 503 says why.
        decodes.append(_engine("sglang", "decode", log_dir, "other-protocol-decode", ["--pairing-protocol", "nixl-v2"]))
        admin = httpx2.Client(base_url=node.url, headers=node.admin_headers, timeout=30)
        r = admin.post("/workers", json={"url": decodes[0].url, "worker_type": "decode"})
        assert r.status_code == 201, r.text
        assert r.json()["pairing"]["protocol"] == "nixl-v2"
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert caught.value.status_code == 503 and caught.value.body["code"] == "no_compatible_pd_pair"
        assert "mooncake-v1" in caught.value.message and "nixl-v2" in caught.value.message
        # One that agrees: the model is served.
        decodes.append(_engine("sglang", "decode", log_dir, "same-protocol-decode", ["--pairing-protocol",
                                                                                     "mooncake-v1"]))
        assert admin.post("/workers", json={"url": decodes[1].url, "worker_type": "decode"}).status_code == 201
        assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens == 2
        # A role the engine does not run in is refused at registration, and a bad body is a 400.
        wrong = admin.post("/workers", json={"url": decodes[0].url, "worker_type": "prefill"})
        assert wrong.status_code in (400, 409), wrong.text
        assert admin.post("/workers", json={"url": decodes[0].url, "worker_type": "both"}).status_code == 400
        assert admin.post("/workers", json={"url": decodes[0].url, "worker_type": "decode",
                                            "bootstrap_port": 99999}).status_code == 400
    finally:
        _stop(node, prefill, *decodes)


def test_a_prefill_that_never_answers_is_bounded(log_dir):
    """A prefill stuck on its prompt (here: 20 s of prefill per token) fails each attempt at the bound, counted, and
    the client gets an error well before the request's own timeout."""
    prefill = EngineProcess([*ENGINE, "--services", "vllm", "--role", "prefill", "--prefill-s-per-token", "20"],
                            log_dir, "stuck-prefill")
    decode = _engine("vllm", "decode", log_dir, "stuck-decode")
    node = None
    try:
        node = NodeProcess([*_pd_args([prefill], [decode]), "--pd-bootstrap-timeout-secs", "1",
                            "--retry-max-retries", "1", "--retry-initial-backoff-ms", "10"], log_dir, "stuck-node")
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as caught:
            _client(node).completions.create(model=MODEL, prompt="stuck", max_tokens=2)
        assert time.monotonic() - started < 10
        assert caught.value.status_code in (503, 504), caught.value
        assert _metric(node, 'smg_pd_bootstrap_failures_total{reason="timeout"}') == 2
    finally:
        _stop(node, prefill, decode)


def test_a_cluster_routes_pairs_registered_on_another_node(log_dir, predict):
    from tests.support.node_pairs import mesh_args, start_pair

    prefill = _engine("sglang", "prefill", log_dir, "mesh-prefill")
    decode = _engine("sglang", "decode", log_dir, "mesh-decode")
    nodes = []
    try:
        nodes = start_pair(lambda i, ports: [*mesh_args(i, ports, "pd-mesh"),
                                             *(_pd_args([prefill], [decode]) if i == 0 else [])], log_dir, "pd-mesh")
        def both_healthy():
            found = httpx2.get(nodes[1].url + "/workers", headers=nodes[1].admin_headers).json()["workers"]
            return found if len(found) == 2 and all(w["healthy"] for w in found) else None

        workers = eventually(both_healthy, 20, "both workers healthy on the second node")
        assert sorted((w["worker_type"], w["bootstrap_port"]) for w in workers) == \
            [("decode", None), ("prefill", prefill.bootstrap_port)], json.dumps(workers)
        # The CLI shows the roles too, read from the second node.
        shown = subprocess.run([sys.executable, "-m", "gateway.cli", "workers", "list", "--url", nodes[1].url],
                               capture_output=True, text=True, timeout=30, env={**os.environ, **nodes[1].admin_env})
        assert shown.returncode == 0, shown.stderr
        assert f"prefill:{prefill.bootstrap_port}" in shown.stdout and " decode " in shown.stdout, shown.stdout
        messages = [{"role": "user", "content": "through the other node"}]
        with httpx2.Client(base_url=nodes[1].url) as http:
            ids = prompt_ids(http, messages)
        answer = _client(nodes[1]).chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
        assert answer.choices[0].message.content == predict(ids, 6)
    finally:
        _stop(*nodes, prefill, decode)

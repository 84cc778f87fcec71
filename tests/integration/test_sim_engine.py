"""The simulated engine over real gRPC: both services, KV events with replay, tokenizer bundle."""

from __future__ import annotations

import hashlib
import io
import zipfile

import grpc
import openai
import pytest
from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2 as sg,
    sglang_scheduler_pb2_grpc as sg_grpc,
    vllm_engine_pb2 as vl,
    vllm_engine_pb2_grpc as vl_grpc,
)

from chaos.processes import EngineProcess, NodeProcess

from tests.support.nodes import MODEL


@pytest.fixture(scope="module")
def kv_engine(log_dir):
    e = EngineProcess(["--zero-cost", "--block-size", "4", "--kv-capacity-blocks", "6"], log_dir, "kv-engine")
    yield e
    e.stop()


def generate(stub, prompt, max_tokens=2):
    request = sg.GenerateRequest(request_id=f"r{hash(tuple(prompt))}", tokenized=sg.TokenizedInput(input_ids=prompt),
                                 sampling_params=sg.SamplingParams(max_new_tokens=max_tokens))
    return [m for m in stub.Generate(request, timeout=10)]


def test_kv_events_stream_and_replay_from_a_sequence_number(kv_engine):
    with grpc.insecure_channel(kv_engine.target) as channel:
        stub = sg_grpc.SglangSchedulerStub(channel)
        live = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=0), timeout=10)
        snapshot = next(live)  # cursor 0: the current state first (empty), as a snapshot chunk
        assert snapshot.snapshot.count == 1 and snapshot.events[0].WhichOneof("data") == "cleared"
        generate(stub, [1, 2, 3, 4, 5, 6, 7, 8])
        first = next(live)
        stored = first.events[0].stored
        assert [list(b.token_ids) for b in stored.blocks] == [[1, 2, 3, 4], [5, 6, 7, 8]]
        assert first.sequence_number == 1
        generate(stub, [9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7])  # 3 more blocks: 5 > capacity 6? no; then evict
        generate(stub, [6, 6, 6, 6, 5, 5, 5, 5])
        kinds = []
        while len(kinds) < 3:
            kinds.extend(e.WhichOneof("data") for e in next(live).events)
        assert "removed" in kinds  # LRU eviction published
        live.cancel()
        replay = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=2), timeout=10)
        assert next(replay).sequence_number == 2
        replay.cancel()


def cached_tokens_of_repeats(engine, prompt, times=2):
    with grpc.insecure_channel(engine.target) as channel:
        stub = sg_grpc.SglangSchedulerStub(channel)
        out = []
        for n in range(times):
            request = sg.GenerateRequest(request_id=f"repeat-{n}-{engine.target}",
                                         tokenized=sg.TokenizedInput(input_ids=prompt),
                                         sampling_params=sg.SamplingParams(max_new_tokens=1))
            out.append([m.complete.cached_tokens for m in stub.Generate(request, timeout=10)][-1])
        snapshot = next(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=0),
                                               timeout=10))
    return out, snapshot


def test_no_prefix_caching_means_no_hits_and_no_kv_events(kv_engine, log_dir):
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    cached, snapshot = cached_tokens_of_repeats(kv_engine, prompt)
    assert cached == [0, 8] and snapshot.snapshot.blocks > 0  # the default: the repeat hits its 2 full blocks
    e = EngineProcess(["--zero-cost", "--block-size", "4", "--no-prefix-caching"], log_dir, "no-cache-engine")
    try:
        cached, snapshot = cached_tokens_of_repeats(e, prompt)
    finally:
        e.stop()
    assert cached == [0, 0]
    assert snapshot.sequence_number == 0 and snapshot.snapshot.blocks == 0  # nothing was ever published
    assert [ev.WhichOneof("data") for ev in snapshot.events] == ["cleared"]


def test_get_tokenizer_streams_a_zip_with_sha256_on_the_last_chunk(kv_engine):
    with grpc.insecure_channel(kv_engine.target) as channel:
        chunks = list(vl_grpc.VllmEngineStub(channel).GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=30))
    assert all(c.sha256 == "" for c in chunks[:-1]) and len(chunks) > 1
    data = b"".join(c.data for c in chunks)
    assert hashlib.sha256(data).hexdigest() == chunks[-1].sha256
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(zipfile.ZipFile(io.BytesIO(data)).namelist())


def test_vllm_service_honours_seed_stop_token_ids_and_ignore_eos(log_dir):
    e = EngineProcess(["--zero-cost", "--eos-after-tokens", "3", "--services", "vllm"], log_dir, "vllm-engine")
    try:
        with grpc.insecure_channel(e.target) as channel:
            stub = vl_grpc.VllmEngineStub(channel)

            def run(**sp):
                req = vl.GenerateRequest(request_id=f"x{sp}", tokenized=vl.TokenizedInput(input_ids=[1, 2, 3]),
                                         sampling_params=vl.SamplingParams(**sp))
                return [m.complete for m in stub.Generate(req, timeout=10)][-1]

            eos = run(max_tokens=10)
            assert eos.finish_reason == "stop" and len(eos.output_ids) == 4 and eos.matched_token_id == 151645
            long = run(max_tokens=10, ignore_eos=True)
            assert long.finish_reason == "length" and len(long.output_ids) == 10
            assert run(max_tokens=5, ignore_eos=True, seed=7).output_ids != run(max_tokens=5, ignore_eos=True,
                                                                              seed=8).output_ids
            cut = run(max_tokens=10, ignore_eos=True, stop_token_ids=[long.output_ids[1]])
            assert list(cut.output_ids) == list(long.output_ids[:2]) and cut.finish_reason == "stop"
            with pytest.raises(grpc.RpcError) as err:
                stub.Generate(vl.GenerateRequest(request_id="t", text="raw text"), timeout=10).next()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        e.stop()


def test_node_drives_a_vllm_service_engine(log_dir):
    e = EngineProcess(["--zero-cost", "--services", "vllm"], log_dir, "vllm-only")
    node = NodeProcess(["--worker-urls", e.url], log_dir, "vllm-node")
    try:
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "v"}], max_tokens=4,
                                           seed=5)
        assert r.usage.completion_tokens == 4
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "v"}], max_tokens=4, seed=5, stream=True) if c.choices)
        assert streamed == r.choices[0].message.content
        import httpx2
        assert httpx2.get(node.url + "/workers", headers=node.admin_headers).json()["workers"][0]["runtime"] == "vllm"
    finally:
        node.stop()
        e.stop()

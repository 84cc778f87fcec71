"""The GenerateRequest each runtime sends (gateway/engine/grpc_engine.py): sampling filled in place and the
fields at proto3's default left out, which must be the same message as one naming every field."""

from __future__ import annotations

import pytest

from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg
from smg_grpc_proto.generated import vllm_engine_pb2 as vl

from gateway.engine.grpc_engine import SamplingOptions
from gateway.engine.runtimes import SglangRuntime, VllmRuntime

IDS = [151644, 872, 198, 15, 3555]


def _sglang_reference(sampling: SamplingOptions, stream: bool) -> bytes:
    """Every field named, as the engine's proto defines them (the gateway's values for them)."""
    sp = sg.SamplingParams(
        max_new_tokens=sampling.max_new_tokens,
        temperature=1.0 if sampling.temperature is None else sampling.temperature,
        top_p=1.0 if sampling.top_p is None else sampling.top_p,
        top_k=-1 if sampling.top_k is None else sampling.top_k, min_p=sampling.min_p or 0.0,
        frequency_penalty=sampling.frequency_penalty, presence_penalty=sampling.presence_penalty,
        repetition_penalty=1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty,
        stop_token_ids=sampling.stop_token_ids, ignore_eos=sampling.ignore_eos,
        min_new_tokens=sampling.min_new_tokens, skip_special_tokens=False, no_stop_trim=True, n=sampling.n)
    request = sg.GenerateRequest(request_id="req-1", sampling_params=sp, stream=stream)
    request.tokenized.input_ids.extend(IDS)
    return request.SerializeToString(deterministic=True)


def _vllm_reference(sampling: SamplingOptions, stream: bool) -> bytes:
    sp = vl.SamplingParams(
        max_tokens=sampling.max_new_tokens, top_p=1.0 if sampling.top_p is None else sampling.top_p,
        top_k=0 if sampling.top_k is None or sampling.top_k < 0 else sampling.top_k, min_p=sampling.min_p or 0.0,
        frequency_penalty=sampling.frequency_penalty, presence_penalty=sampling.presence_penalty,
        repetition_penalty=1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty,
        stop_token_ids=sampling.stop_token_ids, ignore_eos=sampling.ignore_eos,
        min_tokens=sampling.min_new_tokens, skip_special_tokens=False, n=sampling.n)
    if sampling.temperature is not None:
        sp.temperature = sampling.temperature
    request = vl.GenerateRequest(request_id="req-1", sampling_params=sp, stream=stream)
    request.tokenized.input_ids.extend(IDS)
    return request.SerializeToString(deterministic=True)


SAMPLINGS = [
    SamplingOptions(max_new_tokens=16),
    SamplingOptions(max_new_tokens=16, ignore_eos=True),
    SamplingOptions(max_new_tokens=0, temperature=0.0, top_p=0.5, top_k=0),
    SamplingOptions(max_new_tokens=64, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, frequency_penalty=-0.5,
                    presence_penalty=1.5, repetition_penalty=1.1, stop_token_ids=(2, 151645), ignore_eos=True,
                    min_new_tokens=4, n=3),
]


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("runtime, reference", [(SglangRuntime(), _sglang_reference), (VllmRuntime(), _vllm_reference)],
                         ids=["sglang", "vllm"])
def test_the_request_is_the_message_naming_every_field(runtime, reference, sampling, stream):
    made = runtime.generate_request("req-1", IDS, sampling, stream)
    assert made.SerializeToString(deterministic=True) == reference(sampling, stream)
    assert made.HasField("sampling_params") and made.HasField("tokenized")

"""TensorRT-LLM, MLX and TokenSpeed as engine kinds (gateway/engine/runtimes/): their requests field by field against
their protos, their answers read into the gateway's events, what each supports, and the 400 a request gets for what
its model's engines lack (gateway/api/pipeline.py's check_engine_support)."""

from __future__ import annotations

import pytest
from smg_grpc_proto.generated import mlx_engine_pb2 as ml
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts
from smg_grpc_proto.generated import trtllm_service_pb2 as tr

from gateway.api.errors import BadRequest
from gateway.api.pipeline import check_engine_support
from gateway.engine.messages import CONSTRAINT_KINDS, FULL_SUPPORT, Constraint, EngineSupport, Handover, \
    SamplingOptions
from gateway.engine.runtimes import ENGINE_RUNTIMES
from gateway.serving.chat import SamplingRequest
from gateway.serving.models import ModelEntry, _take_support

TRTLLM, MLX, TOKENSPEED = ENGINE_RUNTIMES["trtllm"], ENGINE_RUNTIMES["mlx"], ENGINE_RUNTIMES["tokenspeed"]


# -- TensorRT-LLM -----------------------------------------------------------------------------------------------

def test_trtllm_requests_carry_the_models_end_and_only_what_was_set():
    bound = TRTLLM.bind(frozenset({151645, 151643}), vocab_size=8)
    r = bound.generate_request("r1", [1, 2, 3], SamplingOptions(max_new_tokens=7, stop_token_ids=(9,)), stream=True)
    assert r.streaming and r.max_tokens == 7 and list(r.tokenized.input_token_ids) == [1, 2, 3]
    assert list(r.stop_token_ids) == [9, 151643, 151645]  # without them its gRPC path runs to max_tokens
    assert r.include_stop_token_in_output and r.output_config.exclude_input_from_output
    sc = r.sampling_config
    assert sc.beam_width == 1 and sc.num_return_sequences == 1
    for unset in ("temperature", "top_p", "top_k", "seed", "min_tokens", "repetition_penalty"):
        assert not sc.HasField(unset), unset  # the engine's defaults (the model's generation config)
    assert not r.HasField("guided_decoding") and not r.output_config.HasField("logprobs") and not r.embedding_bias
    ignoring = bound.generate_request("r2", [1], SamplingOptions(max_new_tokens=1, ignore_eos=True), stream=False)
    assert ignoring.ignore_eos and not ignoring.stop_token_ids
    assert TRTLLM.eos_token_ids == ()  # bind answers a copy: the registry's kind holds no engine's facts


def test_trtllm_sampling_constraints_bias_and_logprobs():
    bound = TRTLLM.bind(frozenset(), vocab_size=6)
    sampling = SamplingOptions(max_new_tokens=4, temperature=0.5, top_p=0.9, top_k=5, seed=-1, min_new_tokens=2, n=3,
                               repetition_penalty=1.1, logit_bias=((2, 5.0), (4, -100.0)), logprobs=2,
                               prompt_logprobs=True, constraint=Constraint("json_object"))
    r = bound.generate_request("r", [1], sampling, stream=False)
    sc = r.sampling_config
    assert (sc.temperature, sc.top_p, sc.top_k, sc.min_tokens, sc.num_return_sequences) == (0.5, pytest.approx(0.9),
                                                                                           5, 2, 3)
    assert sc.seed == 2 ** 64 - 1  # its seed is a uint64
    assert list(r.embedding_bias) == [0.0, 0.0, 5.0, 0.0, -100.0, 0.0]  # dense over the vocabulary
    assert r.output_config.logprobs == 2 and r.output_config.prompt_logprobs == 2
    assert r.guided_decoding.guide_type == tr.GuidedDecodingParams.GUIDE_TYPE_JSON_SCHEMA
    assert r.guided_decoding.guide == '{"type": "object"}'
    choice = bound.generate_request("c", [1], SamplingOptions(max_new_tokens=1, constraint=Constraint(
        "choice", ("a.b", "c"))), stream=False)
    assert choice.guided_decoding.guide_type == tr.GuidedDecodingParams.GUIDE_TYPE_REGEX
    assert choice.guided_decoding.guide == r"(a\.b|c)"
    grammar = bound.generate_request("g", [1], SamplingOptions(max_new_tokens=1, constraint=Constraint(
        "grammar", "root ::= 'x'")), stream=False)
    assert grammar.guided_decoding.guide_type == tr.GuidedDecodingParams.GUIDE_TYPE_EBNF_GRAMMAR
    with pytest.raises(ValueError):
        bound.generate_request("h", [1], SamplingOptions(max_new_tokens=1), stream=False, handover=Handover())


def test_trtllm_answers_are_read_by_their_own_field_names():
    chunk = tr.GenerateResponse(chunk=tr.GenerateStreamChunk(token_ids=[5, 6], sequence_index=0, prompt_tokens=3,
                                                             completion_tokens=2, cached_tokens=1))
    other = tr.GenerateResponse(chunk=tr.GenerateStreamChunk(token_ids=[7], sequence_index=1))
    done = tr.GenerateResponse(complete=tr.GenerateComplete(output_token_ids=[5, 6, 8], finish_reason="stop",
                                                            matched_token_id=8, prompt_tokens=3, completion_tokens=3))
    events = TRTLLM.events([chunk, other, done], stream=False)
    assert [e.token_ids for e in events] == [[5, 6], [5, 6, 8]] and events[1].matched_token_id == 8
    assert events[0].cached_tokens == 1 and events[1].finish_reason == "stop"
    assert TRTLLM.events([done], stream=True)[0].token_ids == ()  # streamed: the chunks carried them
    lp = tr.TokenLogprob(token_id=5, logprob=-0.5, top_logprobs=[tr.TopLogprob(token_id=5, logprob=-0.5),
                                                                 tr.TopLogprob(token_id=9, logprob=-1.0)])
    full = tr.GenerateResponse(complete=tr.GenerateComplete(
        output_token_ids=[5], sequence_index=2, finish_reason="length", logprobs=[lp],
        prompt_logprobs=[tr.TokenLogprob(token_id=1, logprob=-9.0), tr.TokenLogprob(token_id=2, logprob=-2.0)]))
    (event,) = TRTLLM.events_full([full], stream=False, logprobs=True, all_indexes=True)
    assert event.index == 2 and event.logprobs == ((5, -0.5, ((5, -0.5), (9, -1.0))),)
    assert event.prompt_logprobs == ((1, None, ()), (2, -2.0, ()))  # the first prompt token has none
    assert TRTLLM.healthy(tr.HealthCheckResponse(status="OK")) and not TRTLLM.healthy(tr.HealthCheckResponse(
        status="engine failed"))


def test_trtllm_facts_come_from_its_model_info():
    info = tr.GetModelInfoResponse(model_id="llama", max_input_len=4000, max_seq_len=4096, vocab_size=128256,
                                   supported_features=["lora"])
    assert TRTLLM.model_info(info).max_context_tokens == 4096 and TRTLLM.model_info(info).is_generation
    support = TRTLLM.support(info)
    assert support.constraints == frozenset()  # features named, guided decoding not among them
    assert not support.loads and not support.disaggregation and not support.videos and support.kv_events
    assert support.images  # (as each image's own bytes: below)
    assert TRTLLM.support(tr.GetModelInfoResponse(vocab_size=8)).constraints == CONSTRAINT_KINDS  # none named
    pooling = tr.GetModelInfoResponse(model_id="e5", max_seq_len=512, supported_features=["embedding"])
    assert not TRTLLM.model_info(pooling).is_generation and TRTLLM.support(pooling).embeddings
    assert not TRTLLM.support(pooling).images
    embed = TRTLLM.embed_request("e", [4, 5])
    assert isinstance(embed, tr.EmbedRequest) and list(embed.tokenized.input_token_ids) == [4, 5]


# -- MLX --------------------------------------------------------------------------------------------------------

def test_mlx_requests_and_answers():
    sampling = SamplingOptions(max_new_tokens=5, seed=-3, top_k=-1, logit_bias=((3, 1.5),), logprobs=1)
    r = MLX.generate_request("m", [1, 2], sampling, stream=True)
    sp = r.sampling_params
    assert r.WhichOneof("input") == "tokenized" and list(r.tokenized.input_ids) == [1, 2]
    assert sp.max_tokens == 5 and not sp.HasField("temperature") and sp.top_p == 1.0 and sp.top_k == 0
    assert sp.repetition_penalty == 1.0 and sp.seed == -3 and dict(sp.logit_bias) == {3: 1.5}
    assert sp.logprobs == 1
    assert list(MLX.abort_request("m").request_ids) == ["m"]
    done = ml.GenerateResponse(complete=ml.GenerateComplete(output_ids=[4], finish_reason="stop",
                                                            matched_stop_token_id=4, completion_tokens=1))
    (event,) = MLX.events([done], stream=False)
    assert event.matched_token_id == 4 and event.token_ids == [4]
    assert MLX.events([ml.GenerateResponse(complete=ml.GenerateComplete(output_ids=[4]))], False)[0] \
        .matched_token_id is None
    (full,) = MLX.events_full([done], stream=False, logprobs=True, all_indexes=False)
    assert full.prompt_logprobs is None
    support = MLX.support(ml.GetModelInfoResponse())
    assert not (support.choices or support.constraints or support.prompt_logprobs or support.kv_events
                or support.loads or support.embeddings or support.min_tokens or support.disaggregation)


# -- TokenSpeed -------------------------------------------------------------------------------------------------

def test_tokenspeed_requests_set_only_what_was_asked():
    plain = TOKENSPEED.generate_request("t", [1], SamplingOptions(max_new_tokens=3), stream=False)
    sp = plain.sampling_params
    assert sp.max_new_tokens == 3 and sp.no_stop_trim and sp.n == 1
    for unset in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "sampling_seed"):
        assert not sp.HasField(unset), unset
    assert not plain.return_logprob and not plain.HasField("logprob_start_len")
    asked = TOKENSPEED.generate_request("t", [1], SamplingOptions(
        max_new_tokens=3, temperature=0.0, seed=7, n=2, logprobs=3, logit_bias=((5, 2.0),),
        constraint=Constraint("choice", ("yes", "no"))), stream=True,
        handover=Handover("10.0.0.2", 8998, 2 ** 62))
    sp = asked.sampling_params
    assert sp.HasField("temperature") and sp.temperature == 0.0 and sp.sampling_seed == 7 and sp.n == 2
    assert sp.regex == "(yes|no)" and dict(sp.logit_bias) == {"5": 2.0}
    assert asked.return_logprob and asked.top_logprobs_num == 3 and not asked.HasField("logprob_start_len")
    kv = asked.kv_bootstrap_info
    assert (kv.bootstrap_host, kv.bootstrap_port, kv.bootstrap_room) == ("10.0.0.2", 8998, 2 ** 62)
    info = ts.GetModelInfoResponse(model_path="p", served_model_name="s", max_context_length=99, eos_token_ids=[2],
                                   supports_vision=True)
    facts = TOKENSPEED.model_info(info)
    assert (facts.served_model_name, facts.max_context_tokens, facts.eos_token_ids, facts.is_generation) == \
        ("s", 99, (2,), True)
    loads = ts.GetLoadsResponse(loads=[ts.SchedulerLoad(num_running_reqs=2, num_waiting_reqs=1,
                                                        max_running_requests=4)])
    assert TOKENSPEED.loads(loads).running == 2


# -- what a model's engines support ----------------------------------------------------------------------------

class _Client:
    def __init__(self, kind: str, support: EngineSupport) -> None:
        self.runtime_name, self.support = kind, support


def test_a_models_support_is_what_every_engine_serving_it_supports():
    entry = ModelEntry("m", None, 100, 0)
    _take_support(entry, _Client("vllm", FULL_SUPPORT))
    assert entry.engine_support is None  # the plain path checks nothing
    _take_support(entry, _Client("tokenspeed", TOKENSPEED.support(None)))
    _take_support(entry, _Client("mlx", MLX.support(None)))
    assert entry.engine_kinds == ("tokenspeed", "mlx")
    assert not entry.engine_support.choices and not entry.engine_support.prompt_logprobs
    _take_support(entry, _Client("vllm", FULL_SUPPORT))  # a full engine joining widens nothing
    assert not entry.engine_support.choices


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"),
    ({"logprobs": 1, "prompt_logprobs": True}, "echo"),
    ({"constraint": Constraint("json_object"), "constraint_field": "response_format"}, "response_format"),
    ({"min_tokens": 2}, "min_tokens"),
])
def test_a_request_for_what_the_engines_lack_is_a_400_naming_it(fields, param):
    entry = ModelEntry("m", None, 100, 0)
    _take_support(entry, _Client("mlx", MLX.support(None)))
    with pytest.raises(BadRequest) as refused:
        check_engine_support(entry, SamplingRequest(**fields))
    assert refused.value.param == param and refused.value.code == "unsupported_by_engine"
    assert "served by mlx engines" in str(refused.value)
    check_engine_support(entry, SamplingRequest(logprobs=2, seed=5))  # what it has passes


def test_trtllm_images_go_as_their_own_bytes_beside_the_expanded_prompt():
    """TensorRT-LLM's SMG servicer decodes each image's bytes and processes them itself: the gateway sends them as
    they came, beside the prompt it expanded; a video batch is never sent (its proto carries images only)."""
    from types import SimpleNamespace
    images = SimpleNamespace(modality="image", sources=[b"\x89PNG one", b"\xff\xd8 two"])
    request = TRTLLM.generate_request("r", [1, 7, 7, 2], SamplingOptions(max_new_tokens=4), False, media=(images,))
    assert list(request.multimodal_input.image_data) == [b"\x89PNG one", b"\xff\xd8 two"]
    assert list(request.tokenized.input_token_ids) == [1, 7, 7, 2]
    assert not TRTLLM.generate_request("r", [1], SamplingOptions(max_new_tokens=4), False).HasField("multimodal_input")
    with pytest.raises(ValueError, match="videos"):
        TRTLLM.generate_request("r", [1], SamplingOptions(max_new_tokens=4), False,
                                media=(images, SimpleNamespace(modality="video", sources=[b"x"])))

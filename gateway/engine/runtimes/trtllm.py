"""TensorRT-LLM's service (``trtllm.TrtllmService`` of smg-grpc-proto) as an engine kind.

Its requests: a sampling config (beam width 1, n as ``num_return_sequences``, each scalar only when the request
set it: its defaults are the engine's), ``max_tokens`` and stop token ids on the request itself, the model's
end-of-sequence ids among them (its gRPC path does not add the model's own, as smg notes: without them a TensorRT-LLM
engine runs every answer to max_tokens), the stop token kept in the output (the gateway trims stops itself, as with
SGLang's no_stop_trim), constraints as a guide of one type (any JSON object the schema {"type": "object"}, as smg
sends it; a choice the regex of its alternatives), logit bias as its dense ``embedding_bias`` over the model's vocabulary, log probabilities in
the output config. Its answers name the answer's index ``sequence_index``, the output ``output_token_ids``, and
carry log probabilities as one message per token.

Images: it takes each image's encoded bytes (``multimodal_input.image_data``; its SMG servicer decodes them to RGB and
its own input processor encodes them) beside the prompt's ids, which the gateway expands as for the other kinds (one
run of the model's image token an image, as its processor counts it: smg sends the same). Checked against the proto,
TensorRT-LLM's SMG servicer's code and the simulated engine only (no GPU here). No videos (its proto carries images
only).

What it lacks here: GetLoads (policies count the node's own requests) and prefill/decode legs (its proto has no field
that hands a context phase's parameters back to the gateway). Its GetModelInfo names what the engine supports
(``supported_features``): a list without "guided_decoding" holds requests to no constraint; one naming "embedding" is
a pooling model (Embed, not Generate).
"""

from __future__ import annotations

import copy
from typing import Any

from smg_grpc_proto.generated import trtllm_service_pb2 as tr

from ..messages import (CONSTRAINT_KINDS, Constraint, EngineSupport, GenerateEvent, Handover, ModelInfo,
                        SamplingOptions, TokenLogprob)
from ..pairing_info import PairingInfo
from .base import ENGINE_RUNTIMES, JSON_OBJECT_SCHEMA, EngineRuntime, choice_regex, set_given

GUIDE = tr.GuidedDecodingParams
GUIDE_TYPES = {"json_schema": GUIDE.GUIDE_TYPE_JSON_SCHEMA, "json_object": GUIDE.GUIDE_TYPE_JSON_SCHEMA,
               "regex": GUIDE.GUIDE_TYPE_REGEX, "grammar": GUIDE.GUIDE_TYPE_EBNF_GRAMMAR,
               "structural_tag": GUIDE.GUIDE_TYPE_STRUCTURAL_TAG, "choice": GUIDE.GUIDE_TYPE_REGEX}
SEED_MODULUS = 2 ** 64  # its seed is a uint64
POOLING_FEATURES = frozenset({"embedding", "embeddings", "pooling"})


class TrtllmRuntime(EngineRuntime):
    name = "trtllm"
    service = "trtllm.TrtllmService"
    pb = tr
    handover = None

    def __init__(self) -> None:
        self.eos_token_ids: tuple[int, ...] = ()  # bound per engine (bind): its requests carry them
        self.vocab_size = 0  # the dense logit bias's length

    def bind(self, eos_token_ids: "frozenset[int]", vocab_size: int) -> "TrtllmRuntime":
        bound = copy.copy(self)
        bound.eos_token_ids, bound.vocab_size = tuple(sorted(eos_token_ids)), vocab_size
        return bound

    def support(self, model_info: Any) -> EngineSupport:
        features = frozenset(model_info.supported_features)
        guided = not features or "guided_decoding" in features  # a list that says nothing of it withholds nothing
        pooling = bool(features & POOLING_FEATURES)
        return EngineSupport(constraints=CONSTRAINT_KINDS if guided else frozenset(), embeddings=pooling,
                             logit_bias=model_info.vocab_size > 0, images=not pooling, videos=False, loads=False,
                             disaggregation=False)

    def model_info(self, r: Any) -> ModelInfo:
        pooling = bool(frozenset(r.supported_features) & POOLING_FEATURES)
        return ModelInfo(model_path=r.model_id, served_model_name=r.model_id,
                         max_context_tokens=int(r.max_seq_len or r.max_input_len), vocab_size=int(r.vocab_size),
                         eos_token_ids=(), is_generation=not pooling)

    @staticmethod
    def healthy(r: Any) -> bool:
        return r.status.upper() == "OK"

    def generate_request(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions, stream: bool,
                         handover: Handover | None = None, media: Any = None, raw_pixels: bool = False) -> Any:
        if handover is not None or (media is not None and any(batch.modality != "image" for batch in media)):
            # refused before (its support): never sent half-done
            raise ValueError("a TensorRT-LLM engine takes neither prefill/decode hand-overs nor videos")
        request = tr.GenerateRequest(request_id=request_id, streaming=stream, max_tokens=sampling.max_new_tokens,
                                     include_stop_token_in_output=True)
        request.tokenized.input_token_ids.extend(input_ids)
        if media is not None:  # the images' own bytes: the engine decodes and processes them itself
            request.multimodal_input.image_data.extend(media[0].sources)
        sc = request.sampling_config
        sc.beam_width = 1
        sc.num_return_sequences = sampling.n
        set_given(sc, sampling)
        if sampling.min_p:
            sc.min_p = sampling.min_p
        if sampling.frequency_penalty:
            sc.frequency_penalty = sampling.frequency_penalty
        if sampling.presence_penalty:
            sc.presence_penalty = sampling.presence_penalty
        if sampling.seed is not None:
            sc.seed = sampling.seed % SEED_MODULUS
        if sampling.min_new_tokens:
            sc.min_tokens = sampling.min_new_tokens
        request.stop_token_ids.extend(sampling.stop_token_ids)
        if sampling.ignore_eos:
            request.ignore_eos = True
        else:
            request.stop_token_ids.extend(t for t in self.eos_token_ids if t not in sampling.stop_token_ids)
        if sampling.constraint is not None:
            _set_guide(request.guided_decoding, sampling.constraint)
        if sampling.logit_bias:
            bias = [0.0] * self.vocab_size
            for token_id, value in sampling.logit_bias:
                bias[token_id] = value  # ids checked against the vocabulary before (plan_generation)
            request.embedding_bias.extend(bias)
        oc = request.output_config
        oc.exclude_input_from_output = True
        if sampling.logprobs is not None:
            oc.logprobs = sampling.logprobs
            if sampling.prompt_logprobs:
                oc.prompt_logprobs = sampling.logprobs
        return request

    def abort_request(self, request_id: str) -> Any:
        return tr.AbortRequest(request_id=request_id)

    def embed_request(self, request_id: str, input_ids: "list[int]") -> Any:
        request = tr.EmbedRequest(request_id=request_id)
        request.tokenized.input_token_ids.extend(input_ids)
        return request

    def events(self, batch: "list[Any]", stream: bool) -> list[GenerateEvent]:
        events: list[GenerateEvent] = []
        for message in batch:
            kind = message.WhichOneof("response")
            if kind == "chunk":
                c = message.chunk
                if c.sequence_index != 0:
                    continue  # n=1 only
                events.append(GenerateEvent(c.token_ids[:], c.prompt_tokens, c.completion_tokens, c.cached_tokens))
            elif kind == "complete":
                c = message.complete
                if c.sequence_index != 0:
                    continue
                events.append(GenerateEvent(
                    () if stream else c.output_token_ids[:], c.prompt_tokens, c.completion_tokens, c.cached_tokens,
                    finish_reason=c.finish_reason or "stop", matched_token_id=self.matched(c)))
        return events

    def events_full(self, batch: "list[Any]", stream: bool, logprobs: bool, all_indexes: bool) -> list[GenerateEvent]:
        events: list[GenerateEvent] = []
        for message in batch:
            kind = message.WhichOneof("response")
            c = message.chunk if kind == "chunk" else message.complete
            if c.sequence_index != 0 and not all_indexes:
                continue
            if kind == "chunk":
                events.append(GenerateEvent(
                    c.token_ids[:], c.prompt_tokens, c.completion_tokens, c.cached_tokens,
                    logprobs=_logprobs(c.logprobs) if logprobs else None, index=c.sequence_index))
            elif kind == "complete":
                events.append(GenerateEvent(
                    () if stream else c.output_token_ids[:], c.prompt_tokens, c.completion_tokens, c.cached_tokens,
                    finish_reason=c.finish_reason or "stop", matched_token_id=self.matched(c),
                    logprobs=(() if stream else _logprobs(c.logprobs)) if logprobs else None,
                    prompt_logprobs=self.prompt_logprobs(c) if logprobs else None, index=c.sequence_index))
        return events

    @staticmethod
    def prompt_logprobs(message: Any) -> "tuple[TokenLogprob, ...] | None":
        lp = getattr(message, "prompt_logprobs", None)  # a complete's; a chunk carries none
        if not lp:
            return None
        # The prompt's first token has none (nothing came before it), whatever value the engine put there.
        return tuple((t.token_id, None if i == 0 else t.logprob, tuple((a.token_id, a.logprob) for a in t.top_logprobs))
                     for i, t in enumerate(lp))

    def pairing(self, server_info: Any) -> PairingInfo:
        return PairingInfo()  # no prefill/decode legs (handover None): never asked


ENGINE_RUNTIMES.add("trtllm", TrtllmRuntime(), "TensorRT-LLM's service (trtllm.TrtllmService)")


def _set_guide(guide: Any, constraint: Constraint) -> None:
    kind, spec = constraint.kind, constraint.spec
    guide.guide_type = GUIDE_TYPES[kind]
    if kind == "choice":
        guide.guide = choice_regex(spec)  # type: ignore[arg-type]
    elif kind == "json_object":
        guide.guide = JSON_OBJECT_SCHEMA  # its JSON guide would take any JSON value, not only an object
    else:
        guide.guide = spec  # type: ignore[assignment]


def _logprobs(lp: Any) -> "tuple[TokenLogprob, ...]":
    return tuple((t.token_id, t.logprob, tuple((a.token_id, a.logprob) for a in t.top_logprobs)) for t in lp)

"""MLX's engine service (``mlx.grpc.engine.MlxEngine`` of smg-grpc-proto, Apple silicon) as an engine kind.

Its requests: sampling in place (the temperature and max tokens only when set; top_p 1, top_k 0 and a repetition
penalty of 1 for none), logit bias keyed by the id, output log probabilities as a count, the seed as its int32 (the
gateway's bound on a seed: it fits). Its answers have vLLM's shape but
name the stop token ``matched_stop_token_id``.

What it lacks, each refused with a 400 before a request is sent (its support): n > 1, the prompt's log
probabilities, structured output, min_tokens, embeddings, images; and GetLoads, SubscribeKvEvents and
prefill/decode legs, which the gateway then does without (its own counts for load; no cache-aware index).
"""

from __future__ import annotations

from typing import Any

from smg_grpc_proto.generated import mlx_engine_pb2 as ml

from ..messages import EngineSupport, Handover, SamplingOptions, TokenLogprob
from ..pairing_info import PairingInfo
from .base import ENGINE_RUNTIMES, EngineRuntime, set_unless_default

SUPPORT = EngineSupport(prompt_logprobs=False, choices=False, constraints=frozenset(), min_tokens=False,
                        embeddings=False, images=False, videos=False, kv_events=False, loads=False,
                        disaggregation=False)


class MlxRuntime(EngineRuntime):
    name = "mlx"
    service = "mlx.grpc.engine.MlxEngine"
    pb = ml
    handover = None

    def support(self, model_info: Any) -> EngineSupport:
        return SUPPORT

    def generate_request(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions, stream: bool,
                         handover: Handover | None = None, media: Any = None, raw_pixels: bool = False) -> Any:
        if handover is not None or media is not None:  # refused before (its support): never sent half-done
            raise ValueError("an MLX engine takes neither prefill/decode hand-overs nor images")
        request = ml.GenerateRequest(request_id=request_id, stream=stream)
        request.tokenized.SetInParent()  # present even for an empty prompt
        request.tokenized.input_ids.extend(input_ids)
        sp = request.sampling_params
        sp.max_tokens = sampling.max_new_tokens
        if sampling.temperature is not None:
            sp.temperature = sampling.temperature
        sp.top_p = 1.0 if sampling.top_p is None else sampling.top_p
        sp.top_k = sampling.top_k if sampling.top_k is not None and sampling.top_k > 0 else 0
        sp.repetition_penalty = 1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty
        # (It has no min_tokens field: a request with one is refused before, and would fail here, not drop it.)
        set_unless_default(sp, sampling, "min_tokens")
        if sampling.seed is not None:
            sp.seed = sampling.seed
        for token_id, bias in sampling.logit_bias:
            sp.logit_bias[token_id] = bias
        if sampling.logprobs is not None:
            sp.logprobs = sampling.logprobs
        return request

    def abort_request(self, request_id: str) -> Any:
        return ml.AbortRequest(request_ids=[request_id])

    @staticmethod
    def matched(complete: Any) -> int | None:
        return complete.matched_stop_token_id if complete.HasField("matched_stop_token_id") else None

    @staticmethod
    def prompt_logprobs(message: Any) -> "tuple[TokenLogprob, ...] | None":
        return None  # it has none (refused before: its support)

    def pairing(self, server_info: Any) -> PairingInfo:
        return PairingInfo()  # no prefill/decode legs (handover None): never asked


ENGINE_RUNTIMES.add("mlx", MlxRuntime(), "MLX's engine (mlx.grpc.engine.MlxEngine)")

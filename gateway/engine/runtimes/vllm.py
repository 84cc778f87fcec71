"""vLLM's engine service (``vllm.grpc.engine.VllmEngine`` of smg-grpc-proto) as an engine kind.

Its requests: sampling in place (top_k 0 for none, the temperature only when set, the seed as a field), constraints
by its field names (json_object and choice of its own), logit bias keyed by the id, prompt logprobs as a count,
images on the servicer's preprocessed path (uint8 pixels when the engine normalizes on its device). Prefill/decode:
the prefill first, its ``kv_transfer_params`` to the decode (``KV_TRANSFER_PARAMS``). Its server facts: how it
takes images (gateway/engine/media_facts.py) and its KV connector's role and transfer settings.
"""

from __future__ import annotations

from typing import Any

from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as vl

from ..media_facts import MediaFacts, media_facts_of_vllm
from ..messages import Constraint, Handover, PrefillAnswer, SamplingOptions
from ..pairing_info import PairingInfo
from .base import ENGINE_RUNTIMES, KV_TRANSFER_PARAMS, EngineRuntime, set_unless_default, tensor

CONSTRAINT_FIELDS = {"json_schema": "json_schema", "json_object": "json_object", "regex": "regex",
                     "grammar": "grammar", "structural_tag": "structural_tag", "choice": "choice"}


class VllmRuntime(EngineRuntime):
    name = "vllm"
    service = "vllm.grpc.engine.VllmEngine"
    pb = vl
    handover = KV_TRANSFER_PARAMS

    def generate_request(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions, stream: bool,
                         handover: Handover | None = None, media: Any = None, raw_pixels: bool = False) -> Any:
        request = vl.GenerateRequest(request_id=request_id, stream=stream)
        sp = request.sampling_params  # in place, as SGLang's (skip_special_tokens false: the default)
        sp.max_tokens = sampling.max_new_tokens
        sp.top_p = 1.0 if sampling.top_p is None else sampling.top_p
        sp.top_k = 0 if sampling.top_k is None or sampling.top_k < 0 else sampling.top_k
        sp.repetition_penalty = 1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty
        sp.n = sampling.n
        set_unless_default(sp, sampling, "min_tokens")
        if sampling.temperature is not None:
            sp.temperature = sampling.temperature
        if sampling.seed is not None:
            sp.seed = sampling.seed
        if sampling.constraint is not None:
            _set_constraint(sp, sampling.constraint)
        if sampling.logit_bias:
            for token_id, bias in sampling.logit_bias:
                sp.logit_bias[token_id] = bias
        if sampling.logprobs is not None:
            sp.logprobs = sampling.logprobs
            if sampling.prompt_logprobs:
                sp.prompt_logprobs = sampling.logprobs
        request.tokenized.SetInParent()  # present even for an empty prompt
        request.tokenized.input_ids.extend(input_ids)  # in place: no copy of a 7,800-id message (~0.14 ms)
        if handover is not None and handover.kv_transfer_params_json is not None:
            request.kv_transfer_params_json = handover.kv_transfer_params_json
        if media is not None:  # a batch per modality: the first in mm_inputs, a video beside images in extra_mm_inputs
            _media(request.mm_inputs, media[0], raw_pixels)
            for batch in media[1:]:
                _media(request.extra_mm_inputs.add(), batch, raw_pixels)
        return request

    def abort_request(self, request_id: str) -> Any:
        return vl.AbortRequest(request_ids=[request_id])

    def prefill_answer(self, message: Any) -> "PrefillAnswer | None":
        if message.WhichOneof("response") != "complete":
            return None
        c = message.complete
        params = c.kv_transfer_params_json if c.HasField("kv_transfer_params_json") else None
        return PrefillAnswer(params, c.prompt_tokens, c.cached_tokens)

    def media_facts(self, server_info: Any) -> MediaFacts:
        return media_facts_of_vllm(server_info)

    def pairing(self, server_info: Any) -> PairingInfo:
        r = server_info
        return PairingInfo(protocol=r.pairing_protocol, mode=_mode(r.kv_role), kv_connector=r.kv_connector,
                           engine_id=r.kv_engine_id, kv_cache_dtype=r.kv_cache_dtype, block_size=int(r.block_size),
                           model_dtype=r.model_dtype, attention_backend=r.attention_backend)



ENGINE_RUNTIMES.add("vllm", VllmRuntime(), "vLLM's engine (vllm.grpc.engine.VllmEngine)")

def _mode(kv_role: str) -> str:
    """kv_both (or no connector) runs either way: no mode to hold a registration to."""
    return {"kv_producer": "prefill", "kv_consumer": "decode"}.get(kv_role, "")


def _set_constraint(sp: Any, constraint: Constraint) -> None:
    kind, spec = constraint.kind, constraint.spec
    if kind == "choice":
        sp.choice.choices.extend(spec)
    elif kind == "json_object":
        sp.json_object = True
    else:
        setattr(sp, CONSTRAINT_FIELDS[kind], spec)


def _media(mm: Any, media: Any, raw_pixels: bool) -> None:
    """A request's images (or videos) as its servicer's preprocessed path reads them: the modality (the servicer
    hands a video's pixels to the model as pixel_values_videos), the pixels (uint8 for an engine that normalizes
    them itself), the model's tensors, how they split per item (flat rows sized by a tensor, or batched), which stay
    on the CPU, the placeholder token and ranges, and a hash per item (the engine's encoder cache key)."""
    mm.modality = common_pb2.VIDEO if media.modality == "video" else common_pb2.IMAGE
    tensor(mm.pixel_values, media.pixel_values(raw_pixels), inline=True)
    tensors = media.tensors()  # (stacked per call: once)
    for key, array in tensors.items():
        tensor(mm.model_specific_tensors[key], array, inline=True)
    flat = media.processor.flat_pixels_by
    if flat is not None:
        mm.flat_keys["pixel_values"] = flat
    else:
        mm.batched_keys.append("pixel_values")
    flat_tensors = getattr(media.processor, "flat_tensors", ())  # laid out as the pixels are (Idefics3's masks)
    for key in tensors:
        if key in flat_tensors:
            mm.flat_keys[key] = flat
        else:  # the sizes one of a flat layout too: a model input for some (Gemma 3's crops)
            mm.batched_keys.append(key)
    mm.keep_on_cpu_keys.extend(media.processor.cpu_tensors)
    mm.im_token_id = media.processor.embed_id
    for offset, length in media.ranges:
        mm.mm_placeholders.add(offset=offset, length=length)
    mm.mm_hashes.extend(media.hashes)

"""SGLang's scheduler service (``sglang.grpc.scheduler.SglangScheduler`` of smg-grpc-proto) as an engine kind.

Its requests: sampling in place (its defaults for what is unset), the seed as a custom parameter (its
SamplingParams has no field for it), constraints by its field names (no json_object or choice: any JSON object is
the schema {"type": "object"} and a choice the regex of its alternatives, as its own OpenAI server does), logit bias
keyed by the id as text, images as one item of every image's pixels, a LoRA adapter by the id it was loaded under
(Load/Unload/ListLoadedLoRAAdapters load and unload them at run time). Prefill/decode: both legs at once with the
same bootstrap room (``BOOTSTRAP_ROOM``). Its server facts: disaggregation from its server arguments (a Struct);
nothing said about images (its engines take normalized floats, with no bound said).
"""

from __future__ import annotations

from typing import Any

from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg

from ..messages import EngineSupport, Handover, SamplingOptions
from ..pairing_info import PairingInfo
from .base import (ENGINE_RUNTIMES, BOOTSTRAP_ROOM, SGLANG_CONSTRAINT_FIELDS, EngineRuntime, pairing_of_server_args,
                   set_sglang_constraint, set_unless_default, tensor)

# Its field per constraint kind (see the module's docstring for the two it lacks).
CONSTRAINT_FIELDS = SGLANG_CONSTRAINT_FIELDS


# Its scheduler's multimodal inputs carry preprocessed images; its videos only as URLs or bytes it decodes itself.
SUPPORT = EngineSupport(videos=False)


class SglangRuntime(EngineRuntime):
    name = "sglang"
    service = "sglang.grpc.scheduler.SglangScheduler"
    pb = sg
    handover = BOOTSTRAP_ROOM

    def support(self, model_info: Any) -> EngineSupport:
        return SUPPORT

    def generate_request(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions, stream: bool,
                         handover: Handover | None = None, media: Any = None, raw_pixels: bool = False) -> Any:
        # Filled in place: a SamplingParams made apart is copied into the request (~1.5 us with upb). The
        # gateway detokenizes and matches stop strings itself: skip_special_tokens stays false (the default,
        # as every field set_unless_default leaves out: proto3 scalars without presence are not sent at
        # their default, so the message is the same).
        request = sg.GenerateRequest(request_id=request_id, stream=stream)
        sp = request.sampling_params
        sp.max_new_tokens = sampling.max_new_tokens
        sp.temperature = 1.0 if sampling.temperature is None else sampling.temperature
        sp.top_p = 1.0 if sampling.top_p is None else sampling.top_p
        sp.top_k = -1 if sampling.top_k is None else sampling.top_k
        sp.repetition_penalty = 1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty
        sp.no_stop_trim = True
        sp.n = sampling.n
        set_unless_default(sp, sampling, "min_new_tokens")
        if sampling.seed is not None:
            sp.custom_params.update({"seed": sampling.seed})
        if sampling.constraint is not None:
            set_sglang_constraint(sp, sampling.constraint)
        if sampling.logit_bias:
            for token_id, bias in sampling.logit_bias:
                sp.logit_bias[str(token_id)] = bias  # its map is keyed by the id as text
        if sampling.adapter is not None:
            request.lora_id = sampling.adapter
        if sampling.logprobs is not None:
            request.return_logprob = True
            request.top_logprobs_num = sampling.logprobs
            request.logprob_start_len = 0 if sampling.prompt_logprobs else -1  # -1: output tokens only
        request.tokenized.SetInParent()  # present even for an empty prompt
        request.tokenized.input_ids.extend(input_ids)  # in place: no copy of a 7,800-id message (~0.14 ms)
        if handover is not None and handover.bootstrap_room is not None:
            dp = request.disaggregated_params
            dp.bootstrap_host, dp.bootstrap_port = handover.bootstrap_host, handover.bootstrap_port
            dp.bootstrap_room = handover.bootstrap_room
        if media is not None:
            _media(request.mm_inputs, media[0])  # images only (SUPPORT: no videos)
        return request

    def abort_request(self, request_id: str) -> Any:
        return sg.AbortRequest(request_id=request_id, reason="client gone")

    adapters = True

    def load_adapter_request(self, name: str, path: str, pinned: bool, adapter_id: str) -> Any:
        return sg.LoadLoRAAdapterRequest(lora_name=name, lora_path=path, pinned=pinned, lora_id=adapter_id)

    def unload_adapter_request(self, name: str, adapter_id: str) -> Any:
        return sg.UnloadLoRAAdapterRequest(lora_name=name, lora_id=adapter_id)

    def pairing(self, server_info: Any) -> PairingInfo:
        return pairing_of_server_args(server_info)



ENGINE_RUNTIMES.add("sglang", SglangRuntime(), "SGLang's scheduler (sglang.grpc.scheduler.SglangScheduler)")

def _media(mm: Any, media: Any) -> None:
    """A request's images as its servicer reads them: one item of every image's pixels (normalized floats), the
    model's tensors, the placeholder token and ranges."""
    tensor(mm.pixel_values, media.pixel_values(False), inline=False)
    for key, array in media.tensors().items():
        tensor(mm.model_specific_tensors[key], array, inline=False)
    mm.im_token_id = media.processor.embed_id
    for offset, length in media.ranges:
        mm.mm_placeholders.add(offset=offset, length=length)

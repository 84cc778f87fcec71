"""TokenSpeed's scheduler service (``tokenspeed.grpc.scheduler.TokenSpeedScheduler`` of smg-grpc-proto) as an engine
kind.

Its requests: SGLang's shape with presence: every sampling scalar is optional and set only when the request set it
(its defaults are the engine's, the model's generation config), the seed as ``sampling_seed`` (a uint64), constraints
by SGLang's field names (no json_object or choice: any JSON object is the schema {"type": "object"} and a choice the
regex of its alternatives), logit bias keyed by the id as text, the stop token kept in the output (no_stop_trim: the
gateway trims stops itself), output log probabilities from the first output token (``logprob_start_len`` unset).
Prefill/decode: both legs at once with the same bootstrap address and room (``BOOTSTRAP_ROOM``), its disaggregation
read from its server arguments as SGLang's.

Images as its items carry them: one item an image, its encoder input the image's own normalized pixels, its other
tensors the image's (a grid as a batch of one row, as smg slices them per item), its placeholder range and token,
its content hash (the image's digest, the engine's encoder-cache key).

With encode workers (EPD, engine/encode_workers.py): each image's Encode carries that one item as above and its room;
the Generate carries the items without their pixels and, per item, its encode worker's bootstrap address and room
(``encode_bootstrap_info``), from which the prefill fetches the embedding.

What it lacks, refused with a 400 before a request is sent (its support): the prompt's log probabilities (its
answers carry none), embeddings (no Embed).
"""

from __future__ import annotations

from typing import Any

from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import tokenspeed_encoder_pb2 as te
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts

from ..messages import EngineSupport, Handover, SamplingOptions, TokenLogprob
from ..pairing_info import PairingInfo
from .base import (BOOTSTRAP_ROOM, ENGINE_RUNTIMES, SGLANG_CONSTRAINT_FIELDS, EngineRuntime, pairing_of_server_args,
                   set_given, set_sglang_constraint, set_unless_default, tensor)

CONSTRAINT_FIELDS = SGLANG_CONSTRAINT_FIELDS
SEED_MODULUS = 2 ** 64  # its sampling_seed is a uint64
SUPPORT = EngineSupport(prompt_logprobs=False, embeddings=False, videos=False)


class TokenSpeedRuntime(EngineRuntime):
    name = "tokenspeed"
    service = "tokenspeed.grpc.scheduler.TokenSpeedScheduler"
    pb = ts
    handover = BOOTSTRAP_ROOM
    encode_workers = True

    def support(self, model_info: Any) -> EngineSupport:
        return SUPPORT

    def generate_request(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions, stream: bool,
                         handover: Handover | None = None, media: Any = None, raw_pixels: bool = False,
                         encode: "list[Any] | None" = None) -> Any:
        """``encode``: the images' EncodeAssignments (EPD), whose embeddings the engine fetches from encode workers."""
        request = ts.GenerateRequest(request_id=request_id, stream=stream)
        sp = request.sampling_params
        sp.max_new_tokens = sampling.max_new_tokens
        sp.no_stop_trim = True
        sp.n = sampling.n
        set_given(sp, sampling)
        set_unless_default(sp, sampling, "min_new_tokens")
        if sampling.seed is not None:
            sp.sampling_seed = sampling.seed % SEED_MODULUS
        if sampling.constraint is not None:
            set_sglang_constraint(sp, sampling.constraint)
        for token_id, bias in sampling.logit_bias:
            sp.logit_bias[str(token_id)] = bias  # its map is keyed by the id as text
        if sampling.logprobs is not None:
            request.return_logprob = True
            request.top_logprobs_num = sampling.logprobs
        request.tokenized.SetInParent()  # present even for an empty prompt
        request.tokenized.input_ids.extend(input_ids)
        if handover is not None and handover.bootstrap_room is not None:
            kv = request.kv_bootstrap_info
            kv.bootstrap_host, kv.bootstrap_port = handover.bootstrap_host, handover.bootstrap_port
            kv.bootstrap_room = handover.bootstrap_room
        if media is not None:
            _items(request.mm_inputs, media[0], pixels=encode is None)  # images only (SUPPORT: no videos)
            for index, assignment in enumerate(encode or ()):
                request.encode_bootstrap_info.items.add(
                    item_index=index, bootstrap_host=assignment.worker.host,
                    bootstrap_port=assignment.worker.bootstrap_port, bootstrap_room=assignment.room)
        return request

    @staticmethod
    def encode_request(request_id: str, media: Any, index: int, room: int) -> Any:
        """Image ``index`` of a request's images as an encode worker takes it: that one item, pixels and all, and the
        room its prefill fetches the embedding from."""
        request = te.EncodeRequest(request_id=f"{request_id}-image-{index}")
        _items(request.mm_inputs, media, pixels=True, only=index)
        request.items.add(bootstrap_room=room)
        return request

    def abort_request(self, request_id: str) -> Any:
        return ts.AbortRequest(request_id=request_id, reason="client gone")

    @staticmethod
    def prompt_logprobs(message: Any) -> "tuple[TokenLogprob, ...] | None":
        return None  # its answers carry none (refused before: its support)

    def pairing(self, server_info: Any) -> PairingInfo:
        return pairing_of_server_args(server_info)


ENGINE_RUNTIMES.add("tokenspeed", TokenSpeedRuntime(),
                    "TokenSpeed's scheduler (tokenspeed.grpc.scheduler.TokenSpeedScheduler)")


def _items(mm: Any, media: Any, pixels: bool, only: int | None = None) -> None:
    """A request's images as its items: one an image (see the module's docstring); without their pixels when encode
    workers have them; ``only``: that image alone."""
    processor = media.processor
    for index, (image, (offset, length), image_hash) in enumerate(zip(media.images, media.ranges, media.hashes)):
        if only is not None and index != only:
            continue
        item = mm.items.add(modality=common_pb2.IMAGE, content_hash=bytes.fromhex(image_hash),
                            placeholder_token_id=processor.embed_id)
        if pixels:
            normalized = image.normalized if image.normalized is not None else processor.normalized(image.raw)
            tensor(item.encoder_input, normalized, inline=True)
        for key, array in image.tensors.items():
            tensor(item.model_specific_tensors[key], array[None], inline=True)
        item.placeholders.add(offset=offset, length=length)

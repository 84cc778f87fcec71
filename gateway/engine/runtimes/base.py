"""What an engine kind is to the gateway: how its requests are built and how its answers are read.

An ``EngineRuntime`` holds, for one gRPC service of smg-grpc-proto, both directions of the seam:

    requests    ``generate_request`` (sampling, constraints, images, the prefill/decode hand-over), ``abort_request``,
                ``embed_request``, and the method path of each call (``method``)
    answers     ``events`` (a batch of Generate answers as ``GenerateEvent``s; ``events_full`` with logprobs and every
                answer's index), ``prefill_answer`` (what a prefill leg hands the decode), ``model_info``, ``loads``
    facts       ``media_facts`` and ``pairing`` (what its GetServerInfo says about images and disaggregation), and
                ``handover``: how its prefill/decode legs meet (``BOOTSTRAP_ROOM``: both at once, one room;
                ``KV_TRANSFER_PARAMS``: prefill first, its parameters to the decode)

Each kind is one module in this package, registered in ``ENGINE_RUNTIMES`` (the order is detection's: the first
whose GetModelInfo answers is the engine's kind). Nothing outside this package compares a runtime's name: it asks
the runtime. The answer readers here serve every kind whose Generate answers have SGLang's and vLLM's shape (a
``chunk`` or a ``complete`` with token ids and counts); a kind with another shape overrides them.
"""

from __future__ import annotations

import abc
from typing import Any

from ...base.registry import Registry
from ..media_facts import MediaFacts
from ..messages import (EngineLoad, GenerateEvent, Handover, ModelInfo, PrefillAnswer, SamplingOptions,
                        TokenLogprob)
from ..pairing_info import PairingInfo

BOOTSTRAP_ROOM = "bootstrap_room"  # SGLang: both legs at once, meeting in a room at the prefill's bootstrap port
KV_TRANSFER_PARAMS = "kv_transfer_params"  # vLLM: the prefill first; its kv_transfer_params go to the decode


class EngineRuntime(abc.ABC):
    """One engine kind (see the module's docstring)."""

    name: str  # as the worker's "runtime" and metrics' labels show it
    service: str  # the gRPC service's full name
    pb: Any  # its generated messages
    handover: str  # BOOTSTRAP_ROOM or KV_TRANSFER_PARAMS

    def method(self, name: str) -> str:
        return f"/{self.service}/{name}"

    # -- requests ---------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def generate_request(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions,
                         stream: bool, handover: Handover | None = None, media: Any = None,
                         raw_pixels: bool = False) -> Any: ...

    @abc.abstractmethod
    def abort_request(self, request_id: str) -> Any: ...

    def embed_request(self, request_id: str, input_ids: "list[int]") -> Any:
        request = self.pb.EmbedRequest(request_id=request_id)
        request.tokenized.input_ids.extend(input_ids)
        return request

    # -- answers ----------------------------------------------------------------------------------------------

    def model_info(self, r: Any) -> ModelInfo:
        """A GetModelInfoResponse in the gateway's words."""
        return ModelInfo(model_path=r.model_path, served_model_name=r.served_model_name or r.model_path,
                         max_context_tokens=int(r.max_context_length), vocab_size=int(r.vocab_size),
                         eos_token_ids=tuple(r.eos_token_ids), is_generation=bool(r.is_generation),
                         supports_vision=bool(r.supports_vision), architectures=tuple(r.architectures))

    def loads(self, r: Any) -> EngineLoad:
        """A GetLoadsResponse, summed over its data-parallel ranks."""
        return EngineLoad(running=sum(x.num_running_reqs for x in r.loads),
                          waiting=sum(x.num_waiting_reqs for x in r.loads),
                          token_usage=max((x.token_usage for x in r.loads), default=0.0),
                          max_running=sum(x.max_running_requests for x in r.loads))

    def events(self, batch: "list[Any]", stream: bool) -> list[GenerateEvent]:
        """The events of one batch of Generate answers (n=1: other indexes are skipped). Per streamed token: a
        plain loop over the messages, nothing read that the plain path does not need."""
        events: list[GenerateEvent] = []
        for message in batch:
            kind = message.WhichOneof("response")
            if kind == "chunk":
                c = message.chunk
                if c.index != 0:
                    continue  # n=1 only
                events.append(GenerateEvent(c.token_ids[:], c.prompt_tokens, c.completion_tokens, c.cached_tokens))
            elif kind == "complete":
                c = message.complete
                if c.index != 0:
                    continue
                matched = c.matched_token_id if c.WhichOneof("matched_stop") == "matched_token_id" else None
                events.append(GenerateEvent(
                    () if stream else c.output_ids[:], c.prompt_tokens, c.completion_tokens,
                    c.cached_tokens, finish_reason=c.finish_reason or "stop", matched_token_id=matched))
        return events

    def events_full(self, batch: "list[Any]", stream: bool, logprobs: bool, all_indexes: bool) -> list[GenerateEvent]:
        """``events`` with each event's log probabilities and/or every answer's index (n > 1): apart, so the plain
        path reads nothing more."""
        events: list[GenerateEvent] = []
        for message in batch:
            kind = message.WhichOneof("response")
            c = message.chunk if kind == "chunk" else message.complete
            if c.index != 0 and not all_indexes:
                continue
            prompt = _prompt_logprobs(c.input_logprobs) if logprobs and c.HasField("input_logprobs") else None
            if kind == "chunk":
                events.append(GenerateEvent(
                    c.token_ids[:], c.prompt_tokens, c.completion_tokens, c.cached_tokens,
                    logprobs=_output_logprobs(c.output_logprobs) if logprobs else None, prompt_logprobs=prompt,
                    index=c.index))
            elif kind == "complete":
                matched = c.matched_token_id if c.WhichOneof("matched_stop") == "matched_token_id" else None
                events.append(GenerateEvent(
                    () if stream else c.output_ids[:], c.prompt_tokens, c.completion_tokens, c.cached_tokens,
                    finish_reason=c.finish_reason or "stop", matched_token_id=matched,
                    logprobs=(() if stream else _output_logprobs(c.output_logprobs)) if logprobs else None,
                    prompt_logprobs=prompt, index=c.index))
        return events

    @staticmethod
    def is_last(message: Any) -> bool:
        """A generation's last message (n=1): after it the engine only ends the call."""
        return message.WhichOneof("response") == "complete"

    def prefill_answer(self, message: Any) -> "PrefillAnswer | None":
        """What a prefill leg's answer hands the decode, from its last message; None for another message."""
        if message.WhichOneof("response") != "complete":
            return None
        c = message.complete
        return PrefillAnswer(None, c.prompt_tokens, c.cached_tokens)

    # -- facts ------------------------------------------------------------------------------------------------

    def media_facts(self, server_info: Any) -> MediaFacts:
        """How a vision engine of this kind takes images (its GetServerInfo); nothing said by default."""
        return MediaFacts()

    @abc.abstractmethod
    def pairing(self, server_info: Any) -> PairingInfo:
        """What its GetServerInfo says about disaggregation."""


# The kinds, each registered in its own module; the order is detection's.
ENGINE_RUNTIMES: "Registry[EngineRuntime]" = Registry("engine kind")


def _output_logprobs(lp: Any) -> "tuple[TokenLogprob, ...]":
    tops = lp.top_logprobs
    return tuple((token_id, value, tuple(zip(tops[i].token_ids, tops[i].values)) if i < len(tops) else ())
                 for i, (token_id, value) in enumerate(zip(lp.token_ids, lp.token_logprobs)))


def _prompt_logprobs(lp: Any) -> "tuple[TokenLogprob, ...] | None":
    """The prompt's: its first token has no logprob (nothing came before it)."""
    if not lp.token_ids:
        return None
    tops = lp.top_logprobs
    out = []
    for i, token_id in enumerate(lp.token_ids):
        entry = lp.token_logprobs[i] if i < len(lp.token_logprobs) else None
        value = entry.value if entry is not None and entry.HasField("value") else None
        out.append((token_id, value, tuple(zip(tops[i].token_ids, tops[i].values)) if i < len(tops) else ()))
    return tuple(out)


def set_unless_default(sp: Any, sampling: SamplingOptions, min_tokens_field: str) -> None:
    """The sampling fields SGLang's and vLLM's messages name alike, set on ``sp`` only when not at proto3's default
    (which is never sent): most requests set none of them. ``min_tokens_field``: the runtime's name for
    min_new_tokens."""
    if sampling.min_p:
        sp.min_p = sampling.min_p
    if sampling.frequency_penalty:
        sp.frequency_penalty = sampling.frequency_penalty
    if sampling.presence_penalty:
        sp.presence_penalty = sampling.presence_penalty
    if sampling.stop_token_ids:
        sp.stop_token_ids.extend(sampling.stop_token_ids)
    if sampling.ignore_eos:
        sp.ignore_eos = True
    if sampling.min_new_tokens:
        setattr(sp, min_tokens_field, sampling.min_new_tokens)


def tensor(td: Any, array: Any, inline: bool) -> None:
    """A numpy array into a TensorData: shape, dtype name, raw little-endian bytes (vLLM's ``inline``, SGLang's
    ``data``)."""
    td.shape.extend(array.shape)
    td.dtype = str(array.dtype)
    raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    if inline:
        td.inline = raw
    else:
        td.data = raw

"""What an engine kind is to the gateway: how its requests are built and how its answers are read.

An ``EngineRuntime`` holds, for one gRPC service of smg-grpc-proto, both directions of the seam:

    requests    ``generate_request`` (sampling, constraints, images, the prefill/decode hand-over), ``abort_request``,
                ``embed_request``, and the method path of each call (``method``)
    answers     ``events`` (a batch of Generate answers as ``GenerateEvent``s; ``events_full`` with logprobs and every
                answer's index), ``prefill_answer`` (what a prefill leg hands the decode), ``model_info``, ``loads``
    facts       ``media_facts`` and ``pairing`` (what its GetServerInfo says about images and disaggregation),
                ``handover``: how its prefill/decode legs meet (``BOOTSTRAP_ROOM``: both at once, one room;
                ``KV_TRANSFER_PARAMS``: prefill first, its parameters to the decode; None: it has no such legs), and
                ``support``: what it can be asked (``EngineSupport``: its proto, refined by its GetModelInfo)

Each kind is one module in this package, registered in ``ENGINE_RUNTIMES`` (the order is detection's: the first
whose GetModelInfo answers is the engine's kind). Nothing outside this package compares a runtime's name: it asks
the runtime. The answer readers here serve every kind whose Generate answers have SGLang's and vLLM's shape (a
``chunk`` or a ``complete`` with token ids and counts); a kind with another shape overrides them.
"""

from __future__ import annotations

import abc
import re
from typing import Any

from ...base.registry import Registry
from ..media_facts import MediaFacts
from ..messages import (FULL_SUPPORT, Constraint, EngineLoad, EngineSupport, GenerateEvent, Handover, ModelInfo, PrefillAnswer,
                        SamplingOptions, TokenLogprob)
from ..pairing_info import PairingInfo

BOOTSTRAP_ROOM = "bootstrap_room"  # SGLang: both legs at once, meeting in a room at the prefill's bootstrap port
KV_TRANSFER_PARAMS = "kv_transfer_params"  # vLLM: the prefill first; its kv_transfer_params go to the decode


class EngineRuntime(abc.ABC):
    """One engine kind (see the module's docstring)."""

    name: str  # as the worker's "runtime" and metrics' labels show it
    service: str  # the gRPC service's full name
    pb: Any  # its generated messages
    handover: str | None  # BOOTSTRAP_ROOM, KV_TRANSFER_PARAMS or None (no prefill/decode legs)

    def method(self, name: str) -> str:
        return f"/{self.service}/{name}"

    # Whether its images may be encoded on encode workers of their own (engine/encode_workers.py: TokenSpeed's EPD),
    # its generate_request then taking ``encode`` (the images' assignments) and its encode_request building each
    # image's Encode.
    encode_workers = False

    # Whether its service loads LoRA adapters at run time and answers with one a request names (Load/Unload/List
    # and a request's adapter id): SGLang's does; vLLM's contract has no field for an adapter.
    adapters = False

    def load_adapter_request(self, name: str, path: str, pinned: bool, adapter_id: str) -> Any:
        raise NotImplementedError(f"{self.name} engines load no adapters")

    def unload_adapter_request(self, name: str, adapter_id: str) -> Any:
        raise NotImplementedError(f"{self.name} engines load no adapters")

    def support(self, model_info: Any) -> EngineSupport:
        """What an engine of this kind can be asked, from its GetModelInfo answer (everything, by default)."""
        return FULL_SUPPORT

    def bind(self, eos_token_ids: "frozenset[int]", vocab_size: int) -> "EngineRuntime":
        """This kind for one engine whose model's end-of-sequence ids (its tokenizer's and generation config's) and
        vocabulary are known: a kind whose requests must carry them answers a copy holding them; itself otherwise."""
        return self

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
        # MLX's says nothing of vision, TokenSpeed's nothing of pooling: a field a kind lacks is its default.
        return ModelInfo(model_path=r.model_path, served_model_name=r.served_model_name or r.model_path,
                         max_context_tokens=int(r.max_context_length), vocab_size=int(r.vocab_size),
                         eos_token_ids=tuple(r.eos_token_ids), is_generation=bool(getattr(r, "is_generation", True)),
                         supports_vision=bool(getattr(r, "supports_vision", False)),
                         architectures=tuple(r.architectures))

    @staticmethod
    def healthy(r: Any) -> bool:
        """A HealthCheckResponse's verdict."""
        return bool(r.healthy)

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
                events.append(GenerateEvent(
                    () if stream else c.output_ids[:], c.prompt_tokens, c.completion_tokens,
                    c.cached_tokens, finish_reason=c.finish_reason or "stop", matched_token_id=self.matched(c)))
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
            prompt = self.prompt_logprobs(c) if logprobs else None
            if kind == "chunk":
                events.append(GenerateEvent(
                    c.token_ids[:], c.prompt_tokens, c.completion_tokens, c.cached_tokens,
                    logprobs=_output_logprobs(c.output_logprobs) if logprobs else None, prompt_logprobs=prompt,
                    index=c.index))
            elif kind == "complete":
                events.append(GenerateEvent(
                    () if stream else c.output_ids[:], c.prompt_tokens, c.completion_tokens, c.cached_tokens,
                    finish_reason=c.finish_reason or "stop", matched_token_id=self.matched(c),
                    logprobs=(() if stream else _output_logprobs(c.output_logprobs)) if logprobs else None,
                    prompt_logprobs=prompt, index=c.index))
        return events

    @staticmethod
    def matched(complete: Any) -> int | None:
        """The stop token a complete answer ended on, if it names one (once per answer)."""
        return complete.matched_token_id if complete.WhichOneof("matched_stop") == "matched_token_id" else None

    @staticmethod
    def prompt_logprobs(message: Any) -> "tuple[TokenLogprob, ...] | None":
        """The prompt's log probabilities a chunk or complete carries (``input_logprobs``), if any."""
        return _prompt_logprobs(message.input_logprobs) if message.HasField("input_logprobs") else None

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


JSON_OBJECT_SCHEMA = '{"type": "object"}'  # any JSON object, for kinds without a json_object constraint


def choice_regex(choices: "tuple[str, ...]") -> str:
    """A choice among strings as the regex of its alternatives, for kinds without a choice constraint (as SGLang's
    own OpenAI server does)."""
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


# SGLang's field per constraint kind, which TokenSpeed's messages share (no json_object nor choice of their own).
SGLANG_CONSTRAINT_FIELDS = {"json_schema": "json_schema", "json_object": "json_schema", "regex": "regex",
                            "grammar": "ebnf_grammar", "structural_tag": "structural_tag", "choice": "regex"}


def set_sglang_constraint(sp: Any, constraint: Constraint) -> None:
    """A constraint into SGLang-style sampling params: a JSON object as its schema, a choice as a regex."""
    kind, spec = constraint.kind, constraint.spec
    field = SGLANG_CONSTRAINT_FIELDS[kind]
    if kind == "choice":
        setattr(sp, field, choice_regex(spec))  # type: ignore[arg-type]
    elif kind == "json_object":
        setattr(sp, field, JSON_OBJECT_SCHEMA)
    else:
        setattr(sp, field, spec)


def pairing_of_server_args(server_info: Any) -> PairingInfo:
    """Disaggregation as SGLang-style servers say it: their server arguments as a Struct, where
    disaggregation_mode is prefill, decode or "null"."""
    args = dict(server_info.server_args.items()) if server_info.HasField("server_args") else {}
    mode = str(args.get("disaggregation_mode") or "")
    return PairingInfo(protocol=str(args.get("pairing_protocol") or ""),
                       mode="regular" if mode == "null" else mode if mode in ("prefill", "decode") else "",
                       kv_connector=str(args.get("disaggregation_transfer_backend") or ""))


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


def set_given(sp: Any, sampling: SamplingOptions) -> None:
    """The sampling scalars whose absence means "the engine's default" (the model's generation config), on ``sp``
    whose fields have presence (TensorRT-LLM's, TokenSpeed's): each only when the request set it; a top_k of 0 or
    less is no top-k, left unset."""
    if sampling.temperature is not None:
        sp.temperature = sampling.temperature
    if sampling.top_p is not None:
        sp.top_p = sampling.top_p
    if sampling.top_k is not None and sampling.top_k > 0:
        sp.top_k = sampling.top_k
    if sampling.repetition_penalty is not None:
        sp.repetition_penalty = sampling.repetition_penalty


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

"""Client for one gRPC engine (SGLang scheduler or vLLM engine service of smg-grpc-proto).

Normalises the two services into one small vocabulary (``ModelInfo``,
``EngineLoad``, ``GenerateEvent``) so that the rest of the gateway never sees
a protobuf message. All calls go through the shared ``GrpcBridge``.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2 as sg,
    vllm_engine_pb2 as vl,
)

from .bridge import GrpcBridge
from .errors import EngineCallError
from .media_facts import MediaFacts, media_facts_from_server_info
from .pairing_info import PairingInfo, pairing_from_server_info

TOKENIZER_BUNDLE_BYTES_MAX = 256 * 1024 * 1024  # a tokenizer bundle larger than this is refused


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    model_path: str
    served_model_name: str
    max_context_tokens: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    is_generation: bool = True  # False: a pooling model (embeddings): the engine answers Embed, not Generate
    supports_vision: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Embedding:
    """An engine's answer to Embed: the vector (as the engine pooled and normalized it) and the prompt's tokens."""

    vector: "Sequence[float]"
    prompt_tokens: int


@dataclasses.dataclass(frozen=True)
class EngineLoad:
    running: int
    waiting: int
    token_usage: float
    max_running: int


@dataclasses.dataclass(frozen=True, slots=True)
class Constraint:
    """What the engine's constrained decoding must hold the output to.

    ``kind``: json_schema, json_object, regex, grammar, structural_tag or choice (each runtime's field
    for each: ``_SGLANG_CONSTRAINT_FIELDS``, ``_VLLM_CONSTRAINT_FIELDS``).
    ``spec``: the JSON schema / regex / EBNF grammar / structural tag as text, the choices as a tuple
    of strings, nothing for ``json_object`` (any JSON object).
    """

    kind: str
    spec: "str | tuple[str, ...]" = ""


@dataclasses.dataclass(slots=True)  # not frozen: made per request (see GenerationPlan, gateway/serving/generation.py)
class SamplingOptions:
    max_new_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_new_tokens: int = 0
    constraint: Constraint | None = None
    logit_bias: "tuple[tuple[int, float], ...]" = ()  # (token id, bias), ids checked against the vocabulary
    # Log probabilities of the output tokens with this many alternatives each (None: none); of the
    # prompt's tokens too when prompt_logprobs (completions' echo).
    logprobs: int | None = None
    prompt_logprobs: bool = False
    n: int = 1  # answers to sample from the one prompt (the engine's n: its prefill is done once)


# One token's log probability: (token id, logprob, ((alternative id, logprob), ...) most likely first).
# The prompt's first token has none: its logprob is None.
TokenLogprob = "tuple[int, float | None, tuple[tuple[int, float], ...]]"


@dataclasses.dataclass(frozen=True, slots=True)
class Handover:
    """What one leg of a disaggregated request tells its engine about the KV hand-over.

    SGLang: both legs carry the same bootstrap address (the prefill's host and bootstrap port) and room.
    vLLM: each leg carries its kv_transfer_params as JSON (the prefill's asks for a remote decode; the
    decode's are those the prefill answered with).
    """

    bootstrap_host: str = ""
    bootstrap_port: int = 0
    bootstrap_room: int | None = None
    kv_transfer_params_json: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillAnswer:
    """What a prefill leg answered that matters: vLLM's parameters for the decode, and its token counts."""

    kv_transfer_params_json: str | None
    prompt_tokens: int
    cached_tokens: int


class GenerateEvent(NamedTuple):
    """New tokens of one generation; the last event has ``finish_reason`` set.

    A NamedTuple, made once per engine message (per token when streaming): ~0.17 us to
    build against ~0.56 us for a frozen dataclass, whose __init__ sets each field through
    object.__setattr__.
    """

    # A list as protobuf's slice gives it (twice as fast as tuple() over the repeated field, per token when
    # streaming); nothing changes it after.
    token_ids: "list[int] | tuple[int, ...]"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None = None
    matched_token_id: int | None = None
    logprobs: "tuple[TokenLogprob, ...] | None" = None  # of token_ids, when the request asked
    prompt_logprobs: "tuple[TokenLogprob, ...] | None" = None  # of the prompt, once, when asked
    index: int = 0  # which of the request's n answers (n > 1)


class _Runtime(abc.ABC):
    """What differs between the SGLang and vLLM services: names and message shapes."""

    name: str
    service: str
    pb: Any

    def method(self, name: str) -> str:
        return f"/{self.service}/{name}"

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


def _set_unless_default(sp: Any, sampling: SamplingOptions, min_tokens_field: str) -> None:
    """The sampling fields both runtimes name alike, set on ``sp`` only when not at proto3's default (which is
    never sent): most requests set none of them. ``min_tokens_field``: the runtime's name for min_new_tokens."""
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


class _Sglang(_Runtime):
    name = "sglang"
    service = "sglang.grpc.scheduler.SglangScheduler"
    pb = sg

    def generate_request(self, request_id, input_ids, sampling, stream, handover=None, media=None, raw_pixels=False):
        # Filled in place: a SamplingParams made apart is copied into the request (~1.5 us with upb). The
        # gateway detokenizes and matches stop strings itself: skip_special_tokens stays false (the default,
        # as every field _set_unless_default leaves out: proto3 scalars without presence are not sent at
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
        _set_unless_default(sp, sampling, "min_new_tokens")
        if sampling.seed is not None:
            # SGLang's SamplingParams has no seed field: it travels as a custom param.
            sp.custom_params.update({"seed": sampling.seed})
        if sampling.constraint is not None:
            _set_constraint(sp, sampling.constraint, _SGLANG_CONSTRAINT_FIELDS)
        if sampling.logit_bias:
            for token_id, bias in sampling.logit_bias:
                sp.logit_bias[str(token_id)] = bias  # SGLang's map is keyed by the id as text
        if sampling.logprobs is not None:
            request.return_logprob = True
            request.top_logprobs_num = sampling.logprobs
            request.logprob_start_len = 0 if sampling.prompt_logprobs else -1  # -1: output tokens only
        request.tokenized.SetInParent()  # present even for an empty prompt, as before
        request.tokenized.input_ids.extend(input_ids)  # in place: no copy of a 7,800-id message (~0.14 ms)
        if handover is not None and handover.bootstrap_room is not None:
            dp = request.disaggregated_params
            dp.bootstrap_host, dp.bootstrap_port = handover.bootstrap_host, handover.bootstrap_port
            dp.bootstrap_room = handover.bootstrap_room
        if media is not None:
            _sglang_media(request.mm_inputs, media)
        return request

    def abort_request(self, request_id):
        return sg.AbortRequest(request_id=request_id, reason="client gone")


class _Vllm(_Runtime):
    name = "vllm"
    service = "vllm.grpc.engine.VllmEngine"
    pb = vl

    def generate_request(self, request_id, input_ids, sampling, stream, handover=None, media=None, raw_pixels=False):
        request = vl.GenerateRequest(request_id=request_id, stream=stream)
        sp = request.sampling_params  # in place, as SGLang's (skip_special_tokens false: the default)
        sp.max_tokens = sampling.max_new_tokens
        sp.top_p = 1.0 if sampling.top_p is None else sampling.top_p
        sp.top_k = 0 if sampling.top_k is None or sampling.top_k < 0 else sampling.top_k
        sp.repetition_penalty = 1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty
        sp.n = sampling.n
        _set_unless_default(sp, sampling, "min_tokens")
        if sampling.temperature is not None:
            sp.temperature = sampling.temperature
        if sampling.seed is not None:
            sp.seed = sampling.seed
        if sampling.constraint is not None:
            _set_constraint(sp, sampling.constraint, _VLLM_CONSTRAINT_FIELDS)
        if sampling.logit_bias:
            for token_id, bias in sampling.logit_bias:
                sp.logit_bias[token_id] = bias
        if sampling.logprobs is not None:
            sp.logprobs = sampling.logprobs
            if sampling.prompt_logprobs:
                sp.prompt_logprobs = sampling.logprobs
        request.tokenized.SetInParent()  # present even for an empty prompt, as before
        request.tokenized.input_ids.extend(input_ids)  # in place: no copy of a 7,800-id message (~0.14 ms)
        if handover is not None and handover.kv_transfer_params_json is not None:
            request.kv_transfer_params_json = handover.kv_transfer_params_json
        if media is not None:
            _vllm_media(request.mm_inputs, media, raw_pixels)
        return request

    def abort_request(self, request_id):
        return vl.AbortRequest(request_ids=[request_id])


def _tensor(td: Any, array: Any, inline: bool) -> None:
    """A numpy array into a TensorData: shape, dtype name, raw little-endian bytes (vLLM's ``inline``, SGLang's
    ``data``)."""
    td.shape.extend(array.shape)
    td.dtype = str(array.dtype)
    raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    if inline:
        td.inline = raw
    else:
        td.data = raw


def _vllm_media(mm: Any, media: Any, raw_pixels: bool) -> None:
    """A request's images as the vLLM servicer's preprocessed path reads them: the pixels (uint8 for an engine
    that normalizes them itself), the model's tensors, how they split per image (flat rows sized by a tensor, or
    batched), which stay on the CPU, the placeholder token and ranges, and a hash per image (the engine's
    encoder cache key)."""
    mm.modality = common_pb2.IMAGE
    _tensor(mm.pixel_values, media.pixel_values(raw_pixels), inline=True)
    for key, array in media.tensors().items():
        _tensor(mm.model_specific_tensors[key], array, inline=True)
    flat = media.processor.flat_pixels_by
    if flat is not None:
        mm.flat_keys["pixel_values"] = flat
        mm.batched_keys.extend(key for key in media.tensors() if key != flat)
    else:
        mm.batched_keys.append("pixel_values")
        mm.batched_keys.extend(media.tensors())
    mm.keep_on_cpu_keys.extend(media.processor.cpu_tensors)
    mm.im_token_id = media.processor.placeholder_id
    for offset, length in media.ranges:
        mm.mm_placeholders.add(offset=offset, length=length)
    mm.mm_hashes.extend(media.hashes)


def _sglang_media(mm: Any, media: Any) -> None:
    """The same for SGLang's servicer: one item of every image's pixels, the model's tensors, the ranges."""
    _tensor(mm.pixel_values, media.pixel_values(False), inline=False)
    for key, array in media.tensors().items():
        _tensor(mm.model_specific_tensors[key], array, inline=False)
    mm.im_token_id = media.processor.placeholder_id
    for offset, length in media.ranges:
        mm.mm_placeholders.add(offset=offset, length=length)


# Each runtime's field per constraint kind. SGLang has no json_object or choice: as its own OpenAI
# server does, any JSON object is the schema {"type": "object"}, and a choice is the regex of its
# alternatives.
_SGLANG_CONSTRAINT_FIELDS = {"json_schema": "json_schema", "json_object": "json_schema", "regex": "regex",
                             "grammar": "ebnf_grammar", "structural_tag": "structural_tag", "choice": "regex"}
_VLLM_CONSTRAINT_FIELDS = {"json_schema": "json_schema", "json_object": "json_object", "regex": "regex",
                           "grammar": "grammar", "structural_tag": "structural_tag", "choice": "choice"}


def _set_constraint(sp: Any, constraint: Constraint, fields: "dict[str, str]") -> None:
    kind, spec = constraint.kind, constraint.spec
    field = fields[kind]
    if kind == "choice" and field == "choice":
        sp.choice.choices.extend(spec)
    elif kind == "choice":
        setattr(sp, field, "(" + "|".join(re.escape(c) for c in spec) + ")")
    elif kind == "json_object":
        setattr(sp, field, True if field == "json_object" else '{"type": "object"}')
    else:
        setattr(sp, field, spec)


RUNTIMES: dict[str, _Runtime] = {"sglang": _Sglang(), "vllm": _Vllm()}


class GrpcEngineClient:
    """One engine at ``target`` ("host:port"), speaking ``runtime`` ("sglang" or "vllm").

    A worker client (``gateway.workers.worker.WorkerClient``): token ids in and out, so the
    gateway tokenizes for it, and it reports its load and its KV-cache events.
    """

    kind = "grpc"
    needs_tokenizer = True
    publishes_kv_events = True

    def __init__(self, bridge: GrpcBridge, target: str, runtime: str) -> None:
        self.bridge = bridge
        self.target = target
        self.runtime = RUNTIMES[runtime]
        self.architectures: tuple[str, ...] = ()  # the model's, as GetModelInfo last said (parser choice)
        self.is_generation = True  # GetModelInfo's: False for an embedding (pooling) model
        self.supports_vision = False
        self.media_facts = MediaFacts()  # GetServerInfo's, for a vision model: how it takes images

    @property
    def runtime_name(self) -> str:
        return self.runtime.name

    async def aclose(self) -> None:
        """Release the engine's connection (after the worker drained)."""
        try:
            await self.bridge.close_channel(self.target)
        except EngineCallError:
            pass  # already closed: nothing left to release

    @classmethod
    async def detect(cls, bridge: GrpcBridge, target: str, timeout_s: float) -> "GrpcEngineClient":
        """Find which service the engine serves: SGLang's first, then vLLM's."""
        last: EngineCallError | None = None
        for runtime in RUNTIMES:
            client = cls(bridge, target, runtime)
            try:
                await client.model_info(timeout_s)
                return client
            except EngineCallError as e:
                if e.code != "UNIMPLEMENTED":
                    raise
                last = e
        raise EngineCallError("UNIMPLEMENTED", f"{target} serves neither SGLang nor vLLM: {last}")

    async def _unary(self, name: str, request: Any, response_type: Any, timeout_s: float | None) -> Any:
        return await self.bridge.unary(self.target, self.runtime.method(name), request, response_type, timeout_s)

    async def model_info(self, timeout_s: float) -> ModelInfo:
        pb = self.runtime.pb
        r = await self._unary("GetModelInfo", pb.GetModelInfoRequest(), pb.GetModelInfoResponse, timeout_s)
        self.architectures = tuple(r.architectures)
        self.is_generation, self.supports_vision = bool(r.is_generation), bool(r.supports_vision)
        if self.supports_vision:
            self.media_facts = await self._media_facts(timeout_s)
        return ModelInfo(
            model_path=r.model_path,
            served_model_name=r.served_model_name or r.model_path,
            max_context_tokens=int(r.max_context_length),
            vocab_size=int(r.vocab_size),
            eos_token_ids=tuple(r.eos_token_ids),
            is_generation=self.is_generation,
            supports_vision=self.supports_vision,
        )

    async def _media_facts(self, timeout_s: float) -> MediaFacts:
        pb = self.runtime.pb
        try:
            r = await self._unary("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout_s)
        except EngineCallError as e:
            if e.code != "UNIMPLEMENTED":
                raise
            return MediaFacts()  # an engine that says nothing: normalized floats, no bounds said
        return media_facts_from_server_info(self.runtime.name, r)

    async def pairing_info(self, timeout_s: float) -> PairingInfo:
        """What the engine says about disaggregation (its role, pairing protocol, KV connector)."""
        pb = self.runtime.pb
        r = await self._unary("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout_s)
        return pairing_from_server_info(self.runtime.name, r)

    async def health(self, timeout_s: float) -> bool:
        pb = self.runtime.pb
        r = await self._unary("HealthCheck", pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout_s)
        return bool(r.healthy)

    async def loads(self, timeout_s: float) -> EngineLoad:
        pb = self.runtime.pb
        r = await self._unary("GetLoads", pb.GetLoadsRequest(), pb.GetLoadsResponse, timeout_s)
        running = sum(x.num_running_reqs for x in r.loads)
        waiting = sum(x.num_waiting_reqs for x in r.loads)
        usage = max((x.token_usage for x in r.loads), default=0.0)
        max_running = sum(x.max_running_requests for x in r.loads)
        return EngineLoad(running=running, waiting=waiting, token_usage=usage, max_running=max_running)

    async def embed(self, request_id: str, input_ids: "list[int]", timeout_s: float | None) -> Embedding:
        """One input's embedding (the engine pools and normalizes it); EngineCallError as for any call."""
        pb = self.runtime.pb
        r = await self._unary("Embed", self.runtime.embed_request(request_id, input_ids), pb.EmbedResponse, timeout_s)
        if not r.embedding:
            raise EngineCallError("INTERNAL", "the engine answered Embed with an empty vector")
        return Embedding(r.embedding, int(r.prompt_tokens) or len(input_ids))

    async def abort(self, request_id: str, timeout_s: float = 5.0) -> None:
        pb = self.runtime.pb
        await self._unary("Abort", self.runtime.abort_request(request_id), pb.AbortResponse, timeout_s)

    async def fetch_tokenizer_bundle(self, timeout_s: float) -> bytes:
        """The engine's tokenizer files as zip bytes, checked against the sha256 it sends."""
        parts: list[bytes] = []
        size = 0
        digest = ""
        async with self.bridge.open_stream(self.target, self.runtime.method("GetTokenizer"),
                                           common_pb2.GetTokenizerRequest(), common_pb2.GetTokenizerChunk,
                                           timeout_s) as stream:
            async for batch in stream:
                for chunk in batch:
                    size += len(chunk.data)
                    if size > TOKENIZER_BUNDLE_BYTES_MAX:
                        raise EngineCallError("RESOURCE_EXHAUSTED", "tokenizer bundle too large")
                    parts.append(chunk.data)
                    if chunk.sha256:
                        digest = chunk.sha256
        data = b"".join(parts)
        if not digest:
            raise EngineCallError("DATA_LOSS", "tokenizer bundle ended without a sha256")
        if hashlib.sha256(data).hexdigest() != digest:
            raise EngineCallError("DATA_LOSS", "tokenizer bundle sha256 mismatch")
        return data

    def generate(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions, stream: bool,
                 timeout_s: float | None, metadata: "tuple[tuple[bytes, bytes], ...]" = (),
                 handover: Handover | None = None, media: Any = None) -> "Generation":
        """Open a generation: ``async with client.generate(...) as g: async for events in g``.

        Events come in lists (those that crossed the bridge together). Streaming mode: chunks
        carry deltas; the closing ``complete`` repeats the last delta (vLLM DELTA mode), so its
        ids are dropped. Non-streaming: one ``complete`` with every id.
        """
        request = self.runtime.generate_request(request_id, input_ids, sampling, stream, handover, media,
                                                self.media_facts.raw_pixels)
        messages = self.bridge.open_stream(self.target, self.runtime.method("Generate"), request,
                                           self.runtime.pb.GenerateResponse, timeout_s,
                                           # n > 1: one complete per answer, none of them surely the last
                                           last_message=_is_complete if sampling.n == 1 else None,
                                           metadata=metadata,  # (a trace's traceparent: the engine's spans join)
                                           # One answer's chunks without logprobs add up as protobuf merges
                                           # them (token ids appended; the counts are cumulative).
                                           merge_until_last=sampling.n == 1 and sampling.logprobs is None)
        return Generation(messages, stream, sampling.logprobs is not None, sampling.n > 1)

    async def prefill(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions, handover: Handover,
                      timeout_s: float | None, metadata: "tuple[tuple[bytes, bytes], ...]" = (),
                      media: Any = None) -> PrefillAnswer:
        """The prefill leg of a disaggregated request: unstreamed, its answer read to its end and dropped but for
        what the decode needs."""
        request = self.runtime.generate_request(request_id, input_ids, sampling, False, handover, media,
                                                self.media_facts.raw_pixels)
        async with self.bridge.open_stream(self.target, self.runtime.method("Generate"), request,
                                           self.runtime.pb.GenerateResponse, timeout_s, last_message=_is_complete,
                                           metadata=metadata) as messages:
            async for batch in messages:
                for message in batch:
                    if message.WhichOneof("response") != "complete":
                        continue
                    c = message.complete
                    params = c.kv_transfer_params_json if self.runtime.name == "vllm" and \
                        c.HasField("kv_transfer_params_json") else None
                    return PrefillAnswer(params, c.prompt_tokens, c.cached_tokens)
        raise EngineCallError("UNAVAILABLE", "the prefill engine closed the stream without finishing")

    def subscribe_kv_events(self, start_sequence_number: int) -> Any:
        """The engine's KV event batches (``common_pb2.KvEventBatch``), from a sequence number.

        ``async with client.subscribe_kv_events(n) as stream: async for batch in stream``.
        """
        request = common_pb2.SubscribeKvEventsRequest(start_sequence_number=start_sequence_number)
        return self.bridge.open_stream(self.target, self.runtime.method("SubscribeKvEvents"), request,
                                       common_pb2.KvEventBatch, None)


class Generation:
    """An open Generate call: entered with ``async with``, then iterated for lists of events.

    A class rather than async generators wrapped in an ``asynccontextmanager``: it is on every
    request's path, where each generator costs its object, a wrapper and trio's
    async-generator hooks, and must be closed explicitly (trio would finalize an abandoned
    one by starting a task for it).
    """

    __slots__ = ("_opened", "_messages", "_stream", "_full", "_logprobs", "_all_indexes")

    def __init__(self, opened: Any, stream: bool, logprobs: bool = False, all_indexes: bool = False) -> None:
        self._opened = opened  # the bridge's server stream (an async context manager)
        self._messages: Any = None
        self._stream = stream
        self._full = logprobs or all_indexes  # events through _events_full rather than the plain _events
        self._logprobs = logprobs
        self._all_indexes = all_indexes

    async def __aenter__(self) -> "Generation":
        self._messages = await self._opened.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> bool | None:
        return await self._opened.__aexit__(exc_type, exc, traceback)

    def __aiter__(self) -> "Generation":
        return self

    async def __anext__(self) -> list[GenerateEvent]:
        while True:
            batch = await self._messages.__anext__()  # StopAsyncIteration ends it
            if not batch:
                return []  # woken by the listener (listen): it left something to the reader
            events = self._events(batch)
            if events:
                return events

    def listen(self, listener: "Callable[[], bool]") -> bool:
        """Have ``listener`` take events as they arrive while the reader awaits (h2grpc's
        ``ServerStream.listen``); False when the client has no such thing (the grpcio bridge)."""
        listen = getattr(self._messages, "listen", None)
        if listen is None:
            return False
        listen(listener)
        return True

    def take_now(self) -> "list[GenerateEvent] | None":
        """The events waiting, for the listener; None for those it must leave to the reader."""
        batch = self._messages.take_now()
        return None if batch is None else self._events(batch)

    def _events(self, batch: list[Any]) -> list[GenerateEvent]:
        if not self._full:
            return _events(batch, self._stream)
        return _events_full(batch, self._stream, self._logprobs, self._all_indexes)


def _is_complete(message: Any) -> bool:
    """A generation's last message (n=1): after it the engine only ends the call."""
    return message.WhichOneof("response") == "complete"


def _events(batch: list[Any], stream: bool) -> list[GenerateEvent]:
    """The events of one batch of GenerateResponse messages (n=1: other indexes are skipped)."""
    events: list[GenerateEvent] = []
    for message in batch:
        kind = message.WhichOneof("response")
        if kind == "chunk":
            c = message.chunk
            if c.index != 0:
                continue  # n=1 only
            events.append(GenerateEvent(c.token_ids[:], c.prompt_tokens, c.completion_tokens,
                                        c.cached_tokens))
        elif kind == "complete":
            c = message.complete
            if c.index != 0:
                continue
            matched = c.matched_token_id if c.WhichOneof("matched_stop") == "matched_token_id" else None
            events.append(GenerateEvent(
                () if stream else c.output_ids[:], c.prompt_tokens, c.completion_tokens,
                c.cached_tokens, finish_reason=c.finish_reason or "stop", matched_token_id=matched))
    return events


def _events_full(batch: list[Any], stream: bool, logprobs: bool, all_indexes: bool) -> list[GenerateEvent]:
    """``_events`` with each event's log probabilities and/or every answer's index (n > 1): a separate
    function, so the plain path reads nothing more."""
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

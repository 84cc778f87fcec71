"""Client for one gRPC engine of any kind smg-grpc-proto defines (``runtimes/``: SGLang's, vLLM's, TensorRT-LLM's,
MLX's, TokenSpeed's).

Speaks the engine's service through its kind (``EngineRuntime``: requests built, answers read) and the shared
``GrpcBridge``, in the gateway's vocabulary (``messages.py``: ``ModelInfo``, ``EngineLoad``, ``GenerateEvent``...):
the rest of the gateway never sees a protobuf message, nor which kind an engine is but through its runtime.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

from smg_grpc_proto.generated import common_pb2

from .bridge import GrpcBridge
from .errors import EngineCallError
from .media_facts import MediaFacts
from .messages import (FULL_SUPPORT, Constraint, Embedding, EngineLoad, EngineSupport, GenerateEvent, Handover,
                       ModelInfo, PrefillAnswer, SamplingOptions, TokenLogprob)
from .pairing_info import PairingInfo
from .runtimes import ENGINE_RUNTIMES, EngineRuntime

__all__ = ["Constraint", "Embedding", "EngineLoad", "GenerateEvent", "GrpcEngineClient", "Handover", "ModelInfo",
           "PrefillAnswer", "SamplingOptions", "TokenLogprob"]

TOKENIZER_BUNDLE_BYTES_MAX = 256 * 1024 * 1024  # a tokenizer bundle larger than this is refused


class GrpcEngineClient:
    """One engine at ``target`` ("host:port"), of the kind ``runtime`` names (``ENGINE_RUNTIMES``).

    A worker client (``gateway.workers.worker.WorkerClient``): token ids in and out, so the
    gateway tokenizes for it, and it reports its load and its KV-cache events.
    """

    kind = "grpc"
    needs_tokenizer = True

    def __init__(self, bridge: GrpcBridge, target: str, runtime: str) -> None:
        self.bridge = bridge
        self.target = target
        self.runtime: EngineRuntime = ENGINE_RUNTIMES[runtime]
        self.architectures: tuple[str, ...] = ()  # the model's, as GetModelInfo last said (parser choice)
        self.is_generation = True  # GetModelInfo's: False for an embedding (pooling) model
        self.supports_vision = False
        self.vocab_size = 0  # GetModelInfo's: the model's embedding rows (a tokenizer may hold fewer or more ids)
        self.media_facts = MediaFacts()  # GetServerInfo's, for a vision model: how it takes images
        self.support: EngineSupport = FULL_SUPPORT  # what its kind can be asked, as GetModelInfo last said
        # The node's encode workers (encode_workers.EncodePool), for a kind whose images they may encode.
        self.encoders: Any = None

    @property
    def runtime_name(self) -> str:
        return self.runtime.name

    @property
    def handover(self) -> str | None:
        """How this engine's prefill/decode legs meet (``runtimes.BOOTSTRAP_ROOM`` or ``KV_TRANSFER_PARAMS``; None:
        its kind has none)."""
        return self.runtime.handover

    @property
    def publishes_kv_events(self) -> bool:
        return self.support.kv_events

    def learn_model_files(self, eos_token_ids: "frozenset[int]") -> None:
        """The model's end-of-sequence ids from its tokenizer files, for a kind whose requests carry them."""
        self.runtime = self.runtime.bind(eos_token_ids, self.vocab_size)

    async def aclose(self) -> None:
        """Release the engine's connection (after the worker drained)."""
        try:
            await self.bridge.close_channel(self.target)
        except EngineCallError:
            pass  # already closed: nothing left to release

    @classmethod
    async def detect(cls, bridge: GrpcBridge, target: str, timeout_s: float) -> "GrpcEngineClient":
        """Find which kind's service the engine serves, in ``ENGINE_RUNTIMES``' order."""
        last: EngineCallError | None = None
        for runtime in ENGINE_RUNTIMES:
            client = cls(bridge, target, runtime)
            try:
                await client.model_info(timeout_s)
                return client
            except EngineCallError as e:
                if e.code != "UNIMPLEMENTED":
                    raise
                last = e
        raise EngineCallError("UNIMPLEMENTED", f"{target} serves no engine service known here "
                              f"({', '.join(ENGINE_RUNTIMES)}): {last}")

    async def _unary(self, name: str, request: Any, response_type: Any, timeout_s: float | None) -> Any:
        return await self.bridge.unary(self.target, self.runtime.method(name), request, response_type, timeout_s)

    async def model_info(self, timeout_s: float) -> ModelInfo:
        pb = self.runtime.pb
        answer = await self._unary("GetModelInfo", pb.GetModelInfoRequest(), pb.GetModelInfoResponse, timeout_s)
        info = self.runtime.model_info(answer)
        self.support = self.runtime.support(answer)
        self.architectures, self.is_generation, self.supports_vision, self.vocab_size = \
            info.architectures, info.is_generation, info.supports_vision, info.vocab_size
        if self.supports_vision:
            self.media_facts = await self._media_facts(timeout_s)
        return info

    async def _media_facts(self, timeout_s: float) -> MediaFacts:
        pb = self.runtime.pb
        try:
            r = await self._unary("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout_s)
        except EngineCallError as e:
            if e.code != "UNIMPLEMENTED":
                raise
            return MediaFacts()  # an engine that says nothing: normalized floats, no bounds said
        return self.runtime.media_facts(r)

    async def pairing_info(self, timeout_s: float) -> PairingInfo:
        """What the engine says about disaggregation (its role, pairing protocol, KV connector)."""
        pb = self.runtime.pb
        r = await self._unary("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout_s)
        return self.runtime.pairing(r)

    async def health(self, timeout_s: float) -> bool:
        pb = self.runtime.pb
        r = await self._unary("HealthCheck", pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout_s)
        return self.runtime.healthy(r)

    async def loads(self, timeout_s: float) -> EngineLoad | None:
        """Its load; None for a kind without GetLoads (policies count the node's own requests)."""
        if not self.support.loads:
            return None
        pb = self.runtime.pb
        return self.runtime.loads(await self._unary("GetLoads", pb.GetLoadsRequest(), pb.GetLoadsResponse, timeout_s))

    async def embed(self, request_id: str, input_ids: "list[int]", timeout_s: float | None) -> Embedding:
        """One input's embedding (the engine pools and normalizes it); EngineCallError as for any call."""
        if not self.support.embeddings:  # refused before: a model's entry says it (gateway/api/embeddings.py)
            raise EngineCallError("UNIMPLEMENTED", f"a {self.runtime.name} engine does not embed")
        pb = self.runtime.pb
        r = await self._unary("Embed", self.runtime.embed_request(request_id, input_ids), pb.EmbedResponse, timeout_s)
        if not r.embedding:
            raise EngineCallError("INTERNAL", "the engine answered Embed with an empty vector")
        return Embedding(r.embedding, int(r.prompt_tokens) or len(input_ids))

    @property
    def takes_adapters(self) -> bool:
        """Its kind loads LoRA adapters at run time (gateway/adapters)."""
        return self.runtime.adapters

    async def load_adapter(self, name: str, path: str, pinned: bool, adapter_id: str,
                           timeout_s: float | None) -> frozenset[str]:
        """Load an adapter from ``path`` on the engine's disk under ``adapter_id``: the ids loaded after it (the
        engine's own snapshot); an engine that says it could not is FAILED_PRECONDITION with its message."""
        pb = self.runtime.pb
        r = await self._unary("LoadLoRAAdapter", self.runtime.load_adapter_request(name, path, pinned, adapter_id),
                              pb.LoadLoRAAdapterResponse, timeout_s)
        if not r.success:
            raise EngineCallError("FAILED_PRECONDITION", r.message or f"the engine did not load adapter {name}")
        return frozenset(r.loaded_lora_ids)

    async def unload_adapter(self, name: str, adapter_id: str, timeout_s: float | None) -> frozenset[str]:
        pb = self.runtime.pb
        r = await self._unary("UnloadLoRAAdapter", self.runtime.unload_adapter_request(name, adapter_id),
                              pb.UnloadLoRAAdapterResponse, timeout_s)
        if not r.success:
            raise EngineCallError("FAILED_PRECONDITION", r.message or f"the engine did not unload adapter {name}")
        return frozenset(r.loaded_lora_ids)

    async def list_adapters(self, timeout_s: float | None) -> frozenset[str]:
        """The ids of the adapters loaded on the engine (however they were loaded)."""
        pb = self.runtime.pb
        r = await self._unary("ListLoadedLoRAAdapters", pb.ListLoadedLoRAAdaptersRequest(),
                              pb.ListLoadedLoRAAdaptersResponse, timeout_s)
        return frozenset(a.lora_id for a in r.loaded_adapters)

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
        # A decode leg (``handover``) gets its images as before: its prefill leg fetches their embeddings.
        request, encoding = self._generate_request(request_id, input_ids, sampling, stream, handover, media,
                                                   epd=handover is None)
        messages = self.bridge.open_stream(self.target, self.runtime.method("Generate"), request,
                                           self.runtime.pb.GenerateResponse, timeout_s,
                                           # n > 1: one complete per answer, none of them surely the last
                                           last_message=self.runtime.is_last if sampling.n == 1 else None,
                                           metadata=metadata,  # (a trace's traceparent: the engine's spans join)
                                           # One answer's chunks without logprobs add up as protobuf merges
                                           # them (token ids appended; the counts are cumulative).
                                           merge_until_last=sampling.n == 1 and sampling.logprobs is None)
        return Generation(self.runtime, messages, stream, sampling.logprobs is not None, sampling.n > 1, encoding)

    async def prefill(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions, handover: Handover,
                      timeout_s: float | None, metadata: "tuple[tuple[bytes, bytes], ...]" = (),
                      media: Any = None) -> PrefillAnswer:
        """The prefill leg of a disaggregated request: unstreamed, its answer read to its end and dropped but for
        what the decode needs."""
        request, encoding = self._generate_request(request_id, input_ids, sampling, False, handover, media,
                                                   epd=True)
        if encoding is not None:
            await encoding()
        async with self.bridge.open_stream(self.target, self.runtime.method("Generate"), request,
                                           self.runtime.pb.GenerateResponse, timeout_s,
                                           last_message=self.runtime.is_last, metadata=metadata) as messages:
            async for batch in messages:
                for message in batch:
                    answer = self.runtime.prefill_answer(message)
                    if answer is not None:
                        return answer
        raise EngineCallError("UNAVAILABLE", "the prefill engine closed the stream without finishing")

    def _generate_request(self, request_id: str, input_ids: "list[int]", sampling: SamplingOptions, stream: bool,
                          handover: Handover | None, media: Any, epd: bool
                          ) -> "tuple[Any, Callable[[], Awaitable[None]] | None]":
        """The kind's Generate request, and what must be awaited before it goes: the Encode calls of its images, when
        encode workers take them (``epd``: this leg computes the prompt; encode_workers.py)."""
        runtime, encoders = self.runtime, self.encoders
        if not (epd and media is not None and encoders is not None and runtime.encode_workers):
            return runtime.generate_request(request_id, input_ids, sampling, stream, handover, media,
                                            self.media_facts.raw_pixels), None
        images = media[0]
        assignments = encoders.assign(len(images.images))
        request = runtime.generate_request(request_id, input_ids, sampling, stream, handover, media,
                                           self.media_facts.raw_pixels, encode=assignments)
        calls = [(assignment, runtime.encode_request(request_id, images, index, assignment.room))
                 for index, assignment in enumerate(assignments)]
        return request, lambda: encoders.encode(calls)

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

    __slots__ = ("_opened", "_messages", "_stream", "_full", "_logprobs", "_all_indexes", "_read", "_read_full",
                 "_before")

    def __init__(self, runtime: EngineRuntime, opened: Any, stream: bool, logprobs: bool = False,
                 all_indexes: bool = False, before: "Callable[[], Awaitable[None]] | None" = None) -> None:
        self._read, self._read_full = runtime.events, runtime.events_full  # the engine kind's answer readers
        self._opened = opened  # the bridge's server stream (an async context manager)
        self._messages: Any = None
        self._stream = stream
        self._full = logprobs or all_indexes  # events through _events_full rather than the plain _events
        self._logprobs = logprobs
        self._all_indexes = all_indexes
        self._before = before  # awaited before the call opens: its images' Encode calls (encode_workers.py)

    async def __aenter__(self) -> "Generation":
        if self._before is not None:
            await self._before()
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
            return self._read(batch, self._stream)
        return self._read_full(batch, self._stream, self._logprobs, self._all_indexes)

"""gRPC servicers of the simulated engine: SGLang scheduler and vLLM engine (TensorRT-LLM's, MLX's and TokenSpeed's
in their own modules), and what they share.

The services of ``smg-grpc-proto`` are served on one port, each a thin
translation onto ``SimEngine``. They follow the real servicers' wire habits:
a streaming Generate sends one chunk per step and then a ``complete`` whose
``output_ids`` hold only the last delta (the client accumulates chunks); a
non-streaming Generate sends one ``complete`` with every output id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import io
import json
import logging
import time
import uuid
import zipfile
from pathlib import Path
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.struct_pb2 import Struct
from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2 as sg,
    sglang_scheduler_pb2_grpc as sg_grpc,
    vllm_engine_pb2 as vl,
    vllm_engine_pb2_grpc as vl_grpc,
)

from .adapters import SimAdapters, adapter_seed
from .core import EngineOverloaded, GenerateParams, InvalidRequest, SimEngine
from .disaggregation import Disaggregation
from . import vision, vision_gemma3, vision_idefics3, vision_internvl, vision_llama4, vision_pixtral, vision_qwen3
from .embedding import embedding_of, model_config
from .logprobs import prompt_logprobs, token_logprobs
from .output import derive_seed

log = logging.getLogger("chaos.sim_engine")

TOKENIZER_CHUNK_BYTES = 64 * 1024  # as the real servicers chunk the bundle
# Files of a tokenizer directory that go into the GetTokenizer bundle.
BUNDLE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "generation_config.json", "config.json", "chat_template.json", "chat_template.jinja",
                "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
KV_SUBSCRIBER_QUEUE_MAX = 10_000  # batches; a subscriber further behind is cut off and must resume


@dataclasses.dataclass(frozen=True)
class VisionFamily:
    module: Any  # bundle_files(tokenizer_json), check_vllm(tokens, mm, ids, config), check_sglang(tokens, mm, ids)
    tokens: Callable[[bytes], Any]  # the family's tokenizer (its tokens added) and the ids its checks need
    architecture: str  # what GetModelInfo says the model is


# The families beside the Qwen2-VL-style default (vision.py), by --vision-family.
VISION_FAMILIES = {
    "gemma3": VisionFamily(vision_gemma3, vision_gemma3.Gemma3Tokens, "Gemma3ForConditionalGeneration"),
    "pixtral": VisionFamily(vision_pixtral, vision_pixtral.PixtralTokens, "Mistral3ForConditionalGeneration"),
    "llama4": VisionFamily(vision_llama4, vision_llama4.Llama4Tokens, "Llama4ForConditionalGeneration"),
    "internvl": VisionFamily(vision_internvl, vision_internvl.InternVLTokens, "InternVLForConditionalGeneration"),
    "idefics3": VisionFamily(vision_idefics3, vision_idefics3.Idefics3Tokens, "Idefics3ForConditionalGeneration"),
    "qwen3_vl": VisionFamily(vision_qwen3, vision_qwen3.Qwen3Tokens, "Qwen3VLForConditionalGeneration"),
}


def build_tokenizer_bundle(tokenizer_dir: Path, extra: "dict[str, bytes] | None" = None) -> tuple[bytes, str]:
    """The bundle as the real servicers build it: a flat zip and its sha256 hex (``extra`` files replace the
    directory's: an embedding model's config.json)."""
    extra = extra or {}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in BUNDLE_FILES:
            path = tokenizer_dir / name
            if name in extra:
                zf.writestr(name, extra[name])
            elif path.is_file():
                zf.write(path, name)
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


class SharedEngineState:
    """What both services answer from: the engine, its model facts, its bundle."""

    def __init__(self, engine: SimEngine, tokenizer_dir: Path, vocab_size: int,
                 pd: "Disaggregation | None" = None) -> None:
        self.engine = engine
        self.pd = pd if pd is not None else Disaggregation(engine.config, "127.0.0.1")  # its role's extra steps
        self.tokenizer_dir = tokenizer_dir
        self.vocab_size = vocab_size
        self._bundle: tuple[bytes, str] | None = None
        self.embedded = 0  # Embed calls answered (tests count them)
        self.images_seen = 0
        self.adapters = SimAdapters(engine.config.lora_slots)  # SGLang's service loads LoRA adapters

    def bundle(self) -> tuple[bytes, str]:
        if self._bundle is None:
            config = self.engine.config
            extra: dict[str, bytes] = {}
            if config.task == "embed":
                extra["config.json"] = json.dumps(model_config(config.embedding_dim, config.matryoshka_dimensions)
                                                  ).encode()
            if config.vision and config.vision_family in VISION_FAMILIES:
                family = VISION_FAMILIES[config.vision_family]
                extra.update(family.module.bundle_files(self.family_tokens.tokenizer_json))
            elif config.vision:
                extra["preprocessor_config.json"] = json.dumps(vision.PREPROCESSOR_CONFIG).encode()
                extra["chat_template.jinja"] = vision.CHAT_TEMPLATE.encode()
                extra["config.json"] = json.dumps(vision.MODEL_CONFIG).encode()
            self._bundle = build_tokenizer_bundle(self.tokenizer_dir, extra)
        return self._bundle

    @property
    def embeds(self) -> bool:
        return self.engine.config.task == "embed"

    @functools.cached_property
    def family_tokens(self) -> Any:
        """The vision family's tokenizer and the ids its checks need (VISION_FAMILIES)."""
        return VISION_FAMILIES[self.engine.config.vision_family].tokens(
            (self.tokenizer_dir / "tokenizer.json").read_bytes())

    def image_check(self, service: str) -> "Callable[[Any, list[int]], Any]":
        """How the ``service`` ("vllm", "sglang", "tokenspeed") checks a request's images for this model's family."""
        config = self.engine.config
        family = VISION_FAMILIES.get(config.vision_family)
        if family is not None and service == "vllm":  # videos: a family that checks them (Qwen3-VL's)
            videos = getattr(family.module, "check_vllm_video", None)
            return lambda request, ids: vision.check_vllm_batches(
                request, ids, lambda mm, ids: family.module.check_vllm(self.family_tokens, mm, ids, config),
                None if videos is None else lambda mm, ids: videos(self.family_tokens, mm, ids, config))
        if family is not None and service == "sglang":
            return lambda mm, ids: family.module.check_sglang(self.family_tokens, mm, ids)
        if service == "vllm":  # a request of vLLM's: its image and video batches
            return lambda request, ids: vision.check_vllm_batches(
                request, ids, lambda mm, ids: vision.check_vllm(mm, ids, config),
                lambda mm, ids: vision.check_vllm_video(mm, ids, config))
        return vision.check_sglang if service == "sglang" else vision.check_tokenspeed

    @property
    def architecture(self) -> str:
        if self.engine.config.vision and self.engine.config.vision_family in VISION_FAMILIES:
            return VISION_FAMILIES[self.engine.config.vision_family].architecture
        if self.engine.config.vision:
            return "Qwen2VLForConditionalGeneration"
        return "Qwen3Model" if self.embeds else "Qwen3ForCausalLM"

    async def with_images(self, params: GenerateParams, mm: Any, has_images: bool,
                          check: "Callable[[Any, list[int]], Any]", context: grpc.aio.ServicerContext
                          ) -> GenerateParams:
        """``params`` with the request's images checked by the service's own ``check`` and folded in; refused as a
        real engine would."""
        if not has_images:
            return params
        if not self.engine.config.vision:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "this model takes no images")
        try:
            checked = check(mm, params.prompt_ids)
        except vision.ImagesRefused as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"images: {e}")
        self.images_seen += checked.items or (len(mm.items) if hasattr(mm, "items") else len(mm.mm_placeholders))
        return dataclasses.replace(params, media_digest=checked.digest, cache_ids=checked.cache_ids)

    async def embedding(self, request_id: str, input_ids: "list[int]", context: grpc.aio.ServicerContext
                        ) -> list[float]:
        """What Embed answers: refused on a generation model, as a real engine refuses it; the prefill's time."""
        config = self.engine.config
        if not self.embeds:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{config.model_name} is a generation model: it "
                                "does not embed")
        # A pooling prompt may fill the context: no room is kept for an output token (vLLM embeds it).
        if not input_ids or len(input_ids) > config.max_context_tokens:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{len(input_ids)} input tokens: the model takes "
                                f"1 to {config.max_context_tokens}")
        if config.prefill_s_per_token:
            await asyncio.sleep(config.prefill_s_per_token * len(input_ids))
        self.embedded += 1
        return embedding_of(input_ids, config.embedding_dim)

    async def refuse_generation(self, context: grpc.aio.ServicerContext) -> None:
        if self.embeds:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.engine.config.model_name} is an embedding "
                                "model: it does not generate")

    async def run(self, params: GenerateParams, context: grpc.aio.ServicerContext):
        """Steps of a generation, with engine errors mapped to gRPC status codes."""
        try:
            async for step in self.engine.generate(params):
                yield step
        except EngineOverloaded as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def steps_with_output(self, params: GenerateParams, stream: bool, context):
        """(step, output ids for a complete message) pairs, in the real servicers' shape.

        Streaming: every step with tokens becomes a chunk (finish_reason None);
        the final step also yields a complete carrying only its own delta, which
        was already sent as a chunk, as vLLM's servicer does in DELTA mode.
        Non-streaming: only the final complete, with every output id.
        """
        produced: list[int] = []
        async for step in self.run(params, context):
            produced.extend(step.token_ids)
            if stream and step.token_ids:
                yield dataclasses.replace(step, finish_reason=None), step.token_ids
            if step.finish_reason is not None:
                yield step, (step.token_ids if stream else produced)

    async def indexed_steps(self, params: GenerateParams, n: int, stream: bool, context):
        """(answer index, step, output ids) of n answers (the engine's n), interleaved as they come: each
        answer a generation of its own seeded by the request's seed (or prompt) plus its index."""
        if n <= 1:
            async for step, output_ids in self.steps_with_output(params, stream, context):
                yield 0, step, output_ids
            return
        queue: asyncio.Queue = asyncio.Queue()
        base_seed = derive_seed(params.prompt_ids, params.seed)

        async def run(index: int) -> None:
            own = dataclasses.replace(params, request_id=f"{params.request_id}/{index}", seed=base_seed + index)
            try:
                async for step, output_ids in self.steps_with_output(own, stream, context):
                    await queue.put((index, step, output_ids))
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
                await queue.put(e)
                return
            await queue.put(None)

        tasks = [asyncio.create_task(run(i)) for i in range(n)]
        try:
            running = n
            while running:
                item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()

    async def answers(self, params: GenerateParams, n: int, stream: bool, context, pb: Any,
                      response: "Callable[..., Any]", matched_field: str = "matched_token_id"):
        """The Generate answers to ``params`` as ``pb``'s messages (SGLang's, vLLM's, MLX's and TokenSpeed's chunks
        and completes have the same fields but for the matched stop token's name), each wrapped by
        ``response(chunk=...)`` or ``response(complete=...)``: the service's own answer."""
        first = True
        async for index, step, output_ids in self.indexed_steps(params, n, stream, context):
            seeded = answer_params(params, index, n)
            if step.finish_reason is None:
                chunk = pb.GenerateStreamChunk(
                    token_ids=step.token_ids, prompt_tokens=step.prompt_tokens,
                    completion_tokens=step.completion_tokens, cached_tokens=step.cached_tokens, index=index)
                self.fill_logprobs(chunk, pb, seeded, step.token_ids, step.completion_tokens, first)
                first = False
                yield response(chunk=chunk)
                continue
            complete = pb.GenerateComplete(
                output_ids=output_ids, finish_reason=step.finish_reason, prompt_tokens=step.prompt_tokens,
                completion_tokens=step.completion_tokens, cached_tokens=step.cached_tokens, index=index)
            if step.matched_token_id is not None:
                setattr(complete, matched_field, step.matched_token_id)
            self.fill_logprobs(complete, pb, seeded, output_ids, step.completion_tokens, first)
            first = False
            yield response(complete=complete)

    async def room_answers(self, request: Any, field: str, params: GenerateParams, n: int, context, pb: Any):
        """The answers of an SGLang-style service (SGLang's, TokenSpeed's), whose prefill/decode legs meet in the room
        the request's ``field`` names: a prefill's one complete once its decode took the KV, a decode's tokens once it
        fetched it, a regular engine's as ``answers``."""
        pd = self.pd
        response = functools.partial(pb.GenerateResponse, request_id=request.request_id)
        handover = await pd.room_key(request, field, context)
        if handover is not None and pd.role == "prefill":
            step = await pd.prefill(self, params, handover[0], context)
            await pd.wait_decode(params, handover[0], context)
            yield response(complete=pb.GenerateComplete(
                output_ids=step.token_ids, finish_reason="length", prompt_tokens=step.prompt_tokens,
                completion_tokens=step.completion_tokens, cached_tokens=step.cached_tokens))
            return
        if handover is not None:
            params = await pd.receive(self, params, handover[1], handover[2], handover[0], context)
        async for answer in self.answers(params, max(1, n), request.stream, context, pb, response):
            yield answer

    def fill_logprobs(self, message, pb, params: GenerateParams, token_ids: "list[int]", produced: int,
                      first: bool) -> None:
        """The logprobs of ``token_ids`` (the last of ``produced`` output tokens) into a chunk or complete
        message, and the prompt's into the first message when asked."""
        if params.logprobs is None:
            return
        seed, k, words = derive_seed(params.prompt_ids, params.seed), params.logprobs, self.engine.words
        out = message.output_logprobs
        for token_id, logprob, alternatives in token_logprobs(list(token_ids), produced - len(token_ids), seed, k,
                                                              words):
            out.token_ids.append(token_id)
            out.token_logprobs.append(logprob)
            out.top_logprobs.append(pb.TopLogProbs(token_ids=[a for a, _ in alternatives],
                                                   values=[v for _, v in alternatives]))
        if first and params.prompt_logprobs:
            into = message.input_logprobs
            for token_id, logprob, alternatives in prompt_logprobs(params.prompt_ids, seed, k, words):
                into.token_ids.append(token_id)
                into.token_logprobs.append(pb.InputTokenLogProb() if logprob is None else
                                           pb.InputTokenLogProb(value=logprob))
                into.top_logprobs.append(pb.TopLogProbs(token_ids=[a for a, _ in alternatives],
                                                        values=[v for _, v in alternatives]))

    async def tokenizer_chunks(self):
        data, digest = await asyncio.to_thread(self.bundle)
        for offset in range(0, len(data), TOKENIZER_CHUNK_BYTES):
            end = min(offset + TOKENIZER_CHUNK_BYTES, len(data))
            yield common_pb2.GetTokenizerChunk(data=data[offset:end], sha256=digest if end == len(data) else "")

    async def kv_events(self, request: common_pb2.SubscribeKvEventsRequest, context):
        cache = self.engine.cache
        queue: asyncio.Queue = asyncio.Queue(maxsize=KV_SUBSCRIBER_QUEUE_MAX)
        overflowed = asyncio.Event()

        def on_batch(batch: common_pb2.KvEventBatch) -> None:
            try:
                queue.put_nowait(batch)
            except asyncio.QueueFull:
                overflowed.set()

        # Register before reading the backlog so no batch falls between the two.
        cache.add_listener(on_batch)
        try:
            start = request.start_sequence_number
            backlog = cache.batches_since(start) if start > 0 else None
            if backlog is None:
                last = cache.sequence_number
                yield cache.snapshot_batch(time.time())
            else:
                last = start - 1
                for batch in backlog:
                    last = batch.sequence_number
                    yield batch
            while True:
                batch = await queue.get()
                if overflowed.is_set():
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "subscriber too slow; resume from a sequence number")
                if batch.sequence_number <= last:
                    continue  # already sent from the backlog
                last = batch.sequence_number
                yield batch
        finally:
            cache.remove_listener(on_batch)

    def loads_answer(self, pb: Any) -> Any:
        """GetLoads in ``pb``'s messages (SGLang's, vLLM's and TokenSpeed's are alike): one data-parallel rank."""
        return pb.GetLoadsResponse(timestamp=str(time.time()), version="sim", dp_rank_count=1,
                                   loads=[pb.SchedulerLoad(dp_rank=0, **self.load_numbers())])

    def load_numbers(self) -> dict:
        e = self.engine
        cfg = e.config
        return dict(
            num_running_reqs=e.running, num_waiting_reqs=e.waiting, num_total_reqs=e.running + e.waiting,
            num_used_tokens=e.cache.used_blocks * cfg.block_size,
            max_total_num_tokens=cfg.kv_capacity_blocks * cfg.block_size,
            token_usage=e.cache.used_blocks / cfg.kv_capacity_blocks,
            gen_throughput=e.gen_throughput(), cache_hit_rate=e.cache.hit_rate(),
            utilization=e.running / cfg.batch_size_max, max_running_requests=cfg.batch_size_max,
        )


def answer_params(params: GenerateParams, index: int, n: int) -> GenerateParams:
    """The parameters answer ``index`` of n was generated with (its seed: the request's plus its index)."""
    if n <= 1:
        return params
    return dataclasses.replace(params, seed=derive_seed(params.prompt_ids, params.seed) + index)


def sglang_constraint(sp: sg.SamplingParams) -> "tuple[str, object] | None":
    kind = sp.WhichOneof("constraint")
    if kind is None:
        return None
    return {"ebnf_grammar": "grammar"}.get(kind, kind), getattr(sp, kind)


def _vllm_constraint(sp: vl.SamplingParams) -> "tuple[str, object] | None":
    kind = sp.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "choice":
        return "choice", tuple(sp.choice.choices)
    return kind, getattr(sp, kind)


class CommonRpcs:
    """RPCs both services answer identically (their messages come from common.proto)."""

    s: SharedEngineState

    def __init__(self, shared: SharedEngineState) -> None:
        self.s = shared

    async def GetTokenizer(self, request, context):
        async for chunk in self.s.tokenizer_chunks():
            yield chunk

    async def SubscribeKvEvents(self, request, context):
        async for batch in self.s.kv_events(request, context):
            yield batch


class SglangService(CommonRpcs, sg_grpc.SglangSchedulerServicer):

    async def Embed(self, request: sg.EmbedRequest, context):
        log_trace(request.request_id, context)
        ids = list(request.tokenized.input_ids)
        vector = await self.s.embedding(request.request_id, ids, context)
        return sg.EmbedResponse(embedding=vector, embedding_dim=len(vector), prompt_tokens=len(ids))

    async def Generate(self, request: sg.GenerateRequest, context):
        log_trace(request.request_id, context)
        await self.s.refuse_generation(context)
        sp = request.sampling_params
        params = GenerateParams(
            request_id=request.request_id,
            prompt_ids=list(request.tokenized.input_ids),
            max_tokens=sp.max_new_tokens if sp.HasField("max_new_tokens") else None,
            stop_token_ids=frozenset(sp.stop_token_ids),
            ignore_eos=sp.ignore_eos,
            seed=None,  # SGLang's SamplingParams carries no seed field
            constraint=sglang_constraint(sp),
            logprobs=request.top_logprobs_num if request.return_logprob else None,
            prompt_logprobs=request.return_logprob and request.logprob_start_len >= 0,
        )
        params = await self.s.with_images(params, request.mm_inputs, request.HasField("mm_inputs"),
                                          self.s.image_check("sglang"), context)
        if request.lora_id:
            if request.lora_id not in self.s.adapters.loaded:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"LoRA adapter {request.lora_id} is not loaded")
            params = dataclasses.replace(params, seed=adapter_seed(request.lora_id, params.prompt_ids, params.seed))
        async for answer in self.s.room_answers(request, "disaggregated_params", params, sp.n, context, sg):
            yield answer

    async def HealthCheck(self, request, context):
        return sg.HealthCheckResponse(healthy=True, message="ok")

    async def LoadLoRAAdapter(self, request: sg.LoadLoRAAdapterRequest, context):
        problem = self.s.adapters.load(request.lora_name, request.lora_path, request.pinned, request.lora_id)
        return sg.LoadLoRAAdapterResponse(success=problem is None, message=problem or "",
                                          loaded_lora_ids=sorted(self.s.adapters.loaded))

    async def UnloadLoRAAdapter(self, request: sg.UnloadLoRAAdapterRequest, context):
        problem = self.s.adapters.unload(request.lora_name, request.lora_id)
        return sg.UnloadLoRAAdapterResponse(success=problem is None, message=problem or "",
                                            loaded_lora_ids=sorted(self.s.adapters.loaded))

    async def ListLoadedLoRAAdapters(self, request, context):
        return sg.ListLoadedLoRAAdaptersResponse(loaded_adapters=[
            sg.LoadedLoRAAdapter(lora_id=i, lora_name=name, lora_path=path, pinned=pinned)
            for i, (name, path, pinned) in sorted(self.s.adapters.loaded.items())])

    async def Abort(self, request: sg.AbortRequest, context):
        self.s.engine.abort([request.request_id])
        self.s.pd.abort([request.request_id])
        return sg.AbortResponse(success=True)

    async def GetModelInfo(self, request, context):
        e = self.s.engine
        return sg.GetModelInfoResponse(
            model_path=e.config.model_name, tokenizer_path=str(self.s.tokenizer_dir), is_generation=not self.s.embeds,
            served_model_name=e.config.model_name, max_context_length=e.config.max_context_tokens,
            vocab_size=self.s.vocab_size, model_type="qwen3", eos_token_ids=[e.eos_token_id],
            max_req_input_len=e.config.max_context_tokens - 1, architectures=[self.s.architecture],
            supports_vision=e.config.vision)

    async def GetServerInfo(self, request, context):
        e = self.s.engine
        return sg.GetServerInfoResponse(
            active_requests=e.active_requests, is_paused=False, last_receive_timestamp=e.last_receive_timestamp,
            uptime_seconds=time.time() - e.started_at, sglang_version="sim", server_type="grpc",
            max_total_num_tokens=e.config.kv_capacity_blocks * e.config.block_size,
            server_args=sglang_server_args(self.s.pd))

    async def GetLoads(self, request, context):
        return self.s.loads_answer(sg)


class VllmService(CommonRpcs, vl_grpc.VllmEngineServicer):

    async def Embed(self, request: vl.EmbedRequest, context):
        log_trace(request.request_id, context)
        if not request.HasField("tokenized"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "EmbedRequest requires tokenized input")
        ids = list(request.tokenized.input_ids)
        vector = await self.s.embedding(request.request_id, ids, context)
        return vl.EmbedResponse(embedding=vector, embedding_dim=len(vector), prompt_tokens=len(ids))

    async def Generate(self, request: vl.GenerateRequest, context):
        log_trace(request.request_id, context)
        await self.s.refuse_generation(context)
        sp = request.sampling_params
        if request.WhichOneof("input") != "tokenized":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the simulated engine takes tokenized input only")
        params = GenerateParams(
            request_id=request.request_id,
            prompt_ids=list(request.tokenized.input_ids),
            max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
            stop_token_ids=frozenset(sp.stop_token_ids),
            ignore_eos=sp.ignore_eos,
            seed=sp.seed if sp.HasField("seed") else None,
            constraint=_vllm_constraint(sp),
            logprobs=sp.logprobs if sp.HasField("logprobs") else None,
            prompt_logprobs=sp.HasField("prompt_logprobs"),
        )
        params = await self.s.with_images(params, request, request.HasField("mm_inputs"),
                                          self.s.image_check("vllm"), context)  # (every batch: vision.py)
        pd = self.s.pd
        transfer = await pd.vllm_params(request, context)
        if transfer is not None and pd.role == "prefill":
            key = f"xfer-{uuid.uuid4().hex}"
            step = await pd.prefill(self.s, params, key, context)
            yield vl.GenerateResponse(complete=vl.GenerateComplete(
                output_ids=step.token_ids, finish_reason="length", prompt_tokens=step.prompt_tokens,
                completion_tokens=step.completion_tokens, cached_tokens=step.cached_tokens,
                kv_transfer_params_json=pd.keep_for_decode(params, key)))
            return
        if transfer is not None:
            params = await pd.receive(self.s, params, transfer["remote_host"], transfer["remote_port"],
                                      transfer["remote_request_id"], context)
        async for answer in self.s.answers(params, sp.n, request.stream, context, vl, vl.GenerateResponse):
            yield answer

    async def HealthCheck(self, request, context):
        return vl.HealthCheckResponse(healthy=True, message="ok")

    async def Abort(self, request: vl.AbortRequest, context):
        self.s.engine.abort(list(request.request_ids))
        self.s.pd.abort(list(request.request_ids))
        return vl.AbortResponse()

    async def GetModelInfo(self, request, context):
        e = self.s.engine
        return vl.GetModelInfoResponse(
            model_path=e.config.model_name, is_generation=not self.s.embeds,
            max_context_length=e.config.max_context_tokens, vocab_size=self.s.vocab_size,
            served_model_name=e.config.model_name, tokenizer_path=str(self.s.tokenizer_dir), model_type="qwen3",
            architectures=[self.s.architecture], supports_vision=e.config.vision,
            eos_token_ids=[e.eos_token_id], max_req_input_len=e.config.max_context_tokens - 1)

    async def GetServerInfo(self, request, context):
        e = self.s.engine
        return vl.GetServerInfoResponse(
            active_requests=e.active_requests, is_paused=False, last_receive_timestamp=e.last_receive_timestamp,
            uptime_seconds=time.time() - e.started_at, server_type="vllm-grpc", data_parallel_size=1,
            block_size=e.config.block_size, max_num_seqs=e.config.batch_size_max, kv_cache_dtype="auto",
            model_dtype="torch.bfloat16", pairing_protocol=self.s.pd.pairing_protocol,
            **_vllm_kv_transfer(self.s.pd), **vision.server_info(e.config))

    async def GetLoads(self, request, context):
        return self.s.loads_answer(vl)


def sglang_server_args(pd: Disaggregation) -> Struct:
    """The server arguments SGLang reports that pairing reads: its disaggregation mode and bootstrap port, and the
    operator's pairing protocol (SMG_PAIRING_PROTOCOL)."""
    args = Struct()
    args.update({"disaggregation_mode": "null" if pd.role == "regular" else pd.role,
                 "disaggregation_bootstrap_port": pd.bootstrap_port, "pairing_protocol": pd.pairing_protocol})
    return args


def _vllm_kv_transfer(pd: Disaggregation) -> dict:
    """vLLM's kv_transfer_config as GetServerInfo reports it: a NIXL-like connector on prefill and decode engines."""
    if pd.role == "regular":
        return {}
    return {"kv_connector": "NixlConnector", "kv_role": "kv_producer" if pd.role == "prefill" else "kv_consumer",
            "kv_engine_id": pd.engine_id}


def log_trace(request_id: str, context) -> None:
    """A gateway that traces sends the attempt's W3C traceparent in the call's metadata: logged, as a real
    engine's servicer would open its own span under it."""
    metadata = dict(context.invocation_metadata() or ())
    if "traceparent" in metadata:
        log.info("request %s in trace %s%s", request_id, metadata["traceparent"][:64],
                 f" state {metadata['tracestate'][:128]}" if "tracestate" in metadata else "")

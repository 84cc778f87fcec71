"""The simulated engine as TensorRT-LLM's service (``trtllm.TrtllmService``): the same engine, its wire habits.

What it holds the gateway to, as the real servicer would: the model's end-of-sequence ids arrive as stop token ids
(its gRPC path does not add them: a request without them runs to its max tokens), beam width 1, a logit bias as a
dense vector the size of the vocabulary, guides of its types, an answer's index as ``sequence_index``, log
probabilities as one message per token; images (``--vision``, the Qwen2-VL family) as each one's encoded bytes, which
it decodes and counts itself against the prompt's expanded image tokens (vision.check_trtllm). No GetLoads, no
prefill/decode legs: a gateway that asks is answered UNIMPLEMENTED or INVALID_ARGUMENT.
"""

from __future__ import annotations

import grpc
from smg_grpc_proto.generated import trtllm_service_pb2 as tr
from smg_grpc_proto.generated import trtllm_service_pb2_grpc as tr_grpc

from .core import GenerateParams
from .logprobs import prompt_logprobs, token_logprobs
from .output import derive_seed
from . import vision
from .services import CommonRpcs, answer_params, log_trace

GUIDE = tr.GuidedDecodingParams
GUIDE_KINDS = {GUIDE.GUIDE_TYPE_JSON: "json_object", GUIDE.GUIDE_TYPE_JSON_SCHEMA: "json_schema",
               GUIDE.GUIDE_TYPE_REGEX: "regex", GUIDE.GUIDE_TYPE_EBNF_GRAMMAR: "grammar",
               GUIDE.GUIDE_TYPE_STRUCTURAL_TAG: "structural_tag"}


class TrtllmService(CommonRpcs, tr_grpc.TrtllmServiceServicer):

    async def Generate(self, request: tr.GenerateRequest, context):
        log_trace(request.request_id, context)
        await self.s.refuse_generation(context)
        sc, oc = request.sampling_config, request.output_config
        if sc.beam_width > 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "beam search is not simulated")
        if request.HasField("disaggregated_params"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the simulated TensorRT-LLM engine takes no "
                                "disaggregated requests")
        if request.HasField("multimodal_input") and self.s.engine.config.vision_family != "qwen2_vl":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the simulated TensorRT-LLM engine takes Qwen2-VL's "
                                "images only")
        if request.embedding_bias and len(request.embedding_bias) != self.s.vocab_size:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"embedding_bias has {len(request.embedding_bias)} "
                                f"values; the vocabulary has {self.s.vocab_size}")
        stop_ids = frozenset(request.stop_token_ids)
        constraint = None
        if request.HasField("guided_decoding"):
            g = request.guided_decoding
            if g.guide_type not in GUIDE_KINDS:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "guided decoding without a guide type")
            constraint = (GUIDE_KINDS[g.guide_type], g.guide)
        params = GenerateParams(
            request_id=request.request_id,
            prompt_ids=list(request.tokenized.input_token_ids),
            max_tokens=request.max_tokens or None,
            stop_token_ids=stop_ids,
            # Its gRPC path stops at the model's end only when told: no EOS among the stop ids, no stop there.
            ignore_eos=request.ignore_eos or self.s.engine.eos_token_id not in stop_ids,
            seed=sc.seed if sc.HasField("seed") else None,
            constraint=constraint,
            logprobs=oc.logprobs if oc.HasField("logprobs") else None,
            prompt_logprobs=oc.HasField("prompt_logprobs"),
        )
        images = request.multimodal_input
        params = await self.s.with_images(params, images, len(images.image_data) > 0, vision.check_trtllm, context)
        n = max(1, sc.num_return_sequences)
        first = True
        async for index, step, output_ids in self.s.indexed_steps(params, n, request.streaming, context):
            seeded = answer_params(params, index, n)
            if step.finish_reason is None:
                chunk = tr.GenerateStreamChunk(
                    token_ids=step.token_ids, sequence_index=index, prompt_tokens=step.prompt_tokens,
                    completion_tokens=step.completion_tokens, cached_tokens=step.cached_tokens)
                self._logprobs(chunk.logprobs, seeded, step.token_ids, step.completion_tokens)
                yield tr.GenerateResponse(request_id=request.request_id, chunk=chunk)
                continue
            complete = tr.GenerateComplete(
                output_token_ids=output_ids, sequence_index=index, finish_reason=step.finish_reason,
                prompt_tokens=step.prompt_tokens, completion_tokens=step.completion_tokens,
                cached_tokens=step.cached_tokens)
            if step.matched_token_id is not None:
                complete.matched_token_id = step.matched_token_id
            self._logprobs(complete.logprobs, seeded, output_ids, step.completion_tokens)
            if first and params.prompt_logprobs and params.logprobs is not None:
                seed = derive_seed(params.prompt_ids, params.seed)
                for token_id, logprob, alternatives in prompt_logprobs(params.prompt_ids, seed, params.logprobs,
                                                                       self.s.engine.words):
                    complete.prompt_logprobs.add(token_id=token_id, logprob=logprob or 0.0, top_logprobs=[
                        tr.TopLogprob(token_id=a, logprob=v) for a, v in alternatives])
            first = False
            yield tr.GenerateResponse(request_id=request.request_id, complete=complete)

    def _logprobs(self, into, params: GenerateParams, token_ids: "list[int]", produced: int) -> None:
        if params.logprobs is None:
            return
        seed = derive_seed(params.prompt_ids, params.seed)
        for token_id, logprob, alternatives in token_logprobs(list(token_ids), produced - len(token_ids), seed,
                                                              params.logprobs, self.s.engine.words):
            into.add(token_id=token_id, logprob=logprob,
                     top_logprobs=[tr.TopLogprob(token_id=a, logprob=v) for a, v in alternatives])

    async def Embed(self, request: tr.EmbedRequest, context):
        log_trace(request.request_id, context)
        ids = list(request.tokenized.input_token_ids)
        vector = await self.s.embedding(request.request_id, ids, context)
        return tr.EmbedResponse(request_id=request.request_id, embedding=vector, prompt_tokens=len(ids))

    async def HealthCheck(self, request, context):
        return tr.HealthCheckResponse(status="OK")

    async def Abort(self, request: tr.AbortRequest, context):
        self.s.engine.abort([request.request_id])
        return tr.AbortResponse(success=True)

    async def GetModelInfo(self, request, context):
        config = self.s.engine.config
        features = ["guided_decoding"] + (["embedding"] if self.s.embeds else [])
        return tr.GetModelInfoResponse(
            model_id=config.model_name, max_input_len=config.max_context_tokens - 1,
            max_seq_len=config.max_context_tokens, max_batch_size=config.batch_size_max,
            vocab_size=self.s.vocab_size, supported_features=features)

    async def GetServerInfo(self, request, context):
        return tr.GetServerInfoResponse(version="sim", backend="pytorch", tensor_parallel_size=1,
                                        pipeline_parallel_size=1, context_parallel_size=1, world_size=1)

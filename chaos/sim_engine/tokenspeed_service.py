"""The simulated engine as TokenSpeed's scheduler (``tokenspeed.grpc.scheduler.TokenSpeedScheduler``): the same
engine, its wire habits.

SGLang's shape with optional sampling scalars, the seed as ``sampling_seed``, prefill/decode legs meeting by
``kv_bootstrap_info`` (host, port, room) as SGLang's do by ``disaggregated_params``. Its proto has no Embed and its
answers no prompt log probabilities: asked for them (``logprob_start_len`` set), it refuses. Images come as items, one
an image (vision.check_tokenspeed holds them to the prompt), or without their pixels, their embeddings from encode
workers (EPD: encode_stage.py).
"""

from __future__ import annotations

import dataclasses
import time

import grpc
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2_grpc as ts_grpc

from .core import GenerateParams
from .encode_stage import receive_encoded
from .services import CommonRpcs, log_trace, sglang_constraint, sglang_server_args


class TokenSpeedService(CommonRpcs, ts_grpc.TokenSpeedSchedulerServicer):

    async def Generate(self, request: ts.GenerateRequest, context):
        log_trace(request.request_id, context)
        await self.s.refuse_generation(context)
        if request.HasField("logprob_start_len"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the simulated TokenSpeed engine reports no input "
                                "logprobs (its answers have no field for them)")
        sp = request.sampling_params
        params = GenerateParams(
            request_id=request.request_id,
            prompt_ids=list(request.tokenized.input_ids),
            max_tokens=sp.max_new_tokens if sp.HasField("max_new_tokens") else None,
            stop_token_ids=frozenset(sp.stop_token_ids),
            ignore_eos=sp.ignore_eos,
            seed=sp.sampling_seed if sp.HasField("sampling_seed") else None,
            constraint=sglang_constraint(sp),  # its constraint fields are SGLang's
            logprobs=request.top_logprobs_num if request.return_logprob else None,
        )
        if request.HasField("encode_bootstrap_info"):  # EPD: its images' embeddings come from encode workers
            if not self.s.engine.config.vision:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "this model takes no images")
            checked = await receive_encoded(self.s, request, params.prompt_ids, context)
            self.s.images_seen += checked.items
            params = dataclasses.replace(params, media_digest=checked.digest, cache_ids=checked.cache_ids)
        else:
            params = await self.s.with_images(params, request.mm_inputs, len(request.mm_inputs.items) > 0,
                                              self.s.image_check("tokenspeed"), context)
        async for answer in self.s.room_answers(request, "kv_bootstrap_info", params, sp.n, context, ts):
            yield answer

    async def HealthCheck(self, request, context):
        return ts.HealthCheckResponse(healthy=True, message="ok")

    async def Abort(self, request: ts.AbortRequest, context):
        self.s.engine.abort([request.request_id])
        self.s.pd.abort([request.request_id])
        return ts.AbortResponse(success=True)

    async def GetModelInfo(self, request, context):
        e = self.s.engine
        return ts.GetModelInfoResponse(
            model_path=e.config.model_name, tokenizer_path=str(self.s.tokenizer_dir),
            served_model_name=e.config.model_name, model_type="qwen3", architectures=[self.s.architecture],
            max_context_length=e.config.max_context_tokens, max_req_input_len=e.config.max_context_tokens - 1,
            vocab_size=self.s.vocab_size, eos_token_ids=[e.eos_token_id], supports_vision=e.config.vision)

    async def GetServerInfo(self, request, context):
        e = self.s.engine
        return ts.GetServerInfoResponse(
            server_args=sglang_server_args(self.s.pd), active_requests=e.active_requests, is_paused=False,
            uptime_seconds=time.time() - e.started_at, tokenspeed_version="sim",
            max_total_num_tokens=e.config.kv_capacity_blocks * e.config.block_size)

    async def GetLoads(self, request, context):
        return self.s.loads_answer(ts)

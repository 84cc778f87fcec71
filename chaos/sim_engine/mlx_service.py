"""The simulated engine as MLX's engine service (``mlx.grpc.engine.MlxEngine``): the same engine, its wire habits.

Its proto has no n, no constraints, no prompt log probabilities, no Embed, GetLoads nor SubscribeKvEvents: a gateway
that calls one of those is answered UNIMPLEMENTED, and a request whose fields this service does not have could not
be built (its SubscribeKvEvents, inherited from the common RPCs, is not in its service: never registered).
"""

from __future__ import annotations

import time

import grpc
from smg_grpc_proto.generated import mlx_engine_pb2 as ml
from smg_grpc_proto.generated import mlx_engine_pb2_grpc as ml_grpc

from .core import GenerateParams
from .services import CommonRpcs, log_trace


class MlxService(CommonRpcs, ml_grpc.MlxEngineServicer):

    async def Generate(self, request: ml.GenerateRequest, context):
        log_trace(request.request_id, context)
        await self.s.refuse_generation(context)
        if request.WhichOneof("input") != "tokenized":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the simulated engine takes tokenized input only")
        sp = request.sampling_params
        params = GenerateParams(
            request_id=request.request_id,
            prompt_ids=list(request.tokenized.input_ids),
            max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
            stop_token_ids=frozenset(sp.stop_token_ids),
            ignore_eos=sp.ignore_eos,
            seed=sp.seed if sp.HasField("seed") else None,
            logprobs=sp.logprobs if sp.HasField("logprobs") else None,
        )
        async for answer in self.s.answers(params, 1, request.stream, context, ml, ml.GenerateResponse,
                                           matched_field="matched_stop_token_id"):
            yield answer

    async def HealthCheck(self, request, context):
        return ml.HealthCheckResponse(healthy=True, message="ok")

    async def Abort(self, request: ml.AbortRequest, context):
        self.s.engine.abort(list(request.request_ids))
        return ml.AbortResponse()

    async def GetModelInfo(self, request, context):
        e = self.s.engine
        return ml.GetModelInfoResponse(
            model_path=e.config.model_name, is_generation=not self.s.embeds, max_context_length=e.config.max_context_tokens,
            vocab_size=self.s.vocab_size, served_model_name=e.config.model_name, model_type="qwen3",
            architectures=[self.s.architecture], eos_token_ids=[e.eos_token_id],
            max_req_input_len=e.config.max_context_tokens - 1)

    async def GetServerInfo(self, request, context):
        e = self.s.engine
        return ml.GetServerInfoResponse(server_type="mlx-grpc", active_requests=e.active_requests,
                                        uptime_seconds=time.time() - e.started_at)

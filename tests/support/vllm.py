"""What the real-engine tests ask a vLLM engine directly, over its own gRPC service."""

from __future__ import annotations

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vl
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vl_grpc


def engine_running(vllm_url: str) -> int:
    with grpc.insecure_channel(vllm_url.removeprefix("grpc://")) as channel:
        loads = vl_grpc.VllmEngineStub(channel).GetLoads(vl.GetLoadsRequest(), timeout=10)
    return sum(x.num_running_reqs for x in loads.loads)

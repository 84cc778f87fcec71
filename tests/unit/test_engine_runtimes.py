"""Engine kinds as two-way seams (gateway/engine/runtimes/): each kind builds its own service's requests and reads
its own answers; detection follows the registry; nothing outside the package asks which kind an engine is by its
name."""

from __future__ import annotations

import pathlib
import re

from smg_grpc_proto.generated import mlx_engine_pb2 as ml
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts
from smg_grpc_proto.generated import trtllm_service_pb2 as tr
from smg_grpc_proto.generated import vllm_engine_pb2 as vl

from gateway.engine.grpc_engine import Handover, SamplingOptions
from gateway.engine.runtimes import BOOTSTRAP_ROOM, ENGINE_RUNTIMES, KV_TRANSFER_PARAMS

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLING = SamplingOptions(max_new_tokens=4)


def test_each_kind_speaks_its_own_service():
    assert list(ENGINE_RUNTIMES) == ["sglang", "vllm", "trtllm", "mlx", "tokenspeed"]  # detection's order
    for name, pb, handover in (("sglang", sg, BOOTSTRAP_ROOM), ("vllm", vl, KV_TRANSFER_PARAMS), ("trtllm", tr, None),
                               ("mlx", ml, None), ("tokenspeed", ts, BOOTSTRAP_ROOM)):
        runtime = ENGINE_RUNTIMES[name]
        assert runtime.pb is pb and runtime.handover == handover
        # The service's name as its proto declares it: a call to another kind's path is UNIMPLEMENTED.
        assert [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()] == [runtime.service]
        assert isinstance(runtime.generate_request("r", [1, 2], SAMPLING, True), pb.GenerateRequest)
        assert isinstance(runtime.abort_request("r"), pb.AbortRequest)
        if "EmbedRequest" in pb.DESCRIPTOR.message_types_by_name:
            assert isinstance(runtime.embed_request("r", [1]), pb.EmbedRequest)
        assert runtime.method("Generate") == f"/{runtime.service}/Generate"


def test_each_kind_reads_its_own_answers():
    sglang, vllm = ENGINE_RUNTIMES["sglang"], ENGINE_RUNTIMES["vllm"]
    done = vl.GenerateResponse(complete=vl.GenerateComplete(output_ids=[5], finish_reason="stop", prompt_tokens=2,
                                                            completion_tokens=1, kv_transfer_params_json='{"a": 1}'))
    assert vllm.prefill_answer(done).kv_transfer_params_json == '{"a": 1}'
    assert vllm.events([done], stream=False)[0].token_ids == [5]
    said = sg.GenerateResponse(complete=sg.GenerateComplete(output_ids=[5], finish_reason="stop", prompt_tokens=2,
                                                            completion_tokens=1))
    assert sglang.prefill_answer(said).kv_transfer_params_json is None  # SGLang hands over by its room
    loads = sg.GetLoadsResponse(loads=[sg.SchedulerLoad(num_running_reqs=2, num_waiting_reqs=1, token_usage=0.5,
                                                        max_running_requests=8)] * 2)
    assert sglang.loads(loads).running == 4 and sglang.loads(loads).max_running == 16
    info = vllm.model_info(vl.GetModelInfoResponse(model_path="m", max_context_length=64, architectures=["X"]))
    assert info.served_model_name == "m" and info.architectures == ("X",)
    room = sglang.generate_request("r", [1], SAMPLING, True, Handover("10.0.0.1", 8998, 7))
    assert room.disaggregated_params.bootstrap_room == 7


def test_no_code_outside_the_runtimes_asks_an_engines_kind_by_its_name():
    names = "|".join(ENGINE_RUNTIMES)
    asked = re.compile(rf"""(==|!=)\s*["']({names})["']|["']({names})["']\s*(==|!=)""")
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "gateway").rglob("*.py"))
             if "runtimes" not in path.parts
             for n, line in enumerate(path.read_text().splitlines(), 1) if asked.search(line)]
    assert not found, f"ask the engine's runtime instead: {found}"

"""Prefill/decode disaggregation's pure parts: pairing rules, the pair router's choices and refusals, rooms,
what engines report, and the flags."""

from __future__ import annotations

import dataclasses
import random

import pytest
import trio
from google.protobuf.struct_pb2 import Struct
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg, vllm_engine_pb2 as vl

from gateway.node.config import ConfigError, GatewayConfig, _prefill_engines, validate
from gateway.serving.disaggregation import ROOM_MAX, PairRouter, PdConfig, RoomDraw
from gateway.engine.grpc_engine import Handover, SamplingOptions
from gateway.engine.runtimes import ENGINE_RUNTIMES as RUNTIMES
from gateway.engine.pairing_info import PairingInfo
from gateway.base.errors import NoCapacity
from gateway.routing.breaker import BreakerConfig, CircuitBreaker
from gateway.routing.policies import PolicyConfig, RoutingRequest, make_policy
from gateway.workers.pairing import pair_refusal, role_conflict


class _Worker:
    def __init__(self, wid: str, role: str, runtime: str = "sglang", pairing: PairingInfo = PairingInfo(),
                 breaker: CircuitBreaker | None = None) -> None:
        self.id, self.role, self.runtime, self.pairing = wid, role, runtime, pairing
        self.breaker = breaker or CircuitBreaker(BreakerConfig())
        self.draining = False

    def load_score(self) -> int:
        return 0


class _Registry:
    def __init__(self, workers: "list[_Worker]") -> None:
        self.workers = workers
        self.on_removed: list = []
        self.pd_workers = len(workers)

    def candidates(self, model, now, kind=None, role="regular"):
        return [w for w in self.workers if w.role == role and w.breaker.allows(now)]

    def disaggregated(self, model):
        prefill = [w for w in self.workers if w.role == "prefill"]
        decode = [w for w in self.workers if w.role == "decode"]
        return (prefill, decode) if prefill or decode else None


def _router(workers: "list[_Worker]", policy: str = "round_robin") -> PairRouter:
    return PairRouter(_Registry(workers), make_policy(PolicyConfig(name=policy)),
                      make_policy(PolicyConfig(name=policy)))


def test_pairing_protocols_and_vllm_factors_keep_workers_apart():
    p = _Worker("p", "prefill", pairing=PairingInfo(protocol="a"))
    assert pair_refusal(p, _Worker("d", "decode", pairing=PairingInfo(protocol="a"))) is None
    assert pair_refusal(p, _Worker("d", "decode")) is None  # one side says nothing: it pairs
    assert "pairing protocols" in pair_refusal(p, _Worker("d", "decode", pairing=PairingInfo(protocol="b")))
    assert "vllm decode" in pair_refusal(p, _Worker("d", "decode", runtime="vllm"))
    vp = _Worker("p", "prefill", "vllm", PairingInfo(kv_cache_dtype="fp8", block_size=16))
    assert "kv_cache_dtype" in pair_refusal(vp, _Worker("d", "decode", "vllm", PairingInfo(kv_cache_dtype="auto")))
    assert "block_size" in pair_refusal(vp, _Worker("d", "decode", "vllm", PairingInfo(block_size=32)))


def test_an_engine_running_in_another_role_is_refused():
    assert role_conflict("prefill", PairingInfo(mode="prefill")) is None
    assert role_conflict("prefill", PairingInfo()) is None  # it did not say: taken at its registration's word
    assert role_conflict("decode", PairingInfo(mode="prefill")) == "the engine runs as prefill, not decode"
    assert role_conflict("regular", PairingInfo(mode="decode")) is not None


async def test_the_router_pairs_compatible_workers_only():
    prefills = [_Worker("p1", "prefill", pairing=PairingInfo(protocol="a")),
                _Worker("p2", "prefill", pairing=PairingInfo(protocol="b"))]
    decode = _Worker("d1", "decode", pairing=PairingInfo(protocol="b"))
    router = _router([*prefills, decode])
    for _ in range(4):  # round robin would offer p1 every other time: it never pairs with d1
        pair = router.select("m", RoutingRequest())
        assert (pair.prefill.id, pair.decode.id) == ("p2", "d1")
        pair.prefill.breaker.record_success(0)
        pair.decode.breaker.record_success(0)


async def test_missing_sides_and_incompatible_pairs_are_named():
    with pytest.raises(NoCapacity) as caught:
        _router([_Worker("p1", "prefill")]).select("m", RoutingRequest())
    assert caught.value.code == "no_decode_worker" and "no decode worker" in str(caught.value)
    with pytest.raises(NoCapacity) as caught:
        _router([_Worker("d1", "decode")]).select("m", RoutingRequest())
    assert caught.value.code == "no_prefill_worker"
    with pytest.raises(NoCapacity) as caught:
        _router([_Worker("p1", "prefill", pairing=PairingInfo(protocol="a")),
                 _Worker("d1", "decode", pairing=PairingInfo(protocol="b"))]).select("m", RoutingRequest())
    assert caught.value.code == "no_compatible_pd_pair" and "'a' and 'b'" in str(caught.value)


async def test_an_open_circuit_moves_the_pair():
    tight = BreakerConfig(failure_threshold=1, open_duration_s=60)
    broken = _Worker("d1", "decode", breaker=CircuitBreaker(tight))
    broken.breaker.record_failure(trio.current_time())
    router = _router([_Worker("p1", "prefill"), broken, _Worker("d2", "decode")])
    assert router.select("m", RoutingRequest()).decode.id == "d2"


async def test_a_retry_prefers_workers_not_tried():
    router = _router([_Worker("p1", "prefill"), _Worker("p2", "prefill"), _Worker("d1", "decode"),
                      _Worker("d2", "decode")])
    pair = router.select("m", RoutingRequest(), exclude={"p1", "d1"})
    assert (pair.prefill.id, pair.decode.id) == ("p2", "d2")
    # With nothing else left, the tried ones serve again.
    pair = _router([_Worker("p1", "prefill"), _Worker("d1", "decode")]).select("m", RoutingRequest(),
                                                                              exclude={"p1", "d1"})
    assert pair.prefill.id == "p1"


def test_rooms_are_in_the_contracts_range_and_never_reused_in_flight():
    seed = random.randrange(1 << 30)
    rooms = RoomDraw(random.Random(seed))
    drawn = [rooms.draw() for _ in range(2000)]
    assert len(set(drawn)) == len(drawn), f"seed {seed}"
    assert all(0 <= r <= ROOM_MAX for r in drawn), f"seed {seed}"
    small = RoomDraw(random.Random(seed))
    small._rng = random.Random(seed)
    first = small.draw()
    small._rng = random.Random(seed)  # the same draw again: redrawn, as the first is in flight
    assert small.draw() != first
    small.release(first)
    assert first not in small.in_flight


def test_handovers_travel_in_each_runtimes_fields():
    sampling = SamplingOptions(max_new_tokens=4)
    sglang = RUNTIMES["sglang"].generate_request("r", [1, 2], sampling, True, Handover("10.0.0.7", 8998, ROOM_MAX))
    assert (sglang.disaggregated_params.bootstrap_host, sglang.disaggregated_params.bootstrap_port,
            sglang.disaggregated_params.bootstrap_room) == ("10.0.0.7", 8998, ROOM_MAX)
    assert not RUNTIMES["sglang"].generate_request("r", [1], sampling, True).HasField("disaggregated_params")
    vllm = RUNTIMES["vllm"].generate_request("r", [1], sampling, True, Handover(kv_transfer_params_json='{"x": 1}'))
    assert vllm.kv_transfer_params_json == '{"x": 1}'
    assert not RUNTIMES["vllm"].generate_request("r", [1], sampling, True).HasField("kv_transfer_params_json")


def test_what_engines_report_about_disaggregation():
    args = Struct()
    args.update({"disaggregation_mode": "decode", "pairing_protocol": "p1", "disaggregation_transfer_backend":
                 "mooncake"})
    info = RUNTIMES["sglang"].pairing(sg.GetServerInfoResponse(server_args=args))
    assert (info.mode, info.protocol, info.kv_connector) == ("decode", "p1", "mooncake")
    args.update({"disaggregation_mode": "null"})
    assert RUNTIMES["sglang"].pairing(sg.GetServerInfoResponse(server_args=args)).mode == "regular"
    assert RUNTIMES["sglang"].pairing(sg.GetServerInfoResponse()).mode == ""
    info = RUNTIMES["vllm"].pairing(vl.GetServerInfoResponse(kv_role="kv_producer", pairing_protocol="x",
                                                                     kv_connector="NixlConnector", block_size=16))
    assert (info.mode, info.protocol, info.block_size) == ("prefill", "x", 16)
    assert RUNTIMES["vllm"].pairing(vl.GetServerInfoResponse(kv_role="kv_both")).mode == ""


def test_prefill_flags_take_an_optional_bootstrap_port():
    assert _prefill_engines([["grpc://a:1"], ["grpc://b:2", "9001"], ["grpc://c:3", "none"]]) == (
        ("grpc://a:1", None), ("grpc://b:2", 9001), ("grpc://c:3", None))
    assert _prefill_engines("grpc://a:1 8998, grpc://b:2") == (("grpc://a:1", 8998), ("grpc://b:2", None))
    assert _prefill_engines([["grpc://a:1", 7]]) == (("grpc://a:1", 7),)
    for bad in ([["grpc://a:1", "1", "2"]], [["grpc://a:1", "70000"]], [["grpc://a:1", "x"]]):
        with pytest.raises(ValueError):
            _prefill_engines(bad)


def _validate_pd(pd: PdConfig) -> None:
    validate(dataclasses.replace(GatewayConfig(), pd=pd))


def test_pd_flags_are_checked():
    with pytest.raises(ConfigError, match="need --pd-disaggregation"):
        _validate_pd(PdConfig(decode=("grpc://d:1",)))
    with pytest.raises(ConfigError, match="gRPC engines"):
        _validate_pd(PdConfig(enabled=True, decode=("http://d:1",)))
    with pytest.raises(ConfigError, match="--prefill-policy: unknown routing policy 'fastest'"):
        _validate_pd(PdConfig(enabled=True, prefill_policy="fastest"))
    _validate_pd(PdConfig(enabled=True, prefill=(("grpc://p:1", 8998),), decode=("grpc://d:1",),
                          prefill_policy="cache_aware", decode_policy="power_of_two"))

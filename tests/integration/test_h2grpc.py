"""The h2 gRPC client against a real simulated engine (grpcio's server) and against misbehaving peers."""

from __future__ import annotations

import pytest
import trio
from smg_grpc_proto.generated import common_pb2, sglang_scheduler_pb2 as sg

from chaos.processes import EngineProcess
from gateway.engine.errors import EngineCallError
from gateway.engine.grpc_engine import GrpcEngineClient, SamplingOptions
from gateway.engine.h2grpc import H2GrpcClient

SERVICE = "/sglang.grpc.scheduler.SglangScheduler"


@pytest.fixture
def engine(log_dir):
    process = EngineProcess(["--zero-cost"], log_dir, "h2-engine")
    yield process
    process.stop()


async def test_calls_streams_errors_and_cancellation(engine, nursery):
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, engine.target, "sglang")
    info = await engine_client.model_info(5)
    assert info.served_model_name

    # A 30,000-token prompt is ~150 KB: more than HTTP/2's initial 64 KB window, so it crosses in
    # several windows.
    async with engine_client.generate("big", list(range(1000, 31000)), SamplingOptions(max_new_tokens=3),
                                      False, 30) as batches:
        events = []
        async for batch in batches:
            events += batch
    assert events[-1].prompt_tokens == 30000 and events[-1].completion_tokens == 3

    # Streamed: every token arrives, in order.
    async with engine_client.generate("s", [1, 2, 3], SamplingOptions(max_new_tokens=40, ignore_eos=True),
                                      True, 30) as batches:
        tokens: list[int] = []
        async for batch in batches:
            for event in batch:
                tokens += event.token_ids
    assert len(tokens) == 40

    # Leaving a stream early cancels it (RST_STREAM): nothing stays open on the connection.
    async with engine_client.generate("early", [1, 2, 3], SamplingOptions(max_new_tokens=10_000, ignore_eos=True),
                                      True, 30) as batches:
        async for _ in batches:
            break
    connection = client._connections[engine.target]
    assert not connection.calls and connection.alive

    with pytest.raises(EngineCallError) as error:
        await client.unary(engine.target, SERVICE + "/NoSuchMethod", common_pb2.KvEventBatch(),
                           sg.GetModelInfoResponse, 5)
    assert error.value.code == "UNIMPLEMENTED"
    assert (await engine_client.model_info(5)).served_model_name == info.served_model_name  # still usable
    await client.aclose()


async def test_engine_dying_mid_stream_fails_the_call_as_unavailable(engine, nursery):
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, engine.target, "sglang")
    with pytest.raises(EngineCallError) as error:
        async with engine_client.generate("long", [1, 2, 3], SamplingOptions(max_new_tokens=1_000_000,
                                                                             ignore_eos=True), True, 60) as batches:
            killed = False
            async for _ in batches:
                if not killed:
                    engine.kill()
                    killed = True
    assert error.value.code == "UNAVAILABLE" and error.value.retryable
    await client.aclose()


async def test_refused_and_silent_peers(nursery):
    client = H2GrpcClient(nursery)
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    silent_port = listener.socket.getsockname()[1]
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        refused_port = probe.getsockname()[1]  # bound, never listening: connections are refused

        with pytest.raises(EngineCallError) as error:
            await client.unary(f"127.0.0.1:{refused_port}", SERVICE + "/GetModelInfo",
                               sg.GetModelInfoRequest(), sg.GetModelInfoResponse, 5)
        assert error.value.code == "UNAVAILABLE"

    accepted = []

    async def accept_and_say_nothing():
        stream = await listener.accept()
        accepted.append(stream)
        while await stream.receive_some(65536):
            pass

    nursery.start_soon(accept_and_say_nothing)
    target = f"127.0.0.1:{silent_port}"
    with pytest.raises(EngineCallError) as error:
        await client.unary(target, SERVICE + "/GetModelInfo", sg.GetModelInfoRequest(), sg.GetModelInfoResponse,
                           0.3)
    assert error.value.code == "DEADLINE_EXCEEDED"
    # Nothing at all came back on that connection: it is dropped, the next call starts afresh.
    assert not client._connections[target].alive
    await client.aclose()
    await listener.aclose()

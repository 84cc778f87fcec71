"""The trio <-> grpcio bridge against a real simulated engine: batching, back-pressure, cancellation."""

from __future__ import annotations

import pytest
import trio

from chaos.processes import EngineProcess
from gateway.engine.bridge import GrpcBridge
from gateway.engine.errors import EngineCallError
from gateway.engine.grpc_engine import GrpcEngineClient, SamplingOptions


@pytest.fixture(scope="module")
def engine(log_dir):
    e = EngineProcess(["--zero-cost"], log_dir, "bridge-engine")
    yield e
    e.stop()


@pytest.fixture
async def bridge():
    b = GrpcBridge()
    yield b
    await trio.to_thread.run_sync(b.close)


async def test_a_slow_reader_gets_bounded_batches_and_every_token(engine, bridge):
    client = GrpcEngineClient(bridge, engine.target, "sglang")
    request = client.runtime.generate_request("bp", list(range(10, 50)), SamplingOptions(max_new_tokens=300), True)
    sizes, tokens = [], 0
    async with bridge.open_stream(engine.target, client.runtime.method("Generate"), request,
                                  client.runtime.pb.GenerateResponse, 30, window_messages=8) as stream:
        async for batch in stream:
            sizes.append(len(batch))
            tokens += sum(len(m.chunk.token_ids) for m in batch if m.WhichOneof("response") == "chunk")
            await trio.sleep(0.01)  # a slow consumer: the bridge must stop reading, not buffer
    assert tokens == 300
    assert max(sizes) <= 8  # back-pressure: never more than the window waits on our side
    assert max(sizes) > 1  # and what arrived together crossed together


async def test_leaving_a_stream_early_cancels_the_call(engine, bridge):
    client = GrpcEngineClient(bridge, engine.target, "sglang")
    async with client.generate("early", list(range(10, 50)), SamplingOptions(max_new_tokens=100_000, ignore_eos=True),
                               True, 30) as events:
        async for _ in events:
            break
    with trio.fail_after(10):
        while (await client.loads(5)).running:
            await trio.sleep(0.05)  # the engine, another process, cannot be awaited directly


async def test_unary_errors_map_to_engine_call_errors(bridge):
    client = GrpcEngineClient(bridge, "127.0.0.1:1", "sglang")
    with pytest.raises(EngineCallError) as e:
        await client.health(2)
    assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED") and e.value.retryable


async def test_cancelling_a_waiting_trio_task_cancels_the_unary_call(engine, bridge):
    client = GrpcEngineClient(bridge, engine.target, "sglang")
    with trio.move_on_after(0):
        await client.model_info(5)
    assert (await client.model_info(5)).served_model_name == "qwen3-sim"  # the bridge is still fine

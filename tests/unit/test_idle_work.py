"""What a node does with no requests, on virtual time: the load polls stop once nothing was routed for
``HealthConfig.load_idle_s`` and start again with the next routing; the loop-lag probe samples once a
second while nothing is busy, 20 times a second while something is. (An idle node's CPU is measured in
BENCHMARKS.md; these hold the rules that make it near zero.)"""

from __future__ import annotations

import pytest
import trio

from gateway.engine.grpc_engine import EngineLoad
from gateway.observe.loop_lag import LoopLagMonitor
from gateway.routing.breaker import BreakerConfig
from gateway.workers import HealthConfig, WorkerRegistry

HEALTH = HealthConfig(interval_s=5.0, load_interval_s=1.0, load_idle_s=10.0, success_threshold=1)
ENGINE = "grpc://10.9.0.1:30001"


class CountingEngine:
    kind = "grpc"
    runtime_name = "sglang"
    needs_tokenizer = True
    publishes_kv_events = False
    architectures = ()

    def __init__(self) -> None:
        self.health_checks: list[float] = []
        self.load_polls: list[float] = []

    async def health(self, timeout_s: float) -> bool:
        self.health_checks.append(trio.current_time())
        return True

    async def loads(self, timeout_s: float) -> EngineLoad:
        self.load_polls.append(trio.current_time())
        return EngineLoad(running=3, waiting=1, token_usage=0.5, max_running=64)

    async def aclose(self) -> None:
        pass


async def test_load_polls_stop_while_nothing_is_routed_and_resume_with_the_next_request(autojump_clock):
    engine = CountingEngine()

    async def connect(*args):
        return engine, ("sim-model",), 4096

    async with trio.open_nursery() as nursery:
        registry = WorkerRegistry(None, None, HEALTH, BreakerConfig(), nursery, connect=connect)
        worker = await registry.add(ENGINE)
        started = trio.current_time()
        await trio.sleep(60)
        # Polled each second until nothing had been routed for 10 s, then only the health checks ran.
        assert 9 <= len(engine.load_polls) <= 11 and engine.load_polls[-1] - started <= 11
        assert len(engine.health_checks) >= 12 and worker.engine_load is None
        quiet_until = trio.current_time()
        assert registry.candidates("sim-model", trio.current_time()) == [worker]
        await trio.sleep(0.01)  # the poll is woken, not left to the next health check
        assert engine.load_polls[-1] - quiet_until < 0.01 and worker.load_score() == 4
        for _ in range(30):  # routing every second keeps the polls going
            registry.candidates("sim-model", trio.current_time())
            await trio.sleep(1)
        assert len([t for t in engine.load_polls if t > quiet_until]) >= 30
        nursery.cancel_scope.cancel()


class Recorder:
    def __init__(self) -> None:
        self.count = 0

    def observe(self, value: float) -> None:
        self.count += 1


@pytest.mark.parametrize("busy, samples_per_s", [(False, 1), (True, 20)])
async def test_the_lag_probe_samples_fast_only_while_the_node_is_busy(autojump_clock, busy, samples_per_s):
    histogram = Recorder()
    monitor = LoopLagMonitor(histogram, busy=lambda: busy)
    with trio.move_on_after(30.001):
        await monitor.run()
    assert histogram.count == 30 * samples_per_s and len(monitor.samples) == histogram.count


async def test_the_lag_probe_keeps_its_fast_rate_for_a_while_after_the_last_request(autojump_clock):
    histogram = Recorder()
    busy_until = trio.current_time() + 5
    monitor = LoopLagMonitor(histogram, busy=lambda: trio.current_time() < busy_until)
    with trio.move_on_after(35.001):  # 5 s busy, 10 s held at the fast rate, then 20 s at one a second
        await monitor.run()
    assert 15 * 20 + 19 <= histogram.count <= 15 * 20 + 21

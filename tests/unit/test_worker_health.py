"""The health rule (gateway/workers/health.py), one test per rule, on passed-in time; and the
bookkeeping of one attempt on a worker (gateway/workers/attempt.py)."""

from __future__ import annotations

import pytest
import trio

from gateway.engine.errors import EngineCallError
from gateway.routing.breaker import BreakerConfig, CircuitBreaker, CircuitState
from gateway.workers import AttemptFailed, HealthConfig, HealthTracker, Verdict, Worker, WorkerAttempt

CONFIG = HealthConfig(failure_threshold=3, success_threshold=2)


def tracker(healthy: bool) -> HealthTracker:
    return HealthTracker(CONFIG, healthy, now=0.0)


def test_failure_threshold_failures_in_a_row_make_a_healthy_worker_unhealthy():
    t = tracker(healthy=True)
    assert [t.record(False, now) for now in (5.0, 10.0)] == [Verdict.UNCHANGED] * 2
    assert t.healthy
    assert t.record(False, 15.0) is Verdict.BECAME_UNHEALTHY
    assert not t.healthy and t.changed_at == 15.0 and t.checked_at == 15.0


def test_a_passed_check_clears_the_failure_run():
    t = tracker(healthy=True)
    for now, ok in ((5.0, False), (10.0, False), (15.0, True), (20.0, False), (25.0, False)):
        assert t.record(ok, now) is Verdict.UNCHANGED
    assert t.healthy and t.failures == 2 and t.changed_at == 0.0


def test_success_threshold_passes_in_a_row_make_an_unhealthy_worker_healthy():
    t = tracker(healthy=False)
    assert t.record(True, 5.0) is Verdict.UNCHANGED and not t.healthy
    assert t.record(True, 10.0) is Verdict.BECAME_HEALTHY
    assert t.healthy and t.changed_at == 10.0


def test_a_failed_check_clears_the_success_run():
    t = tracker(healthy=False)
    for now, ok in ((5.0, True), (10.0, False), (15.0, True)):
        assert t.record(ok, now) is Verdict.UNCHANGED
    assert not t.healthy
    assert t.record(True, 20.0) is Verdict.BECAME_HEALTHY


def test_checks_that_agree_with_the_state_change_nothing():
    healthy, unhealthy = tracker(True), tracker(False)
    for now in (5.0, 10.0, 15.0, 20.0):
        assert healthy.record(True, now) is Verdict.UNCHANGED
        assert unhealthy.record(False, now) is Verdict.UNCHANGED
    assert healthy.healthy and not unhealthy.healthy and healthy.changed_at == unhealthy.changed_at == 0.0


def test_the_owners_verdict_is_adopted_at_once_and_restarts_the_runs():
    t = tracker(healthy=True)
    t.record(False, 5.0)
    t.record(False, 10.0)
    assert t.adopt(True, 12.0) is Verdict.UNCHANGED
    assert t.adopt(False, 13.0) is Verdict.BECAME_UNHEALTHY and t.changed_at == 13.0
    assert t.failures == 0 and t.successes == 0
    assert t.adopt(True, 14.0) is Verdict.BECAME_HEALTHY


class _Client:
    kind = "grpc"
    runtime_name = "sglang"


def make_worker() -> Worker:
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=1, open_duration_s=30.0))
    return Worker("grpc://127.0.0.1:1", _Client(), ("m",), None, breaker, {}, tracker(True))


async def test_an_attempt_counts_in_flight_and_a_success_closes_nothing_open():
    worker = make_worker()
    with WorkerAttempt(worker):
        assert worker.in_flight == 1 and not worker.idle.is_set()
    assert worker.in_flight == 0 and worker.idle.is_set()
    assert worker.breaker.current_state(trio.current_time()) is CircuitState.CLOSED


@pytest.mark.parametrize("code, opens", [("UNAVAILABLE", True), ("INVALID_ARGUMENT", False)])
async def test_only_an_engine_fault_counts_against_the_circuit(code, opens):
    worker = make_worker()
    with pytest.raises(AttemptFailed):
        with WorkerAttempt(worker) as attempt:
            error = EngineCallError(code, "x")
            attempt.failed(error)
            raise AttemptFailed(error)
    state = worker.breaker.current_state(trio.current_time())
    assert (state is CircuitState.OPEN) == opens and worker.in_flight == 0


async def test_a_cancelled_attempt_gives_no_verdict(autojump_clock):
    worker = make_worker()
    with trio.move_on_after(1):
        with WorkerAttempt(worker):
            await trio.sleep(10)
    assert worker.breaker.current_state(trio.current_time()) is CircuitState.CLOSED and worker.in_flight == 0


async def test_a_failure_after_the_answer_began_still_counts_though_the_attempt_returns():
    worker = make_worker()
    with WorkerAttempt(worker) as attempt:
        attempt.failed(EngineCallError("UNAVAILABLE", "reset mid-stream"))
    assert worker.breaker.current_state(trio.current_time()) is CircuitState.OPEN

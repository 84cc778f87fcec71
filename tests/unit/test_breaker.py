"""Circuit breaker rules, one test per rule, time passed in."""

from gateway.routing.breaker import BreakerConfig, CircuitBreaker, CircuitState

CFG = BreakerConfig(failure_threshold=3, success_threshold=2, open_duration_s=10.0, window_s=5.0)


def tripped(now: float = 0.0) -> CircuitBreaker:
    b = CircuitBreaker(CFG)
    for i in range(3):
        b.record_failure(now + i * 0.1)
    return b


def test_consecutive_failures_open_the_circuit():
    b = tripped()
    assert b.current_state(0.3) is CircuitState.OPEN
    assert not b.allows(0.3)


def test_success_resets_the_failure_count():
    b = CircuitBreaker(CFG)
    b.record_failure(0)
    b.record_failure(1)
    b.record_success(2)
    b.record_failure(3)
    assert b.current_state(3) is CircuitState.CLOSED


def test_failures_further_apart_than_the_window_do_not_add_up():
    b = CircuitBreaker(CFG)
    for t in (0, 6, 12):
        b.record_failure(t)
    assert b.current_state(12) is CircuitState.CLOSED


def test_open_becomes_half_open_after_the_open_duration():
    b = tripped()
    assert b.current_state(10.1) is CircuitState.OPEN
    assert b.current_state(10.3) is CircuitState.HALF_OPEN


def test_a_passing_health_check_half_opens_an_open_circuit_at_once():
    """The engine came back (its health check passes again): probe it now, not after the open duration. Found
    by the kill-model-engines chaos run: the model stayed down a minute after its engines were back."""
    b = tripped()
    b.health_recovered(1.0)
    assert b.current_state(1.0) is CircuitState.HALF_OPEN and b.acquire(1.0)
    b.record_failure(1.1)  # a failed probe: open again, for the whole period
    assert b.current_state(11.0) is CircuitState.OPEN
    closed = CircuitBreaker(CFG)
    closed.health_recovered(0)
    assert closed.current_state(0) is CircuitState.CLOSED  # nothing to do for a closed one


def test_half_open_admits_one_probe_at_a_time():
    b = tripped()
    assert b.acquire(11)
    assert not b.acquire(11)


def test_half_open_successes_close_the_circuit():
    b = tripped()
    for _ in range(2):
        assert b.acquire(11)
        b.record_success(11)
    assert b.current_state(11) is CircuitState.CLOSED


def test_half_open_failure_reopens_for_another_period():
    b = tripped()
    assert b.acquire(11)
    b.record_failure(11)
    assert b.current_state(11) is CircuitState.OPEN
    assert b.current_state(20.9) is CircuitState.OPEN
    assert b.current_state(21.1) is CircuitState.HALF_OPEN


def test_a_released_probe_frees_the_half_open_slot():
    b = tripped()
    assert b.acquire(11)
    b.release_probe()
    assert b.acquire(11)


def test_disabled_breaker_always_allows():
    b = CircuitBreaker(BreakerConfig(enabled=False, failure_threshold=1))
    for t in range(5):
        b.record_failure(t)
    assert b.allows(5)

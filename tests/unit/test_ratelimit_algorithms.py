"""The rate-limit algorithms with time passed in: exact figures, no clock."""

from __future__ import annotations

import math

import pytest

from gateway.ratelimit.algorithms import Algorithm, KeyState, Mode, Rate, decide, is_idle, merge_max

BUCKET = Rate(Algorithm.TOKEN_BUCKET, limit=10, window_s=1.0, burst=5)
WINDOW = Rate(Algorithm.SLIDING_WINDOW, limit=10, window_s=10.0, burst=10)


def test_token_bucket_admits_its_burst_then_denies_with_the_exact_wait():
    state = KeyState(tat_s=100.0)
    outcomes = [decide(BUCKET, state, 100.0, 1) for _ in range(6)]
    assert [d.allowed for d in outcomes] == [True] * 5 + [False]
    assert [d.remaining for d in outcomes[:5]] == [4, 3, 2, 1, 0]
    assert outcomes[5].retry_after_s == pytest.approx(0.1)  # one unit refills in window/limit
    assert outcomes[4].reset_after_s == pytest.approx(0.5)  # five units to refill


def test_token_bucket_refills_continuously_at_limit_per_window():
    state = KeyState(tat_s=0.0)
    for _ in range(5):
        assert decide(BUCKET, state, 0.0, 1).allowed
    assert not decide(BUCKET, state, 0.05, 1).allowed
    assert decide(BUCKET, state, 0.1, 1).allowed
    assert not decide(BUCKET, state, 0.1, 1).allowed
    # Over a long run the admitted count is limit * time + burst (full again by t=1).
    admitted = sum(decide(BUCKET, state, 1.0 + i * 0.01, 1).allowed for i in range(1000))
    assert admitted == pytest.approx(10 * 9.99 + 5, abs=1)


def test_token_bucket_refuses_a_request_larger_than_its_burst_forever():
    d = decide(BUCKET, KeyState(), 0.0, 6)
    assert not d.allowed and math.isinf(d.retry_after_s)


def test_force_counts_past_the_limit_and_later_requests_wait_the_debt_out():
    state = KeyState(tat_s=0.0)
    d = decide(BUCKET, state, 0.0, 8, Mode.FORCE)
    assert d.allowed and d.remaining == 0
    assert not decide(BUCKET, state, 0.0, 1).allowed
    assert decide(BUCKET, state, 0.4, 1).allowed  # 8 units of debt = 0.8 s; burst tolerance 0.5 s


def test_refund_gives_back_without_going_past_full():
    state = KeyState(tat_s=0.0)
    decide(BUCKET, state, 0.0, 5)
    assert decide(BUCKET, state, 0.0, 3, Mode.REFUND).remaining == 3
    assert decide(BUCKET, state, 0.0, 100, Mode.REFUND).remaining == 5
    assert is_idle(BUCKET, state, 0.0)


def test_peek_changes_nothing():
    state = KeyState(tat_s=0.0)
    decide(BUCKET, state, 0.0, 2)
    before = state.copy()
    assert decide(BUCKET, state, 0.0, 1, Mode.PEEK).remaining == 3
    assert state == before


def test_sliding_window_counts_up_to_the_limit_per_window():
    state = KeyState()
    outcomes = [decide(WINDOW, state, 1.0, 1) for _ in range(11)]
    assert [d.allowed for d in outcomes] == [True] * 10 + [False]
    assert outcomes[9].remaining == 0
    # Denied in window [0, 10): the next window starts with the previous count weighing 100% and fading.
    assert outcomes[10].retry_after_s == pytest.approx(10.0 - 1.0 + 1.0)


def test_sliding_window_weighs_the_previous_window_by_the_remaining_overlap():
    state = KeyState()
    for _ in range(10):
        decide(WINDOW, state, 9.0, 1)
    # At t=15 the previous window (10 hits) weighs 50%: 5 more fit.
    outcomes = [decide(WINDOW, state, 15.0, 1) for _ in range(6)]
    assert [d.allowed for d in outcomes] == [True] * 5 + [False]
    # The sixth needs the previous weight to fall to 40%: t = 16.
    assert outcomes[5].retry_after_s == pytest.approx(1.0)


def test_sliding_window_forgets_windows_older_than_the_previous_one():
    state = KeyState()
    for _ in range(10):
        decide(WINDOW, state, 1.0, 1)
    assert decide(WINDOW, state, 25.0, 10).allowed
    assert not is_idle(WINDOW, state, 25.0)
    assert is_idle(WINDOW, state, 40.0)


def test_sliding_window_refund_and_oversized_request():
    state = KeyState()
    decide(WINDOW, state, 1.0, 8)
    assert decide(WINDOW, state, 1.0, 5, Mode.REFUND).remaining == 7
    d = decide(WINDOW, state, 1.0, 11)
    assert not d.allowed and math.isinf(d.retry_after_s)


@pytest.mark.parametrize("rate", [BUCKET, WINDOW], ids=["token_bucket", "sliding_window"])
def test_merge_max_keeps_the_more_consumed_state_whatever_the_order(rate):
    a, b = KeyState(tat_s=0.0), KeyState(tat_s=0.0)
    decide(rate, a, 1.0, 2)
    decide(rate, b, 1.0, 4)
    ab, ba = a.copy(), b.copy()
    merge_max(rate, ab, b, 1.0)
    merge_max(rate, ba, a, 1.0)
    assert decide(rate, ab, 1.0, 0, Mode.PEEK) == decide(rate, ba, 1.0, 0, Mode.PEEK)
    assert decide(rate, ab, 1.0, 0, Mode.PEEK).remaining == decide(rate, b, 1.0, 0, Mode.PEEK).remaining
    merge_max(rate, ab, b, 1.0)  # idempotent
    assert decide(rate, ab, 1.0, 0, Mode.PEEK).remaining == decide(rate, b, 1.0, 0, Mode.PEEK).remaining


def test_rate_problems_are_named():
    assert Rate(Algorithm.TOKEN_BUCKET, 0, 1, 1).problem() == "limit must be a positive number, not 0"
    assert Rate(Algorithm.TOKEN_BUCKET, 1, math.nan, 1).problem().startswith("window_s")
    assert BUCKET.problem() is None

"""Admission limits and retry timing, on virtual time."""

import random

import pytest
import trio

from gateway.admission import Admission, AdmissionConfig
from gateway.api.errors import to_api_error
from gateway.errors import NoCapacity, Overloaded
from gateway.routing.retry import RetryConfig, backoff_s


def test_backoff_follows_smg_formula_without_jitter():
    cfg = RetryConfig(initial_backoff_s=0.05, multiplier=1.5, max_backoff_s=0.2, jitter_factor=0.0)
    rng = random.Random(0)
    assert [round(backoff_s(cfg, a, rng), 6) for a in range(5)] == [0.05, 0.075, 0.1125, 0.16875, 0.2]


def test_jitter_stays_within_its_factor():
    cfg = RetryConfig(initial_backoff_s=1.0, multiplier=1.0, jitter_factor=0.2)
    rng = random.Random(3)
    values = [backoff_s(cfg, 0, rng) for _ in range(500)]
    assert min(values) >= 0.8 and max(values) <= 1.2 and max(values) - min(values) > 0.3


def test_disabled_retries_mean_one_attempt():
    assert RetryConfig(enabled=False, max_retries=5).attempts_max == 1
    assert RetryConfig(max_retries=5).attempts_max == 6


async def test_requests_over_the_limit_queue_then_run(autojump_clock):
    adm = Admission(AdmissionConfig(max_concurrent_requests=2, queue_size=5, queue_timeout_s=100))
    order = []

    async def job(i):
        async with adm.slot():
            order.append((i, trio.current_time()))
            await trio.sleep(10)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(job, i)
    assert sorted(t for _, t in order) == [0.0, 0.0, 10.0, 10.0]
    assert adm.running == 0 and adm.waiting == 0


async def test_full_queue_is_refused_at_once_with_retry_after(autojump_clock):
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, queue_size=1, queue_timeout_s=100))

    async def hold():
        async with adm.slot():
            await trio.sleep(50)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold)
        nursery.start_soon(hold)  # queued
        await trio.sleep(1)
        with pytest.raises(Overloaded) as e:
            async with adm.slot():
                pass
        assert e.value.retry_after_s == 1 and to_api_error(e.value).status == 429
        assert to_api_error(e.value).headers() == [(b"retry-after", b"1")]
        assert trio.current_time() == 1.0
        nursery.cancel_scope.cancel()


async def test_queue_wait_times_out_with_503(autojump_clock):
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, queue_size=10, queue_timeout_s=30))

    entered = trio.Event()

    async def hold():
        async with adm.slot():
            entered.set()
            await trio.sleep(1000)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold)
        await entered.wait()
        with pytest.raises(NoCapacity) as e:
            async with adm.slot():
                pass
        assert trio.current_time() == 30.0 and to_api_error(e.value).status == 503
        assert adm.rejected_queue_timeout == 1 and adm.waiting == 0
        nursery.cancel_scope.cancel()


async def test_wait_idle_returns_when_the_last_request_ends(autojump_clock):
    adm = Admission(AdmissionConfig())

    entered = trio.Event()

    async def job():
        async with adm.slot():
            entered.set()
            await trio.sleep(7)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(job)
        await entered.wait()
        await adm.wait_idle()
        assert trio.current_time() == 7.0

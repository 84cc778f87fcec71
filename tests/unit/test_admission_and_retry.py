"""Admission limits and retry timing, on virtual time."""

import random

import pytest
import trio

from gateway.serving.admission import Admission, AdmissionConfig
from gateway.api.errors import to_api_error
from gateway.base.errors import NoCapacity, Overloaded
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


async def test_one_tenant_holds_at_most_its_share_and_the_others_go_past_it(autojump_clock):
    """Issue 33: a tenant filled every slot (background responses return at once) and others got 429."""
    adm = Admission(AdmissionConfig(max_concurrent_requests=4, queue_size=4, queue_timeout_s=1000))
    started: dict[str, list[float]] = {"flood": [], "other": []}

    async def job(tenant, seconds):
        async with adm.slot(tenant):
            started[tenant].append(trio.current_time())
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        for _ in range(4):  # two run (its share: half), two wait (its share of the queue: half)
            nursery.start_soon(job, "flood", 100)
        await trio.sleep(1)
        assert adm.running_for("flood") == 2 and adm.waiting == 2
        with pytest.raises(Overloaded) as refused:  # its share of the queue is full too
            async with adm.slot("flood"):
                pass
        assert refused.value.code == "queue_full" and adm.rejected_tenant_share == 1
        nursery.start_soon(job, "other", 1)  # a free slot: taken at once, past flood's waiters
        nursery.start_soon(job, "other", 1)
        await trio.sleep(0.5)
        assert started["other"] == [1.0, 1.0] and adm.running == 4
    assert started["flood"] == [0.0, 0.0, 100.0, 100.0]  # flood's waiters ran when its own ended


async def test_a_freed_slot_goes_to_the_first_waiter_under_its_share(autojump_clock):
    adm = Admission(AdmissionConfig(max_concurrent_requests=2, queue_size=10, queue_timeout_s=100,
                                    tenant_max_concurrent=1))
    order = []

    async def job(name, tenant, seconds):
        async with adm.slot(tenant):
            order.append((name, trio.current_time()))
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(job, "a1", "a", 10)
        nursery.start_soon(job, "shared", None, 10)
        await trio.sleep(1)
        nursery.start_soon(job, "a2", "a", 1)  # waits: the node is full (and a is at its share)
        await trio.sleep(0.1)
        nursery.start_soon(job, "b1", "b", 1)
        await trio.sleep(0.1)
    # At 10 both slots free: a2 is first in line and under its share again once a1 ended; b1 takes the other.
    assert sorted(order[2:]) == [("a2", 10.0), ("b1", 10.0)] and adm.running == 0 and adm.waiting == 0


async def test_a_waiter_granted_as_its_caller_goes_away_gives_the_slot_back(autojump_clock):
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, queue_size=10, queue_timeout_s=100))

    async def hold(seconds):
        async with adm.slot("a"):
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, 5)
        await trio.sleep(1)
        with trio.move_on_after(4):  # the caller gives up exactly as the slot frees
            async with adm.slot("b"):
                await trio.sleep(100)
    assert adm.running == 0 and adm.waiting == 0

"""The media pools' fair limiter (gateway/media/fair.py), one test per rule, on virtual time."""

from __future__ import annotations

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from gateway.base.errors import Overloaded
from gateway.media.fair import FairLimiter


async def hold(limiter: FairLimiter, tenant: str, seconds: float, order: list) -> None:
    async with limiter.slot(tenant):
        order.append((tenant, trio.current_time()))
        await trio.sleep(seconds)


async def test_a_tenant_alone_uses_every_slot(autojump_clock):
    limiter = FairLimiter(2, 2, 10, "decodes")
    order: list = []
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(hold, limiter, "a", 1.0, order)
    assert [t for _, t in order] == [0, 0, 1, 1]  # two at once: nothing left idle


async def test_a_freed_slot_goes_to_the_next_tenant_in_turn(autojump_clock):
    limiter = FairLimiter(1, 1, 100, "decodes")
    order: list = []
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(hold, limiter, "a", 1.0, order)
        await trio.sleep(0.5)
        nursery.start_soon(hold, limiter, "b", 1.0, order)
        nursery.start_soon(hold, limiter, "b", 1.0, order)
    tenants = [tenant for tenant, _ in order]
    # a's first holds the slot; its queue was there first, so one more of a's, then b's, then turns.
    assert tenants == ["a", "a", "b", "a", "b", "a", "a"]
    b_started = [t for tenant, t in order if tenant == "b"]
    assert b_started[0] == 2.0  # b waited for two decodes, not for a's five


async def test_a_tenant_at_its_share_leaves_the_rest_to_others(autojump_clock):
    limiter = FairLimiter(4, 2, 100, "fetches")
    order: list = []
    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(hold, limiter, "slow", 10.0, order)
        await trio.sleep(1)
        assert limiter.held["slow"] == 2 and limiter.in_use == 2  # two slots free, and a waits
        nursery.start_soon(hold, limiter, "quick", 0.1, order)
    assert ("quick", 1.0) in order  # at once


async def test_a_tenant_past_its_waiting_bound_is_refused_at_once(autojump_clock):
    limiter = FairLimiter(1, 1, 2, "decodes")
    async with trio.open_nursery() as nursery:
        for _ in range(3):  # one holds, two wait
            nursery.start_soon(hold, limiter, "a", 5.0, [])
        await wait_all_tasks_blocked()
        with pytest.raises(Overloaded, match="2 decodes waiting"):
            await limiter.acquire("a")
        assert limiter.refused == 1
        await limiter.acquire("b")  # another tenant still queues
        limiter.release("b")


async def test_a_waiter_cancelled_leaves_no_trace_and_a_granted_one_passes_its_slot_on(autojump_clock):
    limiter = FairLimiter(1, 1, 10, "decodes")
    order: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, limiter, "a", 2.0, order)
        await wait_all_tasks_blocked()
        with trio.move_on_after(1):
            await limiter.acquire("b")  # cancelled while waiting
        assert limiter.waiting == 0
        nursery.start_soon(hold, limiter, "c", 1.0, order)
    assert order == [("a", 0), ("c", 2.0)] and limiter.in_use == 0 and not limiter.held
    # Cancelled, then granted before it ran again (a release in the same step): the slot goes on to the next.
    await limiter.acquire("a")
    async with trio.open_nursery() as nursery:
        e_scope = trio.CancelScope()

        async def e() -> None:
            with e_scope:
                await limiter.acquire("e")
                order.append(("e", trio.current_time()))  # not reached: the cancel came first

        nursery.start_soon(e)
        await wait_all_tasks_blocked()
        nursery.start_soon(hold, limiter, "d", 0.0, order)
        await wait_all_tasks_blocked()
        e_scope.cancel()  # e is woken with Cancelled, and has not run yet...
        limiter.release("a")  # ...when the freed slot is handed to it, first in turn
    assert [tenant for tenant, _ in order][-1] == "d" and limiter.in_use == 0 and not limiter.held


async def test_a_thread_holds_its_slot_until_it_ends_even_when_abandoned():
    limiter = FairLimiter(1, 1, 10, "decodes")
    started = trio.Event()
    gate = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def work() -> None:
        trio.from_thread.run_sync(started.set, trio_token=token)
        trio.from_thread.run(gate.wait, trio_token=token)

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            async def cancel_once_started() -> None:
                await started.wait()
                scope.cancel()  # the caller leaves (a client gone): the thread is abandoned, still running

            nursery.start_soon(cancel_once_started)
            await trio.to_thread.run_sync(work, limiter=limiter.for_tenant("a"), abandon_on_cancel=True)
    assert limiter.in_use == 1 and limiter.held["a"] == 1  # abandoned, still counted
    gate.set()
    with trio.fail_after(10):
        while limiter.in_use:
            await trio.sleep(0.01)
    assert not limiter.held

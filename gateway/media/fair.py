"""Slots of a pool shared by tenants (media threads, image fetch connections), handed out fairly.

Before, both pools were first come, first served: one tenant's four requests of 16 large PNGs held every media
thread for ~30 s while another tenant's one 64 x 64 image waited 30.3 s behind them; one tenant's slow image
servers (a byte a second) held the 64 fetch connections, so another's fetch took 9.6 s of its 10 s.

Rules (``FairLimiter``):

- work-conserving: a tenant alone may use every slot up to ``tenant_slots_max``;
- a freed slot goes to the next tenant, in turn, that has a waiter and is under its ``tenant_slots_max`` (round
  robin between tenants, FIFO within one), so a tenant's waiting work never holds back another's: another tenant
  waits for at most one slot to free, not for a queue;
- a slot is free only while every waiter's tenant is at its ``tenant_slots_max`` (so a newcomer under its share
  takes a free slot at once, and nobody waits while a slot they may take is free);
- a tenant with ``tenant_waiting_max`` waiters is refused at once (``Overloaded``: 429), so what it queues (and
  the bytes its queued work holds) is bounded.

``None`` is a tenant too: the open data plane, whose callers cannot be told apart.
"""

from __future__ import annotations

import collections
from typing import Any

import trio

from ..base.errors import Overloaded


class _Waiter:
    __slots__ = ("tenant", "granted")

    def __init__(self, tenant: str | None) -> None:
        self.tenant = tenant
        self.granted = trio.Event()


class FairLimiter:
    def __init__(self, slots: int, tenant_slots_max: int, tenant_waiting_max: int, what: str) -> None:
        self.slots = slots
        self.tenant_slots_max = min(tenant_slots_max, slots)
        self.tenant_waiting_max = tenant_waiting_max
        self.what = what  # for errors: "image decodes"
        self.held: collections.Counter[str | None] = collections.Counter()
        self.in_use = 0
        # Waiters by tenant; the dict's order is the turn: a tenant served moves to the end.
        self._waiting: dict[str | None, collections.deque[_Waiter]] = {}
        self.refused = 0

    @property
    def waiting(self) -> int:
        return sum(map(len, self._waiting.values()))

    async def acquire(self, tenant: str | None) -> None:
        if self.in_use < self.slots and self.held[tenant] < self.tenant_slots_max:
            self._take(tenant)
            await trio.lowlevel.checkpoint()
            return
        queue = self._waiting.get(tenant)
        if queue is not None and len(queue) >= self.tenant_waiting_max:
            self.refused += 1
            raise Overloaded(f"this caller has {len(queue)} {self.what} waiting already: try again shortly",
                             code="media_busy", retry_after_s=1)
        waiter = _Waiter(tenant)
        self._waiting.setdefault(tenant, collections.deque()).append(waiter)
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():  # granted as it was cancelled: the slot goes on to the next
                self.release(tenant)
            else:
                queue = self._waiting[tenant]
                queue.remove(waiter)
                if not queue:
                    del self._waiting[tenant]
            raise

    def release(self, tenant: str | None) -> None:
        self.held[tenant] -= 1
        if not self.held[tenant]:
            del self.held[tenant]
        self.in_use -= 1
        self._hand_over()

    def _take(self, tenant: str | None) -> None:
        self.held[tenant] += 1
        self.in_use += 1

    def _hand_over(self) -> None:
        """Free slots to the next tenants in turn that have waiters and room under their share."""
        while self.in_use < self.slots:
            for tenant in self._waiting:
                if self.held[tenant] < self.tenant_slots_max:
                    break
            else:
                return
            queue = self._waiting.pop(tenant)
            waiter = queue.popleft()
            if queue:
                self._waiting[tenant] = queue  # to the end of the turn
            self._take(tenant)
            waiter.granted.set()

    def for_tenant(self, tenant: str | None) -> "_Borrow":
        """A limiter for ``trio.to_thread.run_sync(..., limiter=...)`` that takes this pool's slots for
        ``tenant``: released when the thread ends, so an abandoned thread still counts until it does."""
        return _Borrow(self, tenant)

    def slot(self, tenant: str | None) -> "_Slot":
        """``async with limiter.slot(tenant):`` holds one slot for the block."""
        return _Slot(self, tenant)


class _Borrow:
    __slots__ = ("limiter", "tenant")

    def __init__(self, limiter: FairLimiter, tenant: str | None) -> None:
        self.limiter = limiter
        self.tenant = tenant

    async def acquire_on_behalf_of(self, borrower: Any) -> None:
        await self.limiter.acquire(self.tenant)

    def release_on_behalf_of(self, borrower: Any) -> None:
        self.limiter.release(self.tenant)


class _Slot:
    __slots__ = ("limiter", "tenant")

    def __init__(self, limiter: FairLimiter, tenant: str | None) -> None:
        self.limiter = limiter
        self.tenant = tenant

    async def __aenter__(self) -> None:
        await self.limiter.acquire(self.tenant)

    async def __aexit__(self, *exc: Any) -> None:
        self.limiter.release(self.tenant)

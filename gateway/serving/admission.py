"""Admission control: at most ``max_concurrent_requests`` generations at once, a bounded queue, and no
tenant holding more than its share of either.

A request beyond the running limit waits in a FIFO queue; beyond ``queue_size`` waiting requests it
is refused at once (``Overloaded``: 429 with Retry-After); a request that waited ``queue_timeout_s``
without a slot is refused too (``NoCapacity``: 503 with Retry-After). A limit of 0 means unlimited.

Tenants. A request of an identified caller (a tenant, else its key: ``slot(tenant)``) counts against
its tenant's share: at most ``tenant_max_concurrent`` running and ``tenant_queue_max`` waiting (half
of each by default). A tenant at its share waits (or is refused, its queue share full) while other
tenants' requests go past it to free slots: one tenant's flood, background responses included, leaves
the other half of the slots and queue to everyone else. Requests of the open data plane (no
credentials: nobody to tell apart) take the shared path, limited only by the node's bounds.

Invariant: a slot is free only while every waiter's tenant is at its share, so a new request takes a
free slot at once when its own tenant is under its share, and ``_release`` hands a freed slot to the
first waiter (FIFO) whose tenant is under its share.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import trio

from ..base.errors import NoCapacity, Overloaded
from ..observe.metrics import counter, gauge
from ..base.options import Option


@dataclasses.dataclass(frozen=True)
class AdmissionConfig:
    # Generations running at once per gateway process; excess requests queue (0 = unlimited, smg's
    # default). Finite by default: each running request holds its prompt's ids, its stream and a
    # connection, so an unbounded number is an unbounded amount of memory. 256 is above what an engine
    # batches (SGLang and vLLM default to 256 running sequences) and far above what wrk at 64
    # connections needs.
    max_concurrent_requests: int = 256
    queue_size: int = 100
    queue_timeout_s: float = 60.0
    # Bodies above this are refused with 413 before being read. None (the default): sized for the
    # largest context the node serves, ModelCatalog.body_bytes_max_auto: 32 bytes per context token
    # (text runs ~4 characters per token; 32 leaves room for JSON escapes, multi-byte characters, tool
    # schemas and message framing), at least 1 MiB; 8 MiB while no model states its context. What a
    # request may cost beyond its body is bounded by its model's context too
    # (gateway.api.openai.check_prompt_chars); BENCHMARKS.md measures the ceiling.
    body_bytes_max: int | None = None
    # The whole request, queue wait included; smg's default is 30 minutes.
    request_timeout_s: float = 1800.0
    # One tenant's share of the running slots and of the queue (None: half of each, so that one tenant,
    # however many requests or background responses it sends, leaves half of the node to the others; two
    # tenants at their share fill it). Identified callers only (see the module docstring).
    tenant_max_concurrent: int | None = None
    tenant_queue_max: int | None = None

    def tenant_running_max(self) -> int:
        if self.tenant_max_concurrent is not None:
            return self.tenant_max_concurrent
        return math.ceil(self.max_concurrent_requests / 2) if self.max_concurrent_requests > 0 else 0

    def tenant_waiting_max(self) -> int:
        return self.tenant_queue_max if self.tenant_queue_max is not None else math.ceil(self.queue_size / 2)


@dataclasses.dataclass(eq=False)
class _Waiter:
    tenant: str | None
    granted: trio.Event = dataclasses.field(default_factory=trio.Event)


class Admission:
    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self._limit = config.max_concurrent_requests  # 0: unlimited
        self._tenant_running_max = config.tenant_running_max()  # 0: no share (unlimited)
        self._tenant_waiting_max = config.tenant_waiting_max()
        self.running = 0
        self.waiting = 0
        self.rejected_queue_full = 0
        self.rejected_queue_timeout = 0
        self.rejected_tenant_share = 0  # of the queue-full refusals: the tenant's share of the queue was full
        self._running_by: collections.Counter[str] = collections.Counter()
        self._waiting_by: collections.Counter[str] = collections.Counter()
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._idle = trio.Event()  # set while nothing runs or waits
        self._idle.set()
        self._slot = _Slot(self, None)

    def running_for(self, tenant: str) -> int:
        return self._running_by.get(tenant, 0)

    def _enter(self, tenant: str | None) -> None:
        self.running += 1
        if tenant is not None:
            self._running_by[tenant] += 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def _leave(self, tenant: str | None) -> None:
        self.running -= 1
        if tenant is not None:
            left = self._running_by[tenant] - 1
            if left:
                self._running_by[tenant] = left
            else:
                del self._running_by[tenant]
        if self.running == 0 and self.waiting == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no request runs or waits (for the drain at shutdown)."""
        await self._idle.wait()

    def slot(self, tenant: str | None = None) -> "_Slot":
        """``async with admission.slot(tenant):`` runs the block holding one of the running slots, counted
        against ``tenant``'s share (None: the shared path, for callers nobody can tell apart).

        Raises Overloaded (the queue, or the tenant's share of it, is full) or NoCapacity (waited too long).
        """
        return self._slot if tenant is None else _Slot(self, tenant)

    def _may_run(self, tenant: str | None) -> bool:
        if self._limit and self.running >= self._limit:
            return False
        return tenant is None or not self._tenant_running_max or self._running_by.get(tenant, 0) < \
            self._tenant_running_max

    async def _acquire(self, tenant: str | None) -> None:
        if self._may_run(tenant):
            self._enter(tenant)
            return
        if self.waiting >= self.config.queue_size:
            self.rejected_queue_full += 1
            raise Overloaded("too many requests in flight and the queue is full; retry later",
                             code="queue_full", retry_after_s=1)
        if tenant is not None and self._waiting_by[tenant] >= self._tenant_waiting_max:
            self.rejected_queue_full += 1
            self.rejected_tenant_share += 1
            raise Overloaded("this tenant has as many requests running and waiting as it may on this node; "
                             "retry later", code="queue_full", retry_after_s=1)
        waiter = _Waiter(tenant)
        self._waiters.append(waiter)
        self.waiting += 1
        if tenant is not None:
            self._waiting_by[tenant] += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            with trio.move_on_after(self.config.queue_timeout_s):
                await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():  # granted as the caller was cancelled: the slot goes to the next
                self._release(tenant)
            raise
        finally:
            self.waiting -= 1
            if tenant is not None:
                self._waiting_by[tenant] -= 1
                if not self._waiting_by[tenant]:
                    del self._waiting_by[tenant]
            if not waiter.granted.is_set():
                self._waiters.remove(waiter)
        if waiter.granted.is_set():
            return  # _grant entered the slot for it
        if self.running == 0 and self.waiting == 0:
            self._idle.set()
        self.rejected_queue_timeout += 1
        raise NoCapacity("timed out waiting for a free slot; retry later", code="queue_timeout",
                         retry_after_s=max(1, int(self.config.queue_timeout_s // 10)))

    def _release(self, tenant: str | None) -> None:
        self._leave(tenant)
        self._grant()

    def _grant(self) -> None:
        """Hands free slots to the first waiters whose tenant is under its share."""
        if not self._waiters:
            return
        for waiter in list(self._waiters):
            if self._limit and self.running >= self._limit:
                return
            if self._may_run(waiter.tenant):
                self._waiters.remove(waiter)
                self._enter(waiter.tenant)
                waiter.granted.set()

    def metric_families(self) -> Iterator[Any]:
        yield gauge("smg_requests_running", "Generations holding an admission slot", [], [([], float(self.running))])
        yield gauge("smg_requests_queued", "Requests waiting for an admission slot", [], [([], float(self.waiting))])
        yield counter("smg_requests_rejected", "Requests refused by admission", ["reason"],
                      [(["queue_full"], self.rejected_queue_full), (["queue_timeout"], self.rejected_queue_timeout)])


class _Slot:
    """The context manager of ``Admission.slot``. For the shared path one instance serves every request:
    a generator-based manager would cost a generator, its wrapper and trio's async-generator hooks on
    every request's path."""

    __slots__ = ("_admission", "_tenant")

    def __init__(self, admission: Admission, tenant: str | None) -> None:
        self._admission = admission
        self._tenant = tenant

    async def __aenter__(self) -> None:
        await self._admission._acquire(self._tenant)

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        self._admission._release(self._tenant)


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--max-concurrent-requests", "admission.max_concurrent_requests", int, "generations running at once; 0 = "
           "unlimited", "routing"),
    Option("--queue-size", "admission.queue_size", int, "requests waiting for a slot before 429", "routing"),
    Option("--max-concurrent-requests-per-tenant", "admission.tenant_max_concurrent", int, "generations one tenant "
           "(else key) may run at once per process (default: half of --max-concurrent-requests); also its "
           "background responses in progress", "routing"),
    Option("--queue-size-per-tenant", "admission.tenant_queue_max", int, "requests of one tenant that may wait for "
           "a slot (default: half of --queue-size)", "routing"),
    Option("--queue-timeout-secs", "admission.queue_timeout_s", float, "longest wait for a slot before 503", "routing"),
    Option("--request-timeout-secs", "admission.request_timeout_s", float, "longest a request may take", "http"),
    Option("--max-payload-size", "admission.body_bytes_max", int, "largest request body in bytes (default: 32 bytes "
           "per token of the largest context served, at least 1 MiB; 8 MiB without a stated context)", "http"),
)

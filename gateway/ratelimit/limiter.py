"""Cluster-wide rate limits: each key decided by its owner on the ring, replicated to the next owners.

Paths of a decision (``RateLimiter.check``):

* **owned** — this node is the key's ring owner: the decision is local (µs);
* **forwarded** — another node owns it: the item joins that owner's next
  batch (``peer.Batcher``) and the caller waits for its result;
* **local-first** (a limit with ``local_first = true``) — answered at once
  from this node's share (limit / known nodes); the hits are sent to the owner
  every ``sync_interval_s`` so its count stays the cluster's;
* **fallback** — the owner did not answer within ``forward_timeout_s``: the
  failure policy decides, and the owner is not asked again for
  ``unreachable_hold_s``. Admitted hits are kept as a debt and delivered to
  the key's owner (the same or a successor) when one answers.

Replication: every ``sync_interval_s`` the owner sends the state of the keys
it changed to their next ``replicas`` owners; a replica takes the owner's
state as is. After a ring change every node sends the keys it holds to their
new owners, where it is merged as a max (nothing is counted twice, nothing
lost). When an owner dies its successor is one of its replicas and continues
from the replicated state.

Membership seen by the owner changes the rate it applies (the ``failure
policy``, cluster-wide): let ``known`` be the members not left (alive,
suspected or dead: a failed member may be partitioned away and still serving)
and ``visible`` the alive ones.

* ``proportional`` (default): an owner applies ``limit * visible / known``;
  a node that cannot reach the owner admits up to ``limit / known``.
* ``open``: an owner applies the full limit; an unreachable owner's keys are
  admitted without a decision.
* ``closed``: an owner applies the full limit while it sees a majority of
  ``known``, and denies everything otherwise; an unreachable owner means deny.

Worst-case overshoot over a run (L = limit per second, B = burst, N = known
nodes, S = sync_interval_s, D = failure-detection time: probe interval plus
suspicion timeout, F = forward_timeout_s, P = partition duration):

* owner crash: ``proportional`` and ``closed``: L*S + B (the hits decided
  after the last replication are lost; a successor that was not a replica
  starts full); ``open``: L*D + L*S + B (every node admits freely until the
  crash is detected).
* partition in a side of k nodes without the owner, a side of N-k with it:
  ``proportional``: (k/N)*L*(D + F) + B — before detection the far side admits
  its share on top of the owner's full limit; after it, shares sum to L;
  ``open``: O*D + L*P + B, O the load offered to the far side (it admits
  everything until detection, then each side admits a full limit);
  ``closed``: L*M + B, M the time until the minority side suspects enough
  members to know it lost its majority (at most D; the majority denies until
  it has a ring of its own, then admits the full limit).
* local-first keys: shares sum to the limit, so only B (plus L*S when nodes
  join or leave and shares are recomputed).

``overshoot_bound`` evaluates these; the integration and simulation tests
check admitted counts against them.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import trio

from proto import ratelimit_pb2 as pb

from .algorithms import Decision, Mode, Rate
from .limits import IDENTITY_CHARS_MAX, FailurePolicy, Identity, LimitSet, LimitSpec, Unit
from .peer import (METHOD_DECIDE, METHOD_REPLICATE, RATE_LIMIT_MARK, BadRequest, Batcher, ItemError, PeerUnreachable,
                   PendingItem, add_decision, check_item, parse_request, rate_from_pb, state_from_pb, state_to_pb)
from .store import KeyStore
from ..observe.metrics import counter, gauge
from ..base.options import Option, secs_ms

log = logging.getLogger("gateway.ratelimit")


@dataclasses.dataclass(frozen=True)
class RateLimitConfig:
    # Extra wait before a batch leaves (gubernator's BatchWait is 500 µs). 0 sends at the next
    # scheduler tick: under load items gather anyway while the previous batch to the same owner
    # travels (at most batches_in_flight_max at once), and any timer costs at least 1 ms here
    # (the event loop's epoll timeout has millisecond resolution): measured, 0.8 ms vs 2.3 ms p50.
    batch_wait_s: float = 0.0
    batches_in_flight_max: int = 2
    # gubernator's BatchLimit: a batch this full is sent at once.
    batch_items_max: int = 1000
    # Beyond this the owner counts as unreachable and the failure policy decides. A loopback or LAN
    # answer takes ~1 ms; this caps what a dead or partitioned owner adds to a request.
    forward_timeout_s: float = 0.25
    # After a failed forward, go straight to the policy for this long instead of paying the timeout
    # on every request until the mesh declares the owner dead.
    unreachable_hold_s: float = 1.0
    # Replication and debt delivery round. Overshoot on an owner crash is limit * this (see above).
    sync_interval_s: float = 0.05
    # Copies beyond the owner. 2 survives two simultaneous failures among a key's owners.
    replicas: int = 2
    # Per node, owned plus replicated keys; the least recently used beyond it is forgotten.
    keys_max: int = 100_000
    # Idle keys (full allowance) are forgotten this often: they would restart exactly where they are.
    forget_idle_interval_s: float = 10.0
    # Headers carrying the tenant; the API key comes from Authorization.
    tenant_header: str = "x-smg-tenant"


class ClusterView(Protocol):
    """What the limiter needs from the mesh (``gateway.cluster.ClusterState`` provides it)."""

    node_name: str
    ring: Any  # mesh.ring.HashRing

    def member_counts(self) -> tuple[int, int]: ...  # (visible, known)
    def owners(self, key: str, count: int) -> list[str]: ...  # one per machine (HashRing.placement)
    async def request_peer(self, name: str, payload: bytes, timeout_s: float) -> bytes: ...  # PeerUnreachable
    def serve_requests(self, mark: bytes, handler: Callable[[bytes], Any]) -> None: ...


@dataclasses.dataclass
class KeyOutcome:
    spec: LimitSpec
    key: str
    hits: float
    decision: Decision
    path: str  # owned, forwarded, local_first, fallback


@dataclasses.dataclass
class Verdict:
    """The outcome of ``check``: allowed or not, and what to settle when the request ends."""

    allowed: bool
    outcomes: list[KeyOutcome]
    denied_by: KeyOutcome | None = None
    owner_unreachable: bool = False  # denied by the closed policy, not by the count

    def reserved(self) -> list[KeyOutcome]:
        """The outcomes that reserved an estimate (tokens, money), to settle with what was used."""
        return [o for o in self.outcomes if o.spec.unit is not Unit.REQUESTS and o.decision.allowed]


class RateLimiter:
    def __init__(self, config: RateLimitConfig, limits: LimitSet, node_name: str = "local",
                 cluster: ClusterView | None = None, metrics: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.limits = limits
        self.node_name = cluster.node_name if cluster is not None else node_name
        self.cluster = cluster
        self.metrics = metrics
        self.clock = clock
        self._work_arrived = trio.Event()  # see run(): set when a store or the debts stop being empty
        # owned and replicated keys
        self.store = KeyStore(config.keys_max, self._work_arrived_now, replicated=cluster is not None)
        # local-first and fallback shares: this node's own, never sent
        self.shares = KeyStore(config.keys_max, self._work_arrived_now, replicated=False)
        self._debts: dict[str, tuple[Rate, float]] = {}
        self._unreachable_until: dict[str, float] = {}
        self.batcher = Batcher(self.node_name, self._send_decide, config.batch_wait_s, config.batch_items_max,
                               self._observe_batch, config.batches_in_flight_max)
        self._nursery: trio.Nursery | None = None
        self._ring_seen: Any = None
        self.fallback_units = 0.0  # admitted without an owner's decision (the overshoot's raw material)
        self.debts_dropped = 0
        self.replicated = 0
        self.absorbed = 0
        self.replicating = 0  # replication requests sent and not answered yet
        if cluster is not None:
            cluster.serve_requests(RATE_LIMIT_MARK, self.on_peer_request)  # peers' R frames come here

    @property
    def active(self) -> bool:
        return bool(self.limits.limits)

    def set_limits(self, limits: LimitSet) -> None:
        self.limits = limits

    # -- the request path -------------------------------------------------

    def identity(self, authorization: str | None, tenant: str | None, model: str | None) -> Identity:
        """Without authentication: the presented bearer key (hashed) and the tenant header."""
        return Identity(Identity.hash_api_key(authorization), tenant[:IDENTITY_CHARS_MAX] if tenant else None, model)

    @staticmethod
    def principal_identity(key_id: str, tenant: str | None, model: str | None) -> Identity:
        """With authentication: the key's stable id (hashed as the others are) and its tenant."""
        return Identity(Identity.hash_api_key(key_id), tenant, model)

    async def check(self, identity: Identity, estimated_tokens: int) -> Verdict:
        """Decide every limit that applies; when one denies, give back what the others took."""
        wanted = self.wanted(identity, estimated_tokens)
        if not wanted:
            return Verdict(True, [])
        return await self.check_keys(wanted)

    def wanted(self, identity: Identity, estimated_tokens: int) -> "list[tuple[LimitSpec, str, float]]":
        """The counters (limit, key, hits) the limits in force take from a request of ``identity``."""
        wanted = []
        for spec in self.limits.limits:
            key = spec.key_for(identity)
            if key is not None:
                wanted.append((spec, key, 1.0 if spec.unit is Unit.REQUESTS else float(estimated_tokens)))
        return wanted

    async def check_keys(self, wanted: "list[tuple[LimitSpec, str, float]]") -> Verdict:
        """Decide the counters ``wanted`` names (a limit, its key, the hits), each by its owner as any limit's: the
        client's limits (``check``) and the counters other subsystems hold cluster-wide (a provider account's quota,
        gateway/providers/quotas.py). When one denies, what the others took is given back."""
        outcomes: list[KeyOutcome | None] = [None] * len(wanted)
        waits = []
        for i, (spec, key, hits) in enumerate(wanted):
            started = time.perf_counter()
            owner = self._owner(key)
            outcome = self._decide_now(spec, key, hits, owner)
            if outcome is not None:
                outcomes[i] = outcome
                self._observe(spec, outcome, time.perf_counter() - started)
            else:
                mode = Mode.FORCE if spec.counts_only else Mode.DECIDE
                batch, index = self.batcher.submit(owner, PendingItem(key, spec.rate, hits, mode))
                waits.append((i, owner, batch, index, started))
        for i, owner, batch, index, started in waits:
            spec, key, hits = wanted[i]
            await batch.done.wait()
            result = batch.results[index]
            if isinstance(result, Decision):
                outcome = KeyOutcome(spec, key, hits, result, "forwarded")
            elif isinstance(result, ItemError):
                # Our own item was refused (a peer running another version?): the policy decides.
                log.warning("the owner refused rate-limit key %s: %s", key, result)
                outcome = self._fallback(spec, key, hits)
            else:
                self._unreachable_until[owner] = trio.current_time() + self.config.unreachable_hold_s
                outcome = self._fallback(spec, key, hits)
            outcomes[i] = outcome
            self._observe(spec, outcome, time.perf_counter() - started)
        done = [o for o in outcomes if o is not None]
        refusals = [o for o in done if not o.decision.allowed]
        if not refusals:
            return Verdict(True, done)
        denied = max(refusals, key=lambda o: o.decision.retry_after_s)  # the wait that matters is the longest
        for outcome in done:
            if outcome.decision.allowed:
                self._adjust(outcome, -outcome.hits)
        return Verdict(False, done, denied, owner_unreachable=denied.path == "fallback" and
                       (denied.spec.failure_policy or self.limits.failure_policy) is FailurePolicy.CLOSED)

    def settle(self, verdict: Verdict, actual_tokens: int, actual_usd: float = 0.0) -> None:
        """The request ended (finished, failed or aborted): replace reservations (tokens, a budget's money) by what
        it really used."""
        for outcome in verdict.reserved():
            actual = float(actual_tokens) if outcome.spec.unit is Unit.TOKENS else actual_usd
            delta = actual - outcome.hits
            if abs(delta) >= 1e-9:
                self._adjust(outcome, delta)

    def refund_requests(self, verdict: Verdict) -> None:
        """The request was never sent (no connection to where it was going): give back the request it counted
        against each requests-per-window limit, as a refusal would not have counted it."""
        for outcome in verdict.outcomes:
            if outcome.spec.unit is Unit.REQUESTS and outcome.decision.allowed and outcome.hits > 0:
                self._adjust(outcome, -outcome.hits)

    def _decide_now(self, spec: LimitSpec, key: str, hits: float, owner: str) -> KeyOutcome | None:
        """A decision that needs no peer, or None (ask the owner)."""
        mode = Mode.FORCE if spec.counts_only else Mode.DECIDE
        if hits > spec.rate.capacity and mode is Mode.DECIDE:
            decision = Decision(False, spec.rate.limit, 0, 0, math.inf)  # no amount of waiting admits it
            return KeyOutcome(spec, key, hits, decision, "owned")
        if spec.local_first:
            decision = self.shares.decide(key, self._share_rate(spec.rate), self.clock(), hits, Mode.DECIDE)
            if decision.allowed:
                self._add_debt(key, spec.rate, hits)
            return KeyOutcome(spec, key, hits, decision, "local_first")
        if owner == self.node_name:
            return KeyOutcome(spec, key, hits, self.decide_owned(key, spec.rate, hits, mode), "owned")
        if self._unreachable_until.get(owner, -math.inf) > trio.current_time():
            return self._fallback(spec, key, hits)
        return None

    def _fallback(self, spec: LimitSpec, key: str, hits: float) -> KeyOutcome:
        policy = spec.failure_policy or self.limits.failure_policy
        if spec.counts_only:  # counted whatever happens: the owner gets the hits as a debt
            decision = Decision(True, spec.rate.limit, 0, 0, 0)
        elif policy is FailurePolicy.CLOSED:
            decision = Decision(False, spec.rate.limit, 0, 0, self.config.unreachable_hold_s)
        elif policy is FailurePolicy.OPEN:
            decision = Decision(True, spec.rate.limit, 0, 0, 0)
        else:
            decision = self.shares.decide(key, self._share_rate(spec.rate), self.clock(), hits, Mode.DECIDE)
        if decision.allowed:
            self.fallback_units += hits
            self._add_debt(key, spec.rate, hits)
        return KeyOutcome(spec, key, hits, decision, "fallback")

    def _adjust(self, outcome: KeyOutcome, delta: float) -> None:
        """Count ``delta`` more (or give back ``-delta``) on the key, wherever it was decided."""
        mode, amount = (Mode.FORCE, delta) if delta > 0 else (Mode.REFUND, -delta)
        key, rate = outcome.key, outcome.spec.rate
        if outcome.path in ("local_first", "fallback"):
            policy = outcome.spec.failure_policy or self.limits.failure_policy
            if outcome.path == "local_first" or policy is FailurePolicy.PROPORTIONAL:
                self.shares.decide(key, self._share_rate(rate), self.clock(), amount, mode)
            self._add_debt(key, rate, delta)
            return
        owner = self._owner(key)
        if owner == self.node_name:
            self.decide_owned(key, rate, amount, mode)
        elif self._nursery is not None:
            self.batcher.submit(owner, PendingItem(key, rate, amount, mode))  # fire and forget

    def _add_debt(self, key: str, rate: Rate, hits: float) -> None:
        debt = self._debts.get(key)
        if debt is None and len(self._debts) >= self.config.keys_max:
            self.debts_dropped += 1  # bounded like the stores: a long outage with many keys loses the excess
            return
        if not self._debts:
            self._work_arrived_now()
        self._debts[key] = (rate, (debt[1] if debt is not None else 0.0) + hits)

    # -- ownership and membership ------------------------------------------

    def _owner(self, key: str) -> str:
        if self.cluster is None:
            return self.node_name
        return self.cluster.ring.owner(key) or self.node_name

    def _counts(self) -> tuple[int, int]:
        if self.cluster is None:
            return 1, 1
        visible, known = self.cluster.member_counts()
        return max(1, visible), max(1, known, visible)

    def _share_rate(self, rate: Rate) -> Rate:
        _, known = self._counts()
        return dataclasses.replace(rate, limit=rate.limit / known, burst=max(1.0, rate.burst / known))

    def owner_fraction(self) -> float:
        """The share of each limit an owner applies given what it sees of the cluster (0: deny all)."""
        visible, known = self._counts()
        policy = self.limits.failure_policy
        if visible >= known or policy is FailurePolicy.OPEN:
            return 1.0
        if policy is FailurePolicy.CLOSED:
            return 1.0 if 2 * visible > known else 0.0
        return visible / known

    def decide_owned(self, key: str, rate: Rate, hits: float, mode: Mode, fraction: float | None = None) -> Decision:
        """A decision as the key's owner (also for items forwarded by peers).

        ``fraction``: ``owner_fraction()``, when the caller decides many items at once."""
        if fraction is None:
            fraction = self.owner_fraction()
        effective = rate if fraction == 1.0 else (None if fraction == 0.0 else dataclasses.replace(
            rate, limit=rate.limit * fraction, burst=max(1.0, rate.burst * fraction)))
        if effective is None:
            if mode is Mode.DECIDE:
                return Decision(False, rate.limit, 0, 0, self.config.unreachable_hold_s)
            effective = rate  # counting and refunds still apply
        return self.store.decide(key, effective, self.clock(), hits, mode)

    # -- serving peers ----------------------------------------------------

    async def on_peer_request(self, payload: bytes) -> bytes:
        """A peer's frame (after the ``R`` mark); the serialized answer."""
        try:
            method, request = parse_request(payload)
        except BadRequest as e:
            log.debug("dropped a peer's rate-limit request: %s", e)
            return b""
        if method == METHOD_DECIDE:
            return self._answer_decide(request).SerializeToString()
        return self._answer_replicate(request).SerializeToString()

    def _answer_decide(self, request: pb.DecideRequest) -> pb.DecideResponse:
        response = pb.DecideResponse()
        fraction = self.owner_fraction()
        for item in request.items:
            try:
                mode = check_item(item.key, item.hits, item.mode)
                add_decision(response, self.decide_owned(item.key, rate_from_pb(item.spec), item.hits, mode,
                                                         fraction))
            except ItemError as e:
                response.results.add(outcome=pb.OUTCOME_ERROR, error=str(e))
        return response

    def _answer_replicate(self, request: pb.ReplicateRequest) -> pb.ReplicateResponse:
        accepted = 0
        now = self.clock()
        for message in request.states:
            try:
                key, rate, state = state_from_pb(message)
            except ItemError:
                continue
            authoritative = request.sender == self._owner(key) and request.sender != self.node_name
            self.store.absorb(key, rate, state, now, authoritative)
            accepted += 1
        self.absorbed += accepted
        return pb.ReplicateResponse(accepted=accepted)

    async def _send_decide(self, owner: str, request: pb.DecideRequest) -> pb.DecideResponse:
        answer = await self._request(owner, METHOD_DECIDE + request.SerializeToString())
        response = pb.DecideResponse()
        try:
            response.ParseFromString(answer)
        except Exception as e:  # protobuf's DecodeError
            raise PeerUnreachable(f"{owner} answered something unreadable: {e}") from None
        return response

    async def _request(self, name: str, payload: bytes) -> bytes:
        if self.cluster is None:
            raise PeerUnreachable("no cluster")
        answer = await self.cluster.request_peer(name, RATE_LIMIT_MARK + payload,
                                                 self.config.forward_timeout_s)  # PeerUnreachable
        if not answer:
            raise PeerUnreachable(f"{name} refused the request")
        return answer

    # -- background: batches, replication, debts --------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.batcher.run)
            task_status.started()
            next_forget = trio.current_time() + self.config.forget_idle_interval_s
            while True:
                if self._holds_nothing():
                    # Nothing to replicate, hand over or deliver (no limits set, or no traffic
                    # since the keys were forgotten): sleep until there is, rather than waking
                    # every sync_interval_s on an idle node. A ring change meanwhile is seen at
                    # the next round; with nothing held there was nothing to hand over.
                    self._work_arrived = trio.Event()
                    await self._work_arrived.wait()
                await trio.sleep(self.config.sync_interval_s)
                self.sync_once(nursery)
                if trio.current_time() >= next_forget:
                    next_forget = trio.current_time() + self.config.forget_idle_interval_s
                    now = self.clock()
                    self.store.forget_idle(now)
                    self.shares.forget_idle(now)

    def _work_arrived_now(self) -> None:
        self._work_arrived.set()

    def _holds_nothing(self) -> bool:
        return not (len(self.store) or len(self.shares) or self._debts)

    def sync_once(self, nursery: trio.Nursery) -> None:
        """One round: replicate changed keys, hand keys over after a ring change, deliver debts."""
        if self.cluster is None:
            self._settle_debts_locally()
            return
        ring = self.cluster.ring
        if ring is not self._ring_seen:
            self._ring_seen = ring
            self.store.mark_all_dirty()
        outgoing: dict[str, list[pb.KeyState]] = collections.defaultdict(list)
        for key, entry in self.store.take_dirty():
            message = state_to_pb(key, entry.rate, entry.state)
            for name in self.cluster.owners(key, 1 + self.config.replicas):  # one per machine
                if name != self.node_name:
                    outgoing[name].append(message)
        for name, states in outgoing.items():
            self.replicating += 1  # counted before the task runs: pending never reads 0 between take and send
            nursery.start_soon(self._replicate, name, states)
        debts_by_owner: dict[str, list[PendingItem]] = collections.defaultdict(list)
        now_trio = trio.current_time()
        for key, (rate, hits) in list(self._debts.items()):
            owner = self._owner(key)
            if owner == self.node_name:
                self._apply_debt(key, rate, hits)
                del self._debts[key]
            elif self._unreachable_until.get(owner, -math.inf) <= now_trio:
                debts_by_owner[owner].append(PendingItem(key, rate, abs(hits), Mode.FORCE if hits > 0 else
                                                         Mode.REFUND))
                del self._debts[key]
        for owner, items in debts_by_owner.items():
            nursery.start_soon(self._deliver_debts, owner, items)

    def _settle_debts_locally(self) -> None:
        for key, (rate, hits) in self._debts.items():
            self._apply_debt(key, rate, hits)
        self._debts.clear()

    def _apply_debt(self, key: str, rate: Rate, hits: float) -> None:
        if hits > 0:
            self.decide_owned(key, rate, hits, Mode.FORCE)
        elif hits < 0:
            self.decide_owned(key, rate, -hits, Mode.REFUND)

    async def _replicate(self, name: str, states: list[pb.KeyState]) -> None:
        request = pb.ReplicateRequest(sender=self.node_name, states=states)
        try:
            await self._request(name, METHOD_REPLICATE + request.SerializeToString())
            self.replicated += len(states)
        except PeerUnreachable as e:
            log.debug("replication of %d keys to %s failed: %s", len(states), name, e)
        finally:
            self.replicating -= 1

    async def _deliver_debts(self, owner: str, items: list[PendingItem]) -> None:
        batches = [self.batcher.submit(owner, item) for item in items]
        for item, (batch, index) in zip(items, batches):
            await batch.done.wait()
            if isinstance(batch.results[index], PeerUnreachable):
                self._add_debt(item.key, item.rate, item.hits if item.mode is Mode.FORCE else -item.hits)

    # -- observability ----------------------------------------------------

    def _observe(self, spec: LimitSpec, outcome: KeyOutcome, elapsed_s: float) -> None:
        if self.metrics is None:
            return
        allowed = "allowed" if outcome.decision.allowed else "denied"
        label = f"fallback_{allowed}" if outcome.path == "fallback" else allowed
        self.metrics.rate_limit_decisions.labels(spec.name, label).inc()
        path = "forwarded" if outcome.path == "forwarded" else ("fallback" if outcome.path == "fallback" else "local")
        self.metrics.rate_limit_decision_duration.labels(path).observe(elapsed_s)

    def _observe_batch(self, size: int) -> None:
        if self.metrics is not None:
            self.metrics.rate_limit_batch_items.observe(size)

    def keys_owned(self) -> int:
        return sum(1 for key in self.store.keys() if self._owner(key) == self.node_name)

    def overshoot_bound(self, spec: LimitSpec, detection_s: float, known: int | None = None) -> float:
        """The documented worst case (units) of one owner crash or partition for ``spec``.

        ``known`` defaults to this node's current view of the cluster."""
        rate = spec.rate
        per_s = rate.limit / rate.window_s
        s, f = self.config.sync_interval_s, self.config.forward_timeout_s
        known = known if known is not None else self._counts()[1]
        policy = self.limits.failure_policy
        if spec.local_first:
            return rate.burst + per_s * s
        if policy is FailurePolicy.OPEN:
            return per_s * (detection_s + s) + rate.burst
        if policy is FailurePolicy.CLOSED:
            return per_s * max(s, detection_s) + rate.burst
        far_side = (known - 1) / known  # the largest side without the owner
        return max(per_s * s, far_side * per_s * (detection_s + f)) + rate.burst

    def statistics(self) -> dict[str, float]:
        return {"keys_owned": self.keys_owned(), "keys_held": len(self.store), "shares_held": len(self.shares),
                "debts": len(self._debts), "debts_dropped": self.debts_dropped, "fallback_units": self.fallback_units,
                "batches": self.batcher.stats.batches, "batched_items": self.batcher.stats.items,
                "failed_batches": self.batcher.stats.failed_batches, "replicated": self.replicated,
                "absorbed": self.absorbed, "evicted_busy": self.store.evicted_busy,
                "replication_pending": self.store.dirty_count() + self.replicating}

    def metric_families(self) -> Iterator[Any]:
        stats = self.statistics()
        yield gauge("smg_rate_limit_keys_owned", "Rate-limit keys this node owns on the ring", [],
                    [([], float(stats["keys_owned"]))])
        yield gauge("smg_rate_limit_keys_held", "Rate-limit keys this node holds (owned and replicated)", [],
                    [([], float(stats["keys_held"]))])
        yield counter("smg_rate_limit_forwarded_batches", "Batches of decisions forwarded to owners, by result",
                      ["result"], [(["sent"], stats["batches"]), (["failed"], stats["failed_batches"])])
        yield gauge("smg_rate_limit_replication_pending", "Rate-limit keys changed here and not yet copied to their "
                    "replicas, plus copies sent and not yet acknowledged: what an owner crash now would lose", [],
                    [([], float(stats["replication_pending"]))])
        yield counter("smg_rate_limit_fallback_units", "Units admitted by the failure policy without the owner's "
                      "decision: what an overshoot is made of", [], [([], stats["fallback_units"])])
        detection_s = 0.0
        if self.cluster is not None and getattr(self.cluster, "agent", None) is not None:
            mesh = self.cluster.agent.config
            detection_s = mesh.probe_interval_s + mesh.suspicion_timeout_s(max(1, len(self.cluster.ring)), 0)
        yield gauge("smg_rate_limit_overshoot_bound", "Documented worst-case overshoot (units) of one owner crash or "
                    "partition, for each limit, with this node's current view", ["limit"],
                    [([spec.name], self.overshoot_bound(spec, detection_s)) for spec in self.limits.limits])


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--rate-limits", "rate_limits_file", Path, "TOML file of rate limits ([[limits]]; see docs/cluster.md)",
           "ratelimits"),
    Option("--global-rate-limit", "global_rate_limit", float, "requests per second for the whole cluster",
           "ratelimits"),
    Option("--rate-limit-policy", "rate_limit_policy", str, "when a key's owner is unreachable: proportional "
           "(default), open or closed", "ratelimits"),
    Option("--rate-limit-batch-wait-ms", "rate_limit.batch_wait_s", secs_ms, "extra wait to coalesce forwarded "
           "decisions (default 0)", "ratelimits"),
    Option("--rate-limit-batch-max", "rate_limit.batch_items_max", int, "decisions per forwarded batch", "ratelimits"),
    Option("--rate-limit-sync-interval-ms", "rate_limit.sync_interval_s", secs_ms, "replication round", "ratelimits"),
    Option("--rate-limit-forward-timeout-ms", "rate_limit.forward_timeout_s", secs_ms, "owner silence before the "
           "failure policy decides", "ratelimits"),
    Option("--tenant-header", "rate_limit.tenant_header", str, "header naming the tenant (rate limits)", "ratelimits"),
)

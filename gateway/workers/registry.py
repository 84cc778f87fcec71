"""The node's workers (engines): registration, health checking, load polling, draining.

In a cluster, registrations replicate through ``Replication`` (the cluster's worker document),
and the document's changes come back through ``gateway.cluster.registry_sync``.

The registry decides which workers exist and their health; routing policies
only read ``Worker`` objects through ``candidates()``. Each worker has one
health task in the registry's nursery: every ``interval_s`` it asks the
engine's HealthCheck (gRPC) or GET ``endpoint`` (HTTP), and, for gRPC engines,
GetLoads; ``health.HealthTracker`` turns the checks into verdicts.

Removal drains: the worker leaves routing at once, its running requests
finish, then its connection is closed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

import httpx2
import trio

from ..engine.bridge import GrpcBridge
from ..engine.errors import EngineCallError
from ..engine.grpc_engine import GrpcEngineClient
from ..engine.http_worker import HttpWorkerClient
from ..net.http_client import HttpClient
from ..engine.pairing_info import PairingInfo
from ..observe.metrics import counter, gauge
from ..routing.breaker import BreakerConfig, CircuitBreaker
from ..routing.kv_index import KvIndex
from .errors import WorkerExists, WorkerHostRefused, WorkerUnknown, WorkerUnreachable, WorkerUrlInvalid
from .health import HealthConfig, HealthTracker, Verdict
from .kv_following import follow_while_needed
from .pairing import DECODE, PREFILL, REGULAR, role_conflict
from .origin import WorkerAllowlist, WorkerNotAllowed, WorkerUrlError, parse_worker_origin
from .worker import Worker, load_bucket, worker_id_for

log = logging.getLogger("gateway.workers")

def parse_worker_url(url: str, allowlist: WorkerAllowlist | None = None) -> tuple[str, str, str]:
    """(kind, target, canonical URL): ("grpc", "host:port", ...) or ("http", "http://host:port", ...).

    Only origins (``origin.py``); a host outside the allowlist is ``WorkerHostRefused``.
    """
    try:
        origin = parse_worker_origin(url)
        if allowlist is not None:
            allowlist.check(origin)
    except WorkerUrlError as e:
        raise WorkerUrlInvalid(f"worker URL {url!r}: {e}") from None
    except WorkerNotAllowed as e:
        raise WorkerHostRefused(str(e)) from None
    target = origin.grpc_target if origin.kind == "grpc" else origin.url
    return origin.kind, target, origin.url


class Replication(Protocol):
    """What the registry asks of the cluster (``gateway.cluster.ClusterState``): replicate registrations,
    and say who health-checks each worker (its ring owner) and what the owner found."""

    node_name: str

    @property
    def ring_changed(self) -> trio.Event: ...

    def register(self, worker_id: str, spec: dict[str, Any]) -> None: ...

    def remove(self, worker_id: str) -> None: ...

    def owns(self, worker_id: str) -> bool: ...

    def health_of(self, worker_id: str) -> dict[str, Any] | None: ...

    def set_health(self, worker_id: str, health: dict[str, Any]) -> None: ...


class KvFollowers(Protocol):
    """Who follows an engine's KV events in a cluster (``gateway.cluster.KvSharing``), and where what this
    node applied goes."""

    def is_owner(self, engine_id: str) -> bool: ...

    def published(self, engine_id: str, sequence: int, ops: list, snapshot: bool, block_size: int) -> None: ...


# (kind, target, canonical URL, model override, the worker's own key) -> (client, models, context tokens)
Connect = Callable[[str, str, str, "str | None", "str | None"], Awaitable[tuple[Any, tuple[str, ...], "int | None"]]]


class WorkerRegistry:
    def __init__(self, bridge: GrpcBridge, http_client: httpx2.AsyncClient, health: HealthConfig,
                 breaker: BreakerConfig, nursery: trio.Nursery, kv_index: KvIndex | None = None,
                 cluster: Replication | None = None, kv_events_always: bool = False,
                 allowlist: WorkerAllowlist | None = None, kv_sharing: KvFollowers | None = None,
                 connect: Connect | None = None, relay: HttpClient | None = None, encoders: Any = None) -> None:
        self._bridge = bridge
        self._encoders = encoders  # TokenSpeed's encode workers (engine/encode_workers.py), given to its engines
        self._relay = relay  # HTTP workers' requests go through it (their health and models through http_client)
        self._allowlist = allowlist
        self._http = http_client
        # How a worker's client is made; the simulated cluster (tests/sim) passes clients of its own.
        self._connect = connect or self._connect_for_real
        self.kv_sharing = kv_sharing
        self.health_config = health
        self.breaker_config = breaker
        self._nursery = nursery
        self._workers: dict[str, Worker] = {}
        # When set, gRPC engines' KV events are followed into it (cache_aware reads it): those of an
        # engine that shares a model with another engine, or of every engine with kv_events_always.
        self.kv_index = kv_index
        self.kv_events_always = kv_events_always
        # When set, registrations replicate to every node and health checks go to ring owners.
        self.cluster = cluster
        self.on_removed: list[Any] = []  # callbacks(worker_id): policies forget what they learnt
        self.changed = trio.Event()
        self.pd_workers = 0  # prefill and decode workers registered: routing looks for pairs only when some are
        # When routing last asked for candidates, and whether the load polls stopped since (HealthConfig.load_idle_s);
        # routing again sets routing_resumed, which wakes them.
        self.routed_at = trio.current_time()
        self.loads_quiet = False
        self.routing_resumed = trio.Event()

    def __len__(self) -> int:
        return len(self._workers)

    def get(self, worker_id: str) -> Worker | None:
        return self._workers.get(worker_id)

    def all(self) -> list[Worker]:
        return list(self._workers.values())

    def candidates(self, model: str | None, now: float, kind: str | None = None, role: str = REGULAR) -> list[Worker]:
        """Workers of ``role`` that can take an attempt now: a prefill or decode worker never serves alone."""
        self.routed_at = now
        if self.loads_quiet:
            self._resume_load_polls()
        return [w for w in self._workers.values()
                if w.available(now) and (model is None or model in w.models) and (kind is None or w.kind == kind)
                and w.role == role]

    def disaggregated(self, model: str) -> "tuple[list[Worker], list[Worker]] | None":
        """The model's registered (not draining) prefill and decode workers, healthy or not; None when it has
        neither, as every model has unless prefill/decode workers were registered (the plain path's test)."""
        if not self.pd_workers:
            return None
        prefill = [w for w in self._workers.values() if w.role == PREFILL and not w.draining and model in w.models]
        decode = [w for w in self._workers.values() if w.role == DECODE and not w.draining and model in w.models]
        return (prefill, decode) if prefill or decode else None

    def models(self) -> dict[str, list[Worker]]:
        out: dict[str, list[Worker]] = {}
        for w in self._workers.values():
            if w.draining:
                continue
            for m in w.models:
                out.setdefault(m, []).append(w)
        return out

    def describe(self, worker: Worker, now: float) -> dict[str, Any]:
        out = worker.describe(now)
        if self.kv_index is not None and worker.client.publishes_kv_events:
            out["kv_index"] = {"blocks": self.kv_index.block_count(worker.id),
                               "next_sequence": self.kv_index.next_sequence(worker.id),
                               "fingerprint": self.kv_index.fingerprint(worker.id),
                               "orphans": self.kv_index.orphans(worker.id),
                               "needed": self.kv_events_needed(worker),
                               "following": worker.kv_following,
                               "unsupported": worker.kv_events_unsupported}
        return out

    def kv_events_needed(self, worker: Worker) -> bool:
        """Whether routing reads this engine's KV events: another gRPC engine serves one of its models.

        An engine alone with its models leaves routing no choice, and following its events would cost
        ~3 ms of CPU per 7,800-token prompt (decoding and indexing ~490 stored blocks and as many
        evicted ones) for nothing. When a second engine joins, the subscription resumes from the index's
        cursor and the engine replays what it kept or sends a snapshot of what it holds
        (SubscribeKvEvents), so the index is whole again before it matters.
        """
        if self.kv_events_always:
            return True
        if worker.draining:
            return False
        return any(other is not worker and other.client.publishes_kv_events and not other.draining
                   and any(model in other.models for model in worker.models) for other in self._workers.values())

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def add(self, url: str, labels: dict[str, str] | None = None, model: str | None = None,
                  replicate: bool = True, api_key: str | None = None, role: str = REGULAR,
                  bootstrap_port: int | None = None, from_flags: bool = False) -> Worker:
        """Connect to a worker and route to it once a health check passed; with a cluster, every node
        then does the same. ``role`` prefill or decode: one half of a disaggregated pair (pairing.py).
        ``from_flags``: named by this node's command line (it retracts the worker at a later start whose flags no
        longer name it: ``retract_unnamed``)."""
        kind, target, url = parse_worker_url(url, self._allowlist)
        if role != REGULAR and kind != "grpc":
            raise WorkerUrlInvalid(f"worker {url}: prefill and decode workers are gRPC engines (grpc://host:port)")
        wid = worker_id_for(url)
        if wid in self._workers and not self._workers[wid].draining:
            raise WorkerExists(f"worker {url} is already registered as {wid}")
        try:
            client, models, context = await self._connect(kind, target, url, model, api_key)
        except EngineCallError as e:
            # UNIMPLEMENTED: something answers there, but not an engine's services.
            error = WorkerUrlInvalid if e.code == "UNIMPLEMENTED" else WorkerUnreachable
            raise error(f"cannot reach worker {url}: {e}") from None
        if not models:
            raise WorkerUrlInvalid(f"worker {url} serves no model")
        pairing = PairingInfo()
        if role != REGULAR and client.handover is None:
            await client.aclose()
            raise WorkerUrlInvalid(f"worker {url} cannot be registered as {role}: a {client.runtime_name} engine has "
                                   "no prefill/decode legs")
        if role != REGULAR:
            try:
                pairing = await client.pairing_info(self.health_config.timeout_s)
            except EngineCallError as e:
                await client.aclose()
                raise WorkerUnreachable(f"cannot ask worker {url} how it disaggregates (GetServerInfo): {e}") from None
            conflict = role_conflict(role, pairing)
            if conflict is not None:
                await client.aclose()
                raise WorkerUrlInvalid(f"worker {url} cannot be registered as {role}: {conflict}")
        # Not healthy until a health check passed: answering GetModelInfo (or /v1/models) is not the
        # engine saying it can serve. With checks off, what answered is taken as healthy.
        healthy = await self._passes_check(wid, client) if self.health_config.enabled else True
        worker = Worker(url, client, models, context, CircuitBreaker(self.breaker_config), labels or {},
                        HealthTracker(self.health_config, healthy, trio.current_time()), role, bootstrap_port, pairing)
        if wid in self._workers and not self._workers[wid].draining:  # added meanwhile (the check awaited)
            raise WorkerExists(f"worker {url} is already registered as {wid}")
        replaced = self._workers.get(wid)
        if replaced is not None and replaced.role != REGULAR:
            self.pd_workers -= 1  # a draining one, replaced: counted once
        self._workers[wid] = worker
        if role != REGULAR:
            self.pd_workers += 1
        if self.health_config.enabled:
            self._nursery.start_soon(self._watch, worker)
        if self.kv_index is not None and client.publishes_kv_events:
            self._nursery.start_soon(self._follow_kv_events, worker)
        log.info("worker %s added: %s %s models=%s%s", wid, kind, url, ",".join(models),
                 f" role={role}" + (f" bootstrap_port={bootstrap_port}" if bootstrap_port else "") if role != REGULAR
                 else "")
        if self.cluster is not None and replicate:
            # The worker's key goes to the other nodes (the mesh's sealed document) so that they can use
            # it; it is never shown (describe) nor logged.
            self.cluster.register(wid, {"url": url, "labels": labels or {}, "model": model,
                                        **({"api_key": api_key} if api_key else {}),
                                        **({"flags": True} if from_flags else {}),
                                        **({"worker_type": role, "bootstrap_port": bootstrap_port}
                                           if role != REGULAR else {})})
        self._notify()
        return worker

    async def _connect_for_real(self, kind: str, target: str, url: str, model: str | None,
                                api_key: str | None) -> tuple[Any, tuple[str, ...], int | None]:
        timeout_s = self.health_config.timeout_s
        if kind == "grpc":
            client: Any = await GrpcEngineClient.detect(self._bridge, target, timeout_s)
            if client.runtime.encode_workers:
                client.encoders = self._encoders
            info = await client.model_info(timeout_s)
            return client, (model or info.served_model_name,), info.max_context_tokens or None
        client = HttpWorkerClient(target, self._http, api_key, self.health_config.endpoint, self._relay)
        return client, (model,) if model else tuple(await client.models(timeout_s)), None

    async def remove(self, worker_id: str, drain_timeout_s: float = 300.0, replicate: bool = True) -> Worker:
        """Take the worker out of routing now; forget it once its requests finished."""
        worker = self._workers.get(worker_id)
        if worker is None or worker.draining:
            raise WorkerUnknown(f"no worker {worker_id}")
        if self.cluster is not None and replicate:
            self.cluster.remove(worker_id)
        worker.draining = True
        self._notify()
        self._nursery.start_soon(self._drain, worker, drain_timeout_s)
        return worker

    async def _follow_kv_events(self, worker: Worker) -> None:
        sharing = self.kv_sharing

        def should_follow(w: Worker) -> bool:
            return self.kv_events_needed(w) and (sharing is None or sharing.is_owner(w.id))

        await follow_while_needed(worker, self.kv_index, should_follow, self._change_announcers,
                                  sharing.published if sharing is not None else None)

    def _change_announcers(self) -> "list[trio.Event]":
        events = [self.changed]
        if self.cluster is not None:
            events.append(self.cluster.ring_changed)
        return events

    async def _drain(self, worker: Worker, timeout_s: float) -> None:
        with trio.move_on_after(timeout_s):
            await worker.idle.wait()
        for scope in (worker.cancel_scope, worker.kv_scope):
            if scope is not None:
                scope.cancel()
        replaced = self._workers.get(worker.id) not in (None, worker)
        if replaced:
            # Registered again while it drained: the new one owns the id, its KV index and its channel.
            log.info("worker %s drained; it was registered again meanwhile", worker.id)
            return
        if self.kv_index is not None:
            self.kv_index.remove_engine(worker.id)
        self._workers.pop(worker.id, None)
        if worker.role != REGULAR:
            self.pd_workers -= 1
        for callback in self.on_removed:
            callback(worker.id)
        await worker.client.aclose()
        log.info("worker %s removed (%d requests still running)", worker.id, worker.in_flight)
        self._notify()

    def _resume_load_polls(self) -> None:
        self.loads_quiet = False
        self.routing_resumed.set()
        self.routing_resumed = trio.Event()

    def _routing_idle(self, now: float) -> bool:
        """True when nothing was routed for ``load_idle_s``: the load polls stop until routing asks again."""
        if now - self.routed_at < self.health_config.load_idle_s:
            return False
        self.loads_quiet = True
        return True

    async def _watch(self, worker: Worker) -> None:
        cfg = self.health_config
        with trio.CancelScope() as scope:
            worker.cancel_scope = scope
            next_health = trio.current_time()
            while True:
                now = trio.current_time()
                if now >= next_health:
                    await self._check_health(worker)
                    next_health = now + cfg.interval_s
                reports_load = False
                if worker.healthy and cfg.load_interval_s > 0 and self._routing_idle(trio.current_time()):
                    worker.set_engine_load(None)  # stale from here: policies count the node's own requests
                    resumed = self.routing_resumed
                    with trio.move_on_at(next_health):
                        await resumed.wait()
                    continue
                if worker.healthy and cfg.load_interval_s > 0:
                    try:
                        load = await worker.client.loads(cfg.timeout_s)
                        reports_load = load is not None
                        worker.set_engine_load(load)
                    except EngineCallError:
                        worker.engine_load = None  # unknown: policies fall back to our own count
                        reports_load = True
                if reports_load:
                    await trio.sleep(min(cfg.load_interval_s, max(0.0, next_health - trio.current_time())))
                else:
                    await trio.sleep_until(next_health)

    async def _passes_check(self, worker_id: str, client: Any) -> bool:
        try:
            return await client.health(self.health_config.timeout_s)
        except EngineCallError as e:
            log.debug("health check of %s failed: %s", worker_id, e)
            return False

    async def _check_health(self, worker: Worker) -> None:
        cluster = self.cluster
        if cluster is not None and not cluster.owns(worker.id):
            # Another node owns this worker's health checks: take its verdict.
            owners = cluster.health_of(worker.id)
            if owners is not None:
                worker.checked_by = owners.get("by")
                now = trio.current_time()
                verdict = worker.health.adopt(bool(owners.get("healthy")), now)
                if verdict is not Verdict.UNCHANGED:
                    log.info("worker %s is %s (checked by %s)", worker.id,
                             "healthy" if worker.healthy else "unhealthy", owners.get("by"))
                    if verdict is Verdict.BECAME_HEALTHY:
                        worker.breaker.health_recovered(now)
                    self._notify()
            return
        ok = await self._passes_check(worker.id, worker.client)
        now = trio.current_time()
        verdict = worker.health.record(ok, now)
        if verdict is Verdict.BECAME_HEALTHY:
            log.info("worker %s is healthy again", worker.id)
            worker.breaker.health_recovered(now)
            self._notify()
        elif verdict is Verdict.BECAME_UNHEALTHY:
            log.warning("worker %s is unhealthy after %d failed checks", worker.id, worker.health.failures)
            self._notify()
        if cluster is not None:
            worker.checked_by = cluster.node_name
            cluster.set_health(worker.id, {"healthy": worker.healthy,
                                           "circuit": worker.breaker.current_state(trio.current_time()).name.lower(),
                                           "load": load_bucket(worker)})

    def metric_families(self) -> Iterator[Any]:
        now = trio.current_time()
        workers = self.all()
        yield gauge("smg_worker_healthy", "1 when the worker passes health checks", ["worker", "url"],
                    [([w.id, w.url], 1.0 if w.healthy else 0.0) for w in workers])
        yield gauge("smg_circuit_breaker_state", "0 closed, 1 open, 2 half-open", ["worker"],
                    [([w.id], float(w.breaker.current_state(now).value)) for w in workers])
        yield gauge("smg_worker_in_flight", "Requests this node has on the worker", ["worker"],
                    [([w.id], float(w.in_flight)) for w in workers])
        kv = self.kv_index
        if kv is not None:
            yield gauge("smg_kv_index_blocks", "Blocks the KV index holds per engine", ["worker"],
                        [([w.id], float(kv.block_count(w.id))) for w in workers])
            yield counter("smg_kv_index_block_events", "KV index block changes", ["kind"],
                          [(["inserted"], kv.inserted), (["removed"], kv.removed), (["evicted"], kv.evicted)])


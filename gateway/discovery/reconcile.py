"""The discovered engines into service: added as their pods become Ready, drained as they go.

Alone (no mesh), the node's registry is changed directly. In a cluster every node watches the API server,
but each pod's worker entry in the cluster's document is written by one node only: the owner of the
worker's id on a ring of the members whose watches are live (each says so in its ``k8s-watch`` mesh tag).
Every node then follows the document as it does for workers registered by hand (registry_sync.py). One
writer per entry keeps the document to one entry per pod and keeps it from flapping when two nodes'
watches disagree for a moment (one saw a pod leave before the other): no two nodes write the same entry
from different views. A node cut off from the API server (its watches failing) says ``stale``, leaves the
ring of writers, keeps what it has and follows the document: its old view cannot undo what the others wrote
while it was away, and its share of the pods passes to the nodes that still see the API server.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mesh.members import MemberStatus
from mesh.ring import HashRing

from ..workers import Worker, WorkerError, WorkerRegistry
from ..workers.pairing import REGULAR
from ..workers.worker import worker_id_for
from .config import DiscoveryConfig
from .pods import DiscoveredWorker, desired_workers
from .watch import PodWatcher

log = logging.getLogger("gateway.discovery")

# The document key marking an entry as discovery's (the pod, namespace/name): only such entries are removed
# when their pod goes; workers registered by hand are never touched.
DISCOVERED_KEY = "discovered"
# The mesh tag saying whether a member's watches are live ("live") or not ("stale"): the writers' ring.
WATCH_TAG = "k8s-watch"


def document_spec(worker: DiscoveredWorker) -> dict[str, Any]:
    spec: dict[str, Any] = {"url": worker.url, "labels": {"pod": worker.pod}, "model": worker.model,
                            DISCOVERED_KEY: worker.pod}
    if worker.role != REGULAR:
        spec.update(worker_type=worker.role, bootstrap_port=worker.bootstrap_port)
    return spec


def _same(entry: dict[str, Any], spec: dict[str, Any]) -> bool:
    return all(entry.get(k) == v for k, v in spec.items()) and \
        entry.get("worker_type", REGULAR) == spec.get("worker_type", REGULAR)


class DiscoveredWorkers:
    def __init__(self, config: DiscoveryConfig, registry: WorkerRegistry, watchers: "list[tuple[str, PodWatcher]]",
                 cluster: Any = None, on_added: "Callable[[Worker], Awaitable[None]] | None" = None) -> None:
        self.config = config
        self.registry = registry
        self.watchers = watchers
        self.cluster = cluster
        self.on_added = on_added
        self.changed = trio.Event()
        self.managed: dict[str, DiscoveredWorker] = {}  # alone: worker id -> what discovery added
        self.discovered = 0  # serving pods the watches see now
        self.registrations = 0
        self.deregistrations = 0
        self.failed_registrations = 0
        self._listening = False

    def poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    @property
    def synced(self) -> bool:
        return all(w.cache.synced for _, w in self.watchers)

    @property
    def live(self) -> bool:
        return all(w.live for _, w in self.watchers)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            if self.cluster is not None:
                nursery.start_soon(self._poke_on_ring_change)
            while True:
                changed = self.changed
                await self.reconcile()
                # Also at an interval: engines that did not answer yet are tried again.
                with trio.move_on_after(self.config.retry_add_interval_s):
                    await changed.wait()

    async def _poke_on_ring_change(self) -> None:
        while True:
            await self.cluster.ring_changed.wait()
            self.poke()

    async def reconcile(self) -> None:
        agent = self.cluster.agent if self.cluster is not None else None
        if agent is not None and not self._listening:  # the mesh starts after the gateway: followed once it is up
            agent.listeners.append(lambda member, previous: self.poke())  # a peer's watch went live or stale
            self._listening = True
        if not self.synced:
            return  # before the first list, absence means nothing
        desired = desired_workers([(role, w.cache) for role, w in self.watchers], self.config)
        self.discovered = len(desired)
        if self.cluster is None:
            await self._apply_here(desired)
            return
        self._announce()
        # Only once the node holds the cluster's document (or knows it is alone): before that it would write again
        # what the others already wrote, and count as a writer it does not know the others of yet.
        if self.live and self.cluster.registry_received:
            self._write_document(desired, self._writers())

    def _announce(self) -> None:
        agent = self.cluster.agent
        state = "live" if self.live else "stale"
        if agent is not None and agent.tags.get(WATCH_TAG) != state:
            agent.set_tags({**agent.tags, WATCH_TAG: state})

    def _writers(self) -> HashRing:
        """The ring of members that write discovered entries: this one (live) and every member saying live."""
        names = {self.cluster.node_name}
        if self.cluster.agent is not None:
            names.update(m.name for m in self.cluster.agent.members()
                         if m.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT) and m.tags.get(WATCH_TAG) == "live")
        return HashRing.build(sorted(names))

    async def _apply_here(self, desired: "dict[str, DiscoveredWorker]") -> None:
        wanted = {worker_id_for(w.url): w for w in desired.values()}
        for wid, was in list(self.managed.items()):
            current = self.registry.get(wid)
            if wanted.get(wid) != was or current is None or current.draining:
                del self.managed[wid]
                if current is not None and not current.draining:
                    log.info("pod %s: %s no longer serves (deleted, not Ready or relabelled): draining it",
                             was.pod, was.url)
                    await self.registry.remove(wid, replicate=False)
                    self.deregistrations += 1
        async with trio.open_nursery() as adding:  # one engine slow to answer does not hold the others back
            for wid, worker in wanted.items():
                current = self.registry.get(wid)
                if current is None or current.draining:
                    adding.start_soon(self._add_here, wid, worker)

    async def _add_here(self, wid: str, worker: DiscoveredWorker) -> None:
        try:
            added = await self.registry.add(worker.url, {"pod": worker.pod}, worker.model, replicate=False,
                                            role=worker.role, bootstrap_port=worker.bootstrap_port)
        except WorkerError as e:
            self.failed_registrations += 1
            log.warning("pod %s: engine %s not added yet: %s", worker.pod, worker.url, e)
            return
        self.managed[wid] = worker
        self.registrations += 1
        log.info("pod %s: engine %s added as %s", worker.pod, worker.url, worker.role)
        if self.on_added is not None:
            await self.on_added(added)

    def _write_document(self, desired: "dict[str, DiscoveredWorker]", writers: HashRing) -> None:
        listed = self.cluster.doc.workers()
        wanted = {worker_id_for(w.url): w for w in desired.values()}
        me = self.cluster.node_name
        for wid, worker in wanted.items():
            if writers.owner(wid) != me:
                continue
            spec = document_spec(worker)
            entry = listed.get(wid)
            if entry is None or not _same(entry, spec):
                log.info("pod %s: engine %s serves (%s): written to the cluster's workers", worker.pod, worker.url,
                         worker.role)
                self.cluster.register(wid, spec)
                self.registrations += 1
        for wid, entry in listed.items():
            if entry.get(DISCOVERED_KEY) and wid not in wanted and writers.owner(wid) == me:
                log.info("pod %s: %s no longer serves: removed from the cluster's workers (drained everywhere)",
                         entry.get(DISCOVERED_KEY), entry.get("url"))
                self.cluster.remove(wid)
                self.deregistrations += 1

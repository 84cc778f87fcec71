"""Every node's registry follows the cluster's worker document: it adds what the document lists and
drains what it no longer does.

Draining is decided by ``AbsenceRule`` (pure, on passed-in time): a worker the document marks
removed (a tombstone, written by the node where someone removed it) is drained at once; one that
is only missing is kept for ``grace_s`` first. An entry can be missing for a moment while
documents merge (seen after a node restarts under its old name: pycrdt applies an overwrite's
deletion at once but holds the new value back until the updates it depends on arrive), and
draining for that would reset the worker everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio

from ..workers import Worker, WorkerError, WorkerRegistry, WorkerUrlInvalid
from ..workers.pairing import REGULAR, ROLES
from .state import ClusterState

log = logging.getLogger("gateway.cluster")

# A worker missing from the cluster document (no tombstone) is drained only after this long.
ABSENT_WORKER_GRACE_S = 30.0


class AbsenceRule:
    """Which local workers to drain, given what the document lists; remembers since when each is missing."""

    def __init__(self, grace_s: float = ABSENT_WORKER_GRACE_S) -> None:
        self.grace_s = grace_s
        self.absent_since: dict[str, float] = {}

    def to_drain(self, local: Iterable[str], listed: "set[str] | dict[str, Any]", tombstoned: Callable[[str], bool],
                 now: float) -> list[str]:
        """``local``: ids of this node's workers not draining yet."""
        drain = []
        local = list(local)
        for wid in local:
            if wid in listed:
                self.absent_since.pop(wid, None)
                continue
            if tombstoned(wid):
                self.absent_since.pop(wid, None)
                drain.append(wid)
                continue
            if wid not in self.absent_since:
                log.info("worker %s is missing from the cluster document: kept for up to %.0f s", wid, self.grace_s)
            if now - self.absent_since.setdefault(wid, now) >= self.grace_s:
                self.absent_since.pop(wid, None)
                drain.append(wid)
        for wid in set(self.absent_since) - set(local):  # drained or gone meanwhile: forget it
            self.absent_since.pop(wid)
        return drain


def spec_role(spec: dict[str, Any]) -> "tuple[str, int | None]":
    """(worker_type, bootstrap_port) of a document entry, checked: a peer's values are bounded like a client's."""
    role = spec.get("worker_type", REGULAR)
    port = spec.get("bootstrap_port")
    if role not in ROLES:
        raise WorkerUrlInvalid(f"worker_type {role!r} is none of {', '.join(ROLES)}")
    if port is not None and (type(port) is not int or not 0 < port < 65536):
        raise WorkerUrlInvalid(f"bootstrap_port {port!r} is not a port")
    return role, port


def _role_changed(worker: Worker, spec: dict[str, Any]) -> bool:
    try:
        return spec_role(spec) != (worker.role, worker.bootstrap_port)
    except WorkerUrlInvalid:
        return False  # an entry that cannot be read is not acted on (add() below says why)


async def follow_worker_document(registry: WorkerRegistry, cluster: ClusterState,
                                 on_added: "Callable[[Worker], Awaitable[None]] | None" = None,
                                 rule: AbsenceRule | None = None) -> None:
    """Runs for the node's life: reconcile whenever the document changes, and at least every health
    interval (which also retries workers that could not be reached from here yet)."""
    rule = rule or AbsenceRule()
    while True:
        changed = cluster.changed
        received = cluster.registry_received
        listed = cluster.doc.workers()
        for wid, spec in listed.items():
            current = registry.get(wid)
            if current is not None and not current.draining and _role_changed(current, spec):
                # Registered again in another role (a relabelled pod): drained, then added as the document says.
                log.info("worker %s is now %s in the cluster document: draining it to add it again", wid,
                         spec.get("worker_type", REGULAR))
                await registry.remove(wid, replicate=False)
                current = registry.get(wid)
            if current is None or current.draining:
                try:
                    role, bootstrap_port = spec_role(spec)
                    worker = await registry.add(spec["url"], spec.get("labels") or {}, spec.get("model"),
                                                replicate=False, api_key=spec.get("api_key"), role=role,
                                                bootstrap_port=bootstrap_port)
                    if on_added is not None:
                        await on_added(worker)
                except WorkerError as e:
                    log.warning("cluster worker %s not usable from here yet: %s", spec.get("url"), e)

        if received:
            cluster.registry_applied = True  # every worker the received document lists was registered or tried

        def tombstoned(wid: str) -> bool:
            entry = cluster.doc.get("workers", wid)
            return entry is not None and bool(entry.get("removed"))

        local = [w.id for w in registry.all() if not w.draining]
        for wid in rule.to_drain(local, listed, tombstoned, trio.current_time()):
            log.info("worker %s was removed on another node: draining it here", wid)
            await registry.remove(wid, replicate=False)
        with trio.move_on_after(registry.health_config.interval_s):
            await changed.wait()

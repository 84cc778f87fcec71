"""What ``serve --service-discovery`` runs: a watch per selector, the reconciler, and their metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

from ..observe.metrics import counter, gauge
from ..workers import Worker, WorkerRegistry
from .config import DiscoveryConfig
from .credentials import KubeCredentials
from .kube_api import KubeApi
from .reconcile import DiscoveredWorkers
from .seeds import MeshSeeds
from .watch import PodWatcher


async def run_worker_discovery(config: DiscoveryConfig, credentials: KubeCredentials, registry: WorkerRegistry,
                               cluster: Any = None, on_added: "Callable[[Worker], Awaitable[None]] | None" = None,
                               *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    api = KubeApi(credentials)
    try:
        # --service-discovery-namespace, else every namespace, as smg does (a ClusterRole is then needed).
        namespace = config.namespace
        watchers = [(role, PodWatcher(api, selector, config, namespace, lambda: discovered.poke()))
                    for role, selector in config.role_selectors()]
        discovered = DiscoveredWorkers(config, registry, watchers, cluster, on_added)
        async with trio.open_nursery() as nursery:
            for _, watcher in discovered.watchers:
                nursery.start_soon(watcher.run)
            nursery.start_soon(discovered.run)
            task_status.started(discovered)
    finally:
        with trio.CancelScope(shield=True):
            await api.aclose()


def discovery_metrics(discovered: DiscoveredWorkers) -> Iterator[Any]:
    watchers = [w for _, w in discovered.watchers]
    yield gauge("smg_discovery_workers_discovered", "Engines the Kubernetes watches see serving (Ready pods with an "
                "IP)", [], [([], float(discovered.discovered))])
    yield counter("smg_discovery_registrations", "Discovered engines added (alone) or written to the cluster's "
                  "workers (meshed, by the entry's owner)", [], [([], discovered.registrations)])
    yield counter("smg_discovery_deregistrations", "Discovered engines drained because their pod went away, stopped "
                  "being Ready or was relabelled", [], [([], discovered.deregistrations)])
    yield counter("smg_discovery_registration_failures", "Discovered engines that could not be added yet (tried "
                  "again)", [], [([], discovered.failed_registrations)])
    yield gauge("smg_discovery_watch_live", "1 while every watch is listed and not failing", [],
                [([], 1.0 if discovered.live else 0.0)])
    yield counter("smg_discovery_lists", "Lists of pods, by why: start or a dropped watch, or 410 Gone",
                  ["reason"], [(["listed"], sum(w.lists for w in watchers) - sum(w.relists_gone for w in watchers)),
                               (["gone"], sum(w.relists_gone for w in watchers))])
    yield counter("smg_discovery_watch_failures", "Lists and watches that failed (retried with backoff)", [],
                  [([], sum(w.failures for w in watchers))])
    yield counter("smg_discovery_watch_events", "Watch events received (bookmarks included)", [],
                  [([], sum(w.events for w in watchers))])
    yield counter("smg_discovery_ignored_pods", "Objects in lists and watches ignored: not readable pods, or pods "
                  "beyond the most one selector holds (10,000)", ["reason"],
                  [(["invalid"], sum(w.cache.invalid for w in watchers)),
                   (["over_limit"], sum(w.cache.over_limit for w in watchers))])


async def run_mesh_seeds(config: DiscoveryConfig, credentials: KubeCredentials, agent: Any,
                         mesh_port: int) -> None:
    """--router-selector: join the router pods' meshes as they appear (seeds.py)."""
    api = KubeApi(credentials)
    try:
        watcher = PodWatcher(api, config.router_selector, config, config.namespace, lambda: seeds.poke())
        seeds = MeshSeeds(watcher, agent, mesh_port, config)
        agent.listeners.append(seeds.member_changed)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(seeds.watcher.run)
            nursery.start_soon(seeds.run)
    finally:
        with trio.CancelScope(shield=True):
            await api.aclose()

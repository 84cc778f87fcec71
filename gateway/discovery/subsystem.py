"""Kubernetes discovery as a subsystem of the node (gateway/base/subsystem.py): its section, flags and checks, and
the watch of the engines' pods (their engines added and drained). The credentials are found before the node
serves, whatever discovery is for (engines, or only --router-selector's mesh seeds, followed once the mesh runs):
without them the node does not start, saying why (CredentialsError)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from .config import OPTIONS, DiscoveryConfig
from .credentials import load_credentials
from .reconcile import DiscoveredWorkers
from .service import discovery_metrics, run_worker_discovery

log = logging.getLogger("gateway.discovery")


def _check(config: Any) -> None:
    discovery, pd, meshed = config.discovery, config.pd, config.mesh.enabled
    given = [flag for flag, selector in (("--selector", discovery.selector),
                                         ("--prefill-selector", discovery.prefill_selector),
                                         ("--decode-selector", discovery.decode_selector),
                                         ("--router-selector", discovery.router_selector)) if selector]
    if not discovery.enabled:
        if given:
            raise ConfigProblem(f"{given[0]} needs --service-discovery")
        return
    if not given:
        raise ConfigProblem("--service-discovery needs --selector (or --prefill-selector and --decode-selector, or "
                            "--router-selector): an empty selector would take every pod")
    if (discovery.prefill_selector or discovery.decode_selector) and not pd.enabled:
        raise ConfigProblem("--prefill-selector and --decode-selector need --pd-disaggregation")
    if discovery.router_selector and not meshed:
        raise ConfigProblem("--router-selector finds the mesh's seeds: it needs --mesh-bind")
    if discovery.protocol not in ("grpc", "http"):
        raise ConfigProblem(f"--service-discovery-protocol {discovery.protocol!r}: grpc or http")
    if discovery.protocol != "grpc" and (discovery.prefill_selector or discovery.decode_selector):
        raise ConfigProblem("prefill and decode engines are gRPC engines: --service-discovery-protocol grpc")
    if not 0 < discovery.port < 65536:
        raise ConfigProblem(f"--service-discovery-port {discovery.port} is not a port")


class Discovery:
    """The running watches (None when they are only the mesh's seeds'), for the node's metrics."""

    def __init__(self, discovered: "DiscoveredWorkers | None") -> None:
        self.discovered = discovered

    def metric_families(self) -> Iterator[Any]:
        if self.discovered is not None:
            yield from discovery_metrics(self.discovered)


async def _start(context: StartContext) -> "Discovery | None":
    config = context.config
    if not config.discovery.enabled:
        return None
    credentials = load_credentials()
    log.info("service discovery: Kubernetes API at %s (%s)", credentials.server, credentials.source)
    if not config.discovery.role_selectors():
        return Discovery(None)  # --router-selector alone: the mesh's seeds (gateway/node/server.py)
    catalog = context.need("catalog")
    discovered = await context.nursery.start(functools.partial(
        run_worker_discovery, config.discovery, credentials, context.need("registry"), context.need("cluster"),
        lambda worker: catalog.ensure(worker, int(worker.registered_at))))
    return Discovery(discovered)


SUBSYSTEM = Subsystem("discovery", DiscoveryConfig(), OPTIONS, _check, _start, needs=("registry", "cluster", "catalog"))

"""The cluster's own pods (``--router-selector``) as the mesh's seeds: a Deployment of smg-node forms its
mesh with no seed list, and a node that restarts under a new IP is found again.

A router pod is a seed once it runs with an IP, Ready or not: a node becomes Ready only after joining, so
waiting for Ready would keep a new Deployment from ever forming. Its mesh port is the pod's
``sglang.ai/mesh-port`` annotation (smg's), else this node's own. This node's pod (its host name is the pod's
name, or its seed is the mesh's own address) is left out. Seeds the mesh already counts as members are not
joined again.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import trio

from mesh.agent import JoinError
from mesh.members import MemberStatus

from .config import DiscoveryConfig
from .pods import Pod, annotated_port, host_in_url
from .watch import PodWatcher

log = logging.getLogger("gateway.discovery")

# How often seeds that are not members are tried again (a pod whose node is still starting).
JOIN_RETRY_S = 5.0


def seed_of(pod: Pod, mesh_port: int, config: DiscoveryConfig) -> str | None:
    if pod.ip is None or pod.phase != "Running" or pod.terminating:
        return None
    port = annotated_port(pod.annotation(config.mesh_port_annotation)) or mesh_port
    return f"{host_in_url(pod.ip)}:{port}"


class MeshSeeds:
    def __init__(self, watcher: PodWatcher, agent: Any, mesh_port: int, config: DiscoveryConfig,
                 own_name: str | None = None) -> None:
        self.watcher = watcher
        self.agent = agent
        self.mesh_port = mesh_port
        self.own_name = own_name or socket.gethostname()
        self.config = config
        self.changed = trio.Event()
        self.joins = 0

    def poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def seeds(self) -> list[str]:
        out = []
        for pod in self.watcher.cache.pods.values():
            if pod.name == self.own_name:
                continue
            seed = seed_of(pod, self.mesh_port, self.config)
            if seed is not None and seed != self.agent.transport.addr:
                out.append(seed)
        return sorted(out)

    async def run(self) -> None:
        while True:
            changed = self.changed
            await self.join_new()
            with trio.move_on_after(JOIN_RETRY_S):
                await changed.wait()

    async def join_new(self) -> None:
        members = {m.addr for m in self.agent.members() if m.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT)}
        new = [s for s in self.seeds() if s not in members]
        if not new:
            return
        try:
            answered = await self.agent.join(new)
            self.joins += 1
            log.info("mesh: joined %d of %d router pods found by --router-selector", answered, len(new))
        except JoinError as e:
            log.info("mesh: router pods %s not reachable yet: %s", ", ".join(new), e)

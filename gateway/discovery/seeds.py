"""The cluster's own pods (``--router-selector``) as the mesh's seeds: a Deployment of smg-node forms its
mesh with no seed list, and a node that restarts under a new IP is found again.

A router pod is a seed once it runs with an IP, Ready or not: a node becomes Ready only after joining, so
waiting for Ready would keep a new Deployment from ever forming. Its mesh port is the pod's
``sglang.ai/mesh-port`` annotation (smg's), else this node's own. This node's pod (its host name is the pod's
name, or its seed is the mesh's own address) is left out. Seeds the mesh already counts as members are not
joined again.

A member that failed is counted as possibly cut off for a day (``MeshConfig.dead_reap_s``): rate limits share
with it, history keeps room for what it may hold. When the router pod it ran in is deleted (gone from the API,
or terminating: a pod never comes back from that), it is gone for good, and the node forces it to leave
(``MeshAgent.force_leave``), as an operator would with ``smg-node force-leave``. Only members seen alive as a
router pod (its name, its ``node`` tag or its mesh address) are judged so, and only while the watch is live: a
member outside the selector, or a cache that may miss events, is left to the operator.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import trio

from mesh.agent import ForceLeaveError, JoinError
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
    return mesh_addr_of(pod, mesh_port, config)


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
        self.forced_leaves = 0
        self._pod_of_member: dict[str, str] = {}  # member name -> the key of the router pod it was seen alive in

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
            self.force_leave_deleted()
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

    def member_changed(self, member: Any, previous: MemberStatus | None) -> None:
        """A mesh listener: a member seen alive is matched to its router pod at once. Matched only by the loop,
        every few seconds, a member that joined and crashed in between was never seen alive as a pod and so
        never forced out (a crashed process is held dead within a second of its probe: its port refuses)."""
        if member.name != self.agent.name and member.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT):
            self._remember_pod(member, *self._pod_indexes())
        self.poke()  # a member that failed may be one whose pod is already gone

    def _pod_indexes(self) -> "tuple[dict[str, str], dict[str, str]]":
        pods = self.watcher.cache.pods
        return ({pod.name: pod.key for pod in pods.values()},
                {mesh_addr_of(pod, self.mesh_port, self.config): pod.key for pod in pods.values() if pod.ip})

    def _remember_pod(self, member: Any, by_name: "dict[str, str]", by_addr: "dict[str, str]") -> None:
        pod_key = by_name.get(member.tags.get("node", member.name)) or by_addr.get(member.addr)
        if pod_key is not None:
            self._pod_of_member[member.name] = pod_key

    def force_leave_deleted(self) -> list[str]:
        """Forces the failed members whose router pod was deleted to leave; returns their names."""
        if not self.watcher.live:
            return []
        pods = self.watcher.cache.pods
        by_name, by_addr = self._pod_indexes()
        members = [m for m in self.agent.members() if m.name != self.agent.name]
        names = {m.name for m in members}  # bounded by the members: the forgotten ones go
        self._pod_of_member = {name: pod for name, pod in self._pod_of_member.items() if name in names}
        forced = []
        for member in members:
            if member.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT):
                self._remember_pod(member, by_name, by_addr)
            elif member.status is MemberStatus.DEAD and member.name in self._pod_of_member:
                pod_key = self._pod_of_member[member.name]
                pod = pods.get(pod_key)
                if pod is not None and not pod.terminating:
                    continue
                del self._pod_of_member[member.name]
                try:
                    forced += self.agent.force_leave(member.name)
                except ForceLeaveError as e:  # changed meanwhile (refuted, or left on its own)
                    log.info("mesh: member %s not forced to leave: %s", member.name, e)
                    continue
                log.info("mesh: member %s failed and its pod %s is deleted: forced to leave", member.name, pod_key)
        self.forced_leaves += len(forced)
        return forced


def mesh_addr_of(pod: Pod, mesh_port: int, config: DiscoveryConfig) -> str:
    """A pod's mesh address, whatever its phase (the pod must have an IP)."""
    port = annotated_port(pod.annotation(config.mesh_port_annotation)) or mesh_port
    return f"{host_in_url(pod.ip or '')}:{port}"

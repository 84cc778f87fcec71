"""Where the gateway meets the mesh: the replicated worker registry and ring ownership.

``ClusterState`` plugs into the mesh agent as its ``StateHooks`` (the worker
document rides on push-pull, and its updates on the gossip queue) and into the
gateway's ``WorkerRegistry`` (which workers exist, and who health-checks them):

* a worker registered or removed on any node is written to the ``WorkerDoc``;
  every node reconciles its local registry with the document (connects to new
  workers, drains removed ones), so behind a load balancer all nodes use all
  workers;
* each worker is health-checked by its owner on the consistent-hash ring of
  the alive members; the owner writes the verdict to the document, the other
  nodes read it. When the owner dies, the ring changes and the next owner
  checks at its next interval.

Cluster-wide settings changed at run time (the rate limits, API keys) live in the
same document; ``follow_settings`` callbacks run when a peer's change arrives (settings_doc.py, which a lone
node uses alone). With a data directory every change is on disk before it is acknowledged (doc_journal.py).
Ownership is the ``RingView``'s (``ring_view.py``); requests from peers over the
mesh streams go to the subsystem whose mark they carry (``peer_requests.py``).

A lone node (no mesh) has no ``ClusterState``: it owns every worker.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from mesh import PeerUnreachable
from mesh.members import MemberSnapshot, MemberStatus
from mesh.ring import HashRing
from mesh.transport import TransportError
from mesh.wire import USER_PAYLOAD_BYTES_MAX
from mesh.worker_doc import DocError

from .peer_requests import TRACE_MARK, Handler, PeerRequests
from .ring_view import RingView
from .settings_doc import SettingsDocument

log = logging.getLogger("gateway.cluster")

# Gossip packets hold ~1,400 bytes: bigger updates travel by push-pull only.
GOSSIP_UPDATE_BYTES_MAX = 1200
# Members whose machine is remembered (a dead member's is still needed to place the keys it held); past this
# the memory starts over.
MACHINES_REMEMBERED_MAX = 10_000


class ClusterState(SettingsDocument):
    def __init__(self, node_name: str) -> None:
        super().__init__(node_name)
        self.ring_view = RingView(node_name)
        self.peer_requests = PeerRequests()
        self.agent: Any = None  # the MeshAgent, set once it runs
        self.changed = trio.Event()  # the worker set in the document changed: reconcile
        self.dropped_updates = 0  # peers' document updates refused (unreadable, out of bounds)
        # True once a peer's whole document arrived (or there was nobody to join): until then the
        # node does not know the cluster's workers and limits, so it is not ready.
        self.registry_received = False
        self._machines: dict[str, str] = {}  # member -> the machine it runs on (machine_of)
        # True once this node went through the document it received: every worker it listed was registered
        # here (or tried). Between the two a restarted node knew the cluster's workers but had registered none
        # of them yet, and answered their model's requests 404 (a chaos run's kill-history-owners caught it).
        self.registry_applied = False

    def attach(self, agent: Any) -> None:
        """Called with the mesh agent before it joins: follow its membership from the start."""
        self.agent = agent
        agent.listeners.append(self.on_member_change)
        agent.reap_listeners.append(lambda name: self.ring_view.update(agent.members()))

    # -- ownership (the ring view's) ----------------------------------------

    @property
    def ring(self) -> HashRing:
        return self.ring_view.ring

    @property
    def ring_changed(self) -> trio.Event:
        """Set, and replaced, on every ring change."""
        return self.ring_view.changed

    def owns(self, worker_id: str) -> bool:
        return self.ring_view.owns(worker_id)

    def member_counts(self) -> tuple[int, int]:
        return self.ring_view.member_counts()

    def known_members(self) -> list[str]:
        """Every member this node knows of and that did not leave: alive, suspected or failed (until
        reaped). A failed member may be cut off rather than dead, still serving its clients."""
        if self.agent is None:
            return [self.node_name]
        return [m.name for m in self.agent.members() if m.status is not MemberStatus.LEFT]

    def node_of(self, member: str) -> str | None:
        """The node a member runs on (its ``node`` tag: the processes of ``--workers N`` share one), or
        None when this node does not know the member (any more)."""
        known = self.agent.member(member) if self.agent is not None else None
        return known.tags.get("node", member) if known is not None else None

    def machine_of(self, member: str) -> str:
        """The machine a member runs on, remembered once known; the member itself while it is unknown."""
        machine = self._machines.get(member)
        if machine is None:
            machine = self.node_of(member)
            if machine is None:
                return member
            if len(self._machines) >= MACHINES_REMEMBERED_MAX:
                self._machines.clear()
            self._machines[member] = machine
        return machine

    def owners(self, key: str, count: int, ring: HashRing | None = None) -> list[str]:
        """The key's owners on the ring (or ``ring``, a past one), one per machine (HashRing.placement)."""
        return (ring or self.ring).placement(key, count, self.machine_of)

    def walk(self, key: str, ring: HashRing | None = None) -> list[str]:
        """Every member, the key's owners first (placement's walk)."""
        return (ring or self.ring).placement(key, 0, self.machine_of, owners_only=False)

    def on_member_change(self, member: MemberSnapshot, previous: MemberStatus | None) -> None:
        if self.agent is not None and self.ring_view.update(self.agent.members()):
            log.info("ring: %d members", len(self.ring))

    # -- requests between members -----------------------------------------

    def serve_requests(self, mark: bytes, handler: Handler) -> None:
        """Peers' requests carrying ``mark`` go to ``handler`` (once per subsystem, at its construction)."""
        self.peer_requests.register(mark, handler)

    async def request_peer(self, name: str, payload: bytes, timeout_s: float) -> bytes:
        """A request to the member ``name`` over the sealed mesh streams, answered within ``timeout_s``;
        PeerUnreachable otherwise (unknown member, no connection, too slow, an answer that does not open)."""
        member = self.agent.member(name) if self.agent is not None else None
        if member is None:
            raise PeerUnreachable(f"no member {name}")
        try:
            with trio.fail_after(timeout_s):
                tracing = self.peer_requests.tracing
                if tracing is None or not tracing.active():
                    return await self.agent.request(member.addr, payload, timeout_s)
                with tracing.client_span("peer.request", {"smg.peer": name,
                                                          "smg.peer.kind": payload[:1].decode("latin-1")}):
                    traced = TRACE_MARK + tracing.traceparent_bytes() + payload  # the answering node's spans join it
                    return await self.agent.request(member.addr, traced, timeout_s)
        except (TransportError, trio.TooSlowError) as e:
            raise PeerUnreachable(f"{name}: {e or type(e).__name__}") from None

    # -- writes from this node -------------------------------------------

    def publish(self, update: bytes | None) -> None:
        if update is None:
            return
        if self.agent is not None and len(update) <= GOSSIP_UPDATE_BYTES_MAX:
            self.agent.broadcast(update)
        # Larger updates reach the others at the next push-pull.
        compacted = self.doc.maybe_compact()
        if compacted is not None and self.agent is not None and len(compacted) <= GOSSIP_UPDATE_BYTES_MAX:
            self.agent.broadcast(compacted)
        self._persist()  # before the write is acknowledged (an admin answer follows this call)

    def register(self, worker_id: str, spec: dict[str, Any]) -> None:
        self.publish(self.doc.register(worker_id, spec))
        self._notify()

    def remove(self, worker_id: str) -> None:
        self.publish(self.doc.remove(worker_id))
        self._notify()

    def set_setting(self, name: str, value: Any) -> None:
        update = self.doc.set_setting(name, value)
        self.publish(update)
        if len(update) > GOSSIP_UPDATE_BYTES_MAX and self.agent is not None:
            self.agent.sync_with_all()  # too big for a gossip packet: push it to everyone now

    def set_health(self, worker_id: str, health: dict[str, Any]) -> None:
        self.publish(self.doc.set_health(worker_id, health))

    def health_of(self, worker_id: str) -> dict[str, Any] | None:
        return self.doc.get("health", worker_id)

    # -- StateHooks (called by the mesh agent) ---------------------------

    def local_state(self, join: bool) -> bytes:
        return self.doc.state()

    def merge_remote_state(self, data: bytes, join: bool) -> None:
        self._merge(data)
        self.registry_received = True

    def mark_joined(self) -> None:
        self.registry_received = True

    def notify(self, payload: bytes) -> None:
        # The mesh does not re-gossip another subsystem's broadcasts (memberlist's rule): a sender
        # retransmits a few times to random members and may miss one. So a node that learns
        # something new from an update passes it on; nodes that had it already stay quiet.
        seen = self.doc.state_vector()
        self._merge(payload)
        if self.agent is not None and self.doc.state_vector() != seen and len(payload) <= GOSSIP_UPDATE_BYTES_MAX:
            self.agent.broadcast(payload)

    async def on_request(self, payload: bytes) -> bytes:
        """A peer's request over the mesh streams (StateHooks): to the subsystem of its mark."""
        return await self.peer_requests.handle(payload)

    def _merge(self, payload: bytes) -> None:
        if len(payload) > USER_PAYLOAD_BYTES_MAX:
            self.dropped_updates += 1
            return
        try:
            extras = self.doc.merge(payload)
        except DocError as e:
            self.dropped_updates += 1
            log.debug("dropped a worker document update: %s", e)
            return
        for extra in extras:
            self.publish(extra)
        self._persist()
        changed = self.doc.changed
        if changed.get("workers"):
            self._notify()
        self._tell(changed.get("settings", set()))

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

"""Prometheus metric families of the node's mesh agent, read at scrape time from its counters.

Here rather than in mesh/: the mesh keeps counters and knows nothing of how the gateway exports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mesh.agent import MeshAgent

from ..cluster import ClusterState
from ..observe.metrics import counter, gauge


def mesh_metric_families(agent: MeshAgent) -> Iterator[Any]:
    stats, swim = agent.stats, agent.protocol_stats
    yield gauge("smg_mesh_members", "Members by state, as this node sees them", ["state"],
                [([status.name.lower()], float(n)) for status, n in agent.counts_by_status().items()])
    yield gauge("smg_mesh_health_score", "Lifeguard local health (awareness): 0 is healthy; it stretches "
                "this node's probe interval and timeout", [], [([], float(agent.awareness))])
    yield counter("smg_mesh_probes", "Probes by outcome", ["outcome"],
                  [(["ack"], swim["probe_acks"]), (["failed"], swim["probe_failures"])])
    yield counter("smg_mesh_indirect_probes", "Indirect probe requests sent", [], [([], swim["indirect_probes"])])
    yield counter("smg_mesh_listener_checks", "Members that failed a direct probe, checked for a process "
                  "listening at their address: refused (the process is gone: a short suspicion) or not",
                  ["outcome"], [(["refused"], swim["listeners_refused"]),
                                (["not_refused"], swim["listener_checks"] - swim["listeners_refused"])])
    yield counter("smg_mesh_suspicions_raised", "Members this node started suspecting", [],
                  [([], swim["suspicions_raised"])])
    yield counter("smg_mesh_suspicions_refuted", "Suspected members that proved alive", [],
                  [([], swim["suspicions_refuted"])])
    yield counter("smg_mesh_refutations", "False alarms about this node that it refuted", [],
                  [([], swim["refutations"])])
    yield counter("smg_mesh_forced_leaves", "Failed members this node forced to leave (smg-node force-leave, or "
                  "their router pod deleted)", [], [([], swim["forced_leaves"])])
    yield counter("smg_mesh_packets", "Gossip packets", ["direction"],
                  [(["sent"], stats.packets_sent), (["received"], stats.packets_received)])
    yield counter("smg_mesh_bytes", "Gossip bytes", ["direction"],
                  [(["sent"], stats.bytes_sent), (["received"], stats.bytes_received)])
    yield counter("smg_mesh_dropped_packets", "Packets dropped, by reason", ["reason"],
                  [([reason], n) for reason, n in sorted(stats.dropped.items())])
    yield counter("smg_mesh_push_pulls", "Push-pull state exchanges started, and failed", ["outcome"],
                  [(["started"], stats.push_pulls), (["failed"], stats.push_pull_failures)])


def cluster_metric_families(cluster: ClusterState) -> Iterator[Any]:
    """What peers sent the cluster's shared state that it refused: each one a frame dropped, the state unchanged."""
    yield counter("smg_cluster_refused", "Peers' cluster-state frames refused, by kind: worker-document updates "
                  "out of bounds or unreadable, settings a subsystem refused, requests with no handler",
                  ["kind"], [(["document_update"], cluster.dropped_updates), (["setting"], cluster.bad_settings),
                             (["unrouted_request"], cluster.peer_requests.unrouted)])

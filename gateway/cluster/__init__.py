"""What the gateway shares with the other nodes, over the mesh.

    state.ClusterState          the mesh agent's StateHooks: the replicated worker document (workers,
                                their health, settings), publishing and merging its updates
    ring_view.RingView          who owns what: the ring of live members, member counts (pure)
    peer_requests.PeerRequests  requests between members, routed by the mark each subsystem registers
    registry_sync               every node's registry follows the document (AbsenceRule: when to drain)
    kv_sharing.KvSharing        one KV index for the cluster: owners follow engines and forward
    settings_doc.SettingsDocument   run-time settings (keys, limits): the cluster's document, or a lone node's
    doc_journal.DocJournal      the document kept on disk in the node's data directory

A lone node (no mesh) has none of these but a SettingsDocument of its own. Collaborators are passed to
constructors: a subsystem that answers peers registers its mark with ``ClusterState.serve_requests`` when it is made.
"""

from .kv_sharing import KvSharing
from .peer_requests import PeerRequests
from .registry_sync import ABSENT_WORKER_GRACE_S, AbsenceRule, follow_worker_document
from .ring_view import RingView
from .settings_doc import SettingsDocument
from .state import ClusterState

__all__ = ["ABSENT_WORKER_GRACE_S", "AbsenceRule", "ClusterState", "KvSharing", "PeerRequests", "RingView",
           "SettingsDocument", "follow_worker_document"]

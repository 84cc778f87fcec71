"""The mesh: membership and gossip (SWIM with Lifeguard), sans-I/O cores, transports, the admin endpoint.

What other packages may use is listed here, by the module that defines it; the rest is the
mesh's own (tests/unit/test_layers.py fails on an import of anything else from outside). Names
load when first used, so importing one costs only its module.

    running a node's mesh      serve_mesh, MeshBindError, MeshOptions, MeshConfig, MeshAgent, JoinError,
                               PeerUnreachable, default_node_name, parse_tags, is_loopback
    members and ownership      MemberSnapshot, MemberStatus, HashRing
    the worker document        WorkerDoc, DocError, USER_PAYLOAD_BYTES_MAX
    streams between members    TransportError, MeshTls, split_addr
    keys and the admin token   generate_key, decode_key, derive_key, WeakSecret, KeyringError, AdminTokenError,
                               default_token_path, load_or_create_token, read_token, cluster_salt, client_token,
                               record_endpoint, forget_endpoint, TOKEN_ENV, FILE_ENV
    the CLI's side             run_admin_command, call_json, live_endpoints
    HTTP apps                  answer_lifespan
    the chaos harness's faults FAULTS_ENV, SEED_ENV
    state kept on disk         Journal, JournalError, Recovered (a node's data directory), key_fingerprint
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "serve_mesh": "service", "MeshBindError": "service", "JoinError": "agent", "PeerUnreachable": "agent",
    "ForceLeaveError": "agent",
    "MeshOptions": "options", "MeshConfig": "config", "MeshAgent": "agent",
    "default_node_name": "options", "parse_tags": "options", "is_loopback": "options",
    "MemberSnapshot": "members", "MemberStatus": "members", "HashRing": "ring",
    "WorkerDoc": "worker_doc", "DocError": "worker_doc", "USER_PAYLOAD_BYTES_MAX": "wire",
    "TransportError": "transport", "MeshTls": "transport", "split_addr": "transport",
    "generate_key": "crypto", "decode_key": "crypto", "derive_key": "crypto", "KeyringError": "crypto",
    "WeakSecret": "crypto", "cluster_salt": "admin_token",
    "AdminTokenError": "admin_token", "default_token_path": "admin_token", "load_or_create_token": "admin_token",
    "read_token": "admin_token", "client_token": "admin_token", "record_endpoint": "admin_token", "forget_endpoint": "admin_token",
    "TOKEN_ENV": "admin_token", "FILE_ENV": "admin_token", "live_endpoints": "admin_token",
    "user_state_dir": "admin_token", "member_json": "service",
    "run_admin_command": "admin_client", "call_json": "admin_client",
    "answer_lifespan": "asgi",
    "FAULTS_ENV": "faults", "SEED_ENV": "faults",
    "Journal": "journal", "JournalError": "journal", "Recovered": "journal", "key_fingerprint": "crypto",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mesh' has no attribute {name!r}")
    return getattr(importlib.import_module(f"mesh.{_EXPORTS[name]}"), name)

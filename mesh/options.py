"""What ``smg-node serve`` needs to run the mesh: addresses, seeds, keys, admin endpoint.

The protocol's timers live in ``MeshConfig`` (presets ``lan`` and ``local``);
these are the per-node facts and choices around it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket


DEFAULT_RPC_ADDR = "127.0.0.1:7373"  # Serf's RPC port


@dataclasses.dataclass(frozen=True)
class MeshOptions:
    # Gossip (UDP) and push-pull (TCP) on this address; None: no mesh (a lone node).
    bind: str | None = None
    # Address other members reach us at, when it differs from bind (NAT, 0.0.0.0).
    advertise: str | None = None
    # Seeds: host:port, or dns:NAME:PORT resolved to every address of NAME (a
    # Kubernetes headless service). Retried with backoff until one answers.
    join: tuple[str, ...] = ()
    # How many rounds of join attempts before giving up; 0 = keep trying forever.
    retry_join_max: int = 0
    retry_join_interval_s: float = 5.0
    node_name: str | None = None
    # Base64 AES-256 keys; the first encrypts. Without --encrypt the node derives one from its admin token
    # (gateway.node.config.with_admin_credentials): empty only with --mesh-insecure, which the node says at start.
    keys: tuple[str, ...] = ()
    # Where the keys came from, for the start-up log: "flag" (--encrypt / SMG_NODE_ENCRYPT) or "admin-token".
    key_source: str = "flag"
    tags: tuple[tuple[str, str], ...] = ()
    preset: str = "lan"
    # The local admin endpoint the CLI talks to; it always needs the token. None: Serf's port (127.0.0.1:7373) for
    # a node with --mesh-bind, a port the kernel picks for the private mesh of --workers N (the CLI finds either
    # in the node's endpoint record).
    rpc_addr: str | None = None
    # Always set when the node runs (gateway.node.config.with_admin_credentials): the admin token by default.
    rpc_token: str | None = None
    # A mesh reachable off loopback must be encrypted unless this says otherwise (--mesh-insecure).
    insecure: bool = False
    # Mutual TLS for the streams between members (mesh/transport.py MeshTls): all three, or none.
    tls_ca_cert: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # The node's data directory (gateway/node/data_dir.py): the keyring is kept there (mesh/keyring_file.py).
    # None: kept nowhere (a rotated node restarted with its old --encrypt cannot rejoin).
    data_dir: str | None = None
    # The private mesh of a lone node's --workers N processes: its key is made anew at each start (the
    # supervisor's), so a keyring kept from the last start would lock the processes out of each other.
    private: bool = False

    @property
    def rpc_bind(self) -> str:
        return self.rpc_addr or DEFAULT_RPC_ADDR

    @property
    def enabled(self) -> bool:
        return self.bind is not None


def is_loopback(addr: str) -> bool:
    host = addr.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_node_name(bind: str) -> str:
    return f"{socket.gethostname()}-{bind.rpartition(':')[2]}"


def parse_tags(items: "tuple[str, ...] | list[str]") -> tuple[tuple[str, str], ...]:
    tags = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"a tag is key=value, got {item!r}")
        tags.append((key, value))
    return tuple(sorted(tags))

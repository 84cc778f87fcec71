"""The mesh's flags, as the gateway runs it: ``mesh.options.MeshOptions`` is the mesh package's own (it knows
nothing of the gateway's option declarations); these set its fields, and smg's flag names are accepted as
aliases (``--enable-mesh``, ``--mesh-host``, ``--mesh-port``, ``--mesh-advertise-host``, ``--mesh-peer-urls``;
the config folds them into ``mesh.*``)."""

from __future__ import annotations

from ..base.options import Option

# This subsystem's flags (gateway/base/options.py); their defaults are MeshOptions'.
OPTIONS = (
    Option("--mesh-bind", "mesh.bind", str, "gossip (UDP) and push-pull (TCP) address, e.g. 0.0.0.0:7946", "cluster"),
    Option("--mesh-advertise", "mesh.advertise", str, "address other members reach this one at", "cluster"),
    Option("--join", "mesh.join", "list", "seeds host:port or dns:NAME:PORT, retried until one answers", "cluster"),
    Option("--retry-join", "mesh.retry_join_max", int, "join rounds before giving up (0: forever)", "cluster"),
    Option("--retry-join-interval-secs", "mesh.retry_join_interval_s", float, "first wait between join rounds",
           "cluster"),
    Option("--node-name", "mesh.node_name", str, "this member's name (default: host-port)", "cluster"),
    Option("--encrypt", "mesh.keys", "list", "gossip keys (base64 AES-256, first encrypts)", "cluster", secret=True),
    Option("--tag", "mesh.tags", "list", "member tags key=value (zone, role...)", "cluster"),
    Option("--mesh-preset", "mesh.preset", str, "protocol timers: lan (default) or local (one machine)", "cluster"),
    Option("--rpc-addr", "mesh.rpc_addr", str, "admin endpoint for the CLI (default 127.0.0.1:7373 with "
           "--mesh-bind, else a free port: the node records it for the CLI, one record per node)", "cluster"),
    Option("--rpc-token", "mesh.rpc_token", str, "bearer token the admin endpoint requires (default: the admin "
           "token)", "cluster", secret=True),
    Option("--mesh-tls-ca-cert", "mesh.tls_ca_cert", str, "mutual TLS between members' streams: the CA", "cluster"),
    Option("--mesh-tls-cert", "mesh.tls_cert", str, "this member's certificate (signed by the mesh CA)", "cluster"),
    Option("--mesh-tls-key", "mesh.tls_key", str, "its private key", "cluster"),
    Option("--mesh-insecure", "mesh.insecure", "bool", "run the mesh in the clear (anyone who can send it a packet "
           "can read and change the cluster). Without it and without --encrypt, the gossip key is derived from the "
           "admin token; off loopback --encrypt is required", "cluster"),
    Option("--mesh-private", "mesh.private", "bool", "this process's mesh is the private one of --workers N (set "
           "by the node: its key is made at each start, so its keyring is not kept)", "cluster", internal=True),
    Option("--enable-mesh", "_enable_mesh", "bool", "smg alias: run the mesh (on 0.0.0.0:7946 by default)", "cluster"),
    Option("--mesh-host", "_mesh_host", str, "smg alias: host part of --mesh-bind", "cluster"),
    Option("--mesh-port", "_mesh_port", int, "smg alias: port part of --mesh-bind", "cluster"),
    Option("--mesh-advertise-host", "_mesh_advertise_host", str, "smg alias: host part of --mesh-advertise", "cluster"),
    Option("--mesh-peer-urls", "mesh.join", "list", "smg alias of --join", "cluster"),
)

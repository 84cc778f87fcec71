"""The cluster as subsystems of the node (gateway/base/subsystem.py): the mesh's section, flags and checks (the mesh
itself runs beside the gateway: gateway/node/server.py), and the KV sharing that makes one KV index of the
cluster's (None without a mesh or without KV events)."""

from __future__ import annotations

import ssl
from typing import Any

from mesh.crypto import KeyringError, decode_key
from mesh.options import MeshOptions, is_loopback
from mesh.transport import MeshTls

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from . import mesh_options
from .kv_sharing import KvSharing


def _check_mesh(config: Any) -> None:
    mesh = config.mesh
    if not mesh.enabled:
        return
    if mesh.preset not in ("lan", "local"):
        raise ConfigProblem("--mesh-preset must be lan or local")
    try:
        for key in mesh.keys:
            decode_key(key)
    except KeyringError as e:
        raise ConfigProblem(f"--encrypt: {e}") from None
    tls_parts = [mesh.tls_ca_cert, mesh.tls_cert, mesh.tls_key]
    if any(tls_parts) and not all(tls_parts):
        raise ConfigProblem("--mesh-tls-ca-cert, --mesh-tls-cert and --mesh-tls-key go together")
    if all(tls_parts):
        try:
            MeshTls(*tls_parts)
        except (OSError, ssl.SSLError) as e:
            raise ConfigProblem(f"--mesh-tls-*: {e}") from None
    if not mesh.keys and not mesh.insecure and not (is_loopback(mesh.bind) and is_loopback(mesh.advertise or mesh.bind)):
        raise ConfigProblem(f"--mesh-bind {mesh.bind} is reachable from the network: pass --encrypt KEY (smg-node "
                            "keygen makes one), or --mesh-insecure to run it in the clear")


async def _start_kv_sharing(context: StartContext) -> "KvSharing | None":
    cluster, index = context.need("cluster"), context.need("kv_index")
    if cluster is None or index is None:
        return None
    sharing = KvSharing(cluster, index, context.config.kv_event_followers)
    await context.nursery.start(sharing.run)
    return sharing


MESH = Subsystem("mesh", MeshOptions(), mesh_options.OPTIONS, _check_mesh)
KV_SHARING = Subsystem("kv_sharing", start=_start_kv_sharing, needs=("cluster", "kv_index"))

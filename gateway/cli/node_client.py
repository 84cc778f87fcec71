"""What the CLI's commands that talk to one node's HTTP control plane share: ``--url``, ``--node`` and
``--admin-token``.

The node is ``--url`` (else ``$SMG_NODE_URL``, else the local node ``--node HTTP_PORT`` names, else the only local
node this user runs, else http://127.0.0.1:30000); the admin credential is ``--admin-token`` (or its other name
``--rpc-token``), ``$SMG_NODE_ADMIN_TOKEN``, or the token file the node made (mesh/admin_token.py). The mesh
commands (members, join, leave, keyring) take the same flags (gateway/cli/command.py).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from mesh.admin_client import call_json
from mesh.admin_token import client_token, live_endpoints

DEFAULT_URL = "http://127.0.0.1:30000"


def node_options(parser: argparse.ArgumentParser, nested: bool) -> None:
    """--url, --node and --admin-token, accepted before and after the action: the same as the mesh commands take
    (docs/cluster.md, "Which node a command talks to")."""
    # Never a default here: the command line's top level takes the same flags (command.py), and a default at this
    # level would undo what was given there.
    default = argparse.SUPPRESS
    parser.add_argument("--url", default=default, help="the node (default: $SMG_NODE_URL, else the local node of "
                                                       "--node, else the only local node, else http://127.0.0.1:30000)")
    parser.add_argument("--node", default=default, metavar="HTTP_PORT", help="which local node, by its HTTP port, "
                        "when this user runs several")
    parser.add_argument("--admin-token", "--rpc-token", dest="admin_token", default=default,
                        help="admin credential (default: $SMG_NODE_ADMIN_TOKEN, else the admin token file)")


def node_url(args: argparse.Namespace) -> str:
    """The node a control-plane command talks to: --url, $SMG_NODE_URL, --node's (a local node by its HTTP port),
    the only local node this user runs, else port 30000. Several local nodes and no choice: the command stops and
    lists them."""
    url = getattr(args, "url", None) or os.environ.get("SMG_NODE_URL")
    if url:
        return url.rstrip("/")
    node = getattr(args, "node", None)
    if node is not None:
        return f"http://127.0.0.1:{node}"
    alive = live_endpoints()
    if len(alive) == 1:
        return f"http://127.0.0.1:{next(iter(alive))}"
    if len(alive) > 1:
        choices = "\n".join(f"  --node {port}" for port in sorted(alive))
        raise SystemExit(f"smg-node: {len(alive)} local nodes run; say which, by its HTTP port:\n{choices}\n"
                         "(or --url http://HOST:PORT)")
    return DEFAULT_URL


def call_node(args: argparse.Namespace, method: str, path: str, body: "dict[str, Any] | None" = None) -> Any:
    token = getattr(args, "admin_token", None) or getattr(args, "rpc_token", None) or client_token()
    return call_json(method, node_url(args) + path, token, body)

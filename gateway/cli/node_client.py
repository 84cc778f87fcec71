"""What the CLI's commands that talk to one node's HTTP control plane share: ``--url`` and ``--admin-token``.

The node is ``--url`` (default ``$SMG_NODE_URL`` or http://127.0.0.1:30000); the admin credential is
``--admin-token``, ``$SMG_NODE_ADMIN_TOKEN``, or the token file the node made (mesh/admin_token.py).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from mesh.admin_client import call_json
from mesh.admin_token import client_token


def node_options(parser: argparse.ArgumentParser, nested: bool) -> None:
    """--url and --admin-token, accepted before and after the action (as --rpc-addr is for members)."""
    default = argparse.SUPPRESS if nested else None
    parser.add_argument("--url", default=default, help="the node (default: $SMG_NODE_URL or http://127.0.0.1:30000)")
    parser.add_argument("--admin-token", default=default, help="admin credential (default: $SMG_NODE_ADMIN_TOKEN, "
                                                               "else the admin token file)")


def call_node(args: argparse.Namespace, method: str, path: str, body: "dict[str, Any] | None" = None) -> Any:
    url = (args.url or os.environ.get("SMG_NODE_URL") or "http://127.0.0.1:30000").rstrip("/")
    return call_json(method, url + path, args.admin_token or client_token(), body)

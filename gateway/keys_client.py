"""``smg-node keys create|list|revoke``: API keys through a node's control plane (/admin/api-keys).

The node is ``--url`` (default ``$SMG_NODE_URL`` or http://127.0.0.1:30000); the
admin credential is ``--admin-token``, ``$SMG_NODE_ADMIN_TOKEN``, or the token file
the node made (mesh/admin_token.py), as for the other commands.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from mesh.admin_client import call_json
from mesh.admin_token import client_token


def _node_options(parser: argparse.ArgumentParser, nested: bool) -> None:
    """--url and --admin-token, accepted before and after the action (as --rpc-addr is for members)."""
    default = argparse.SUPPRESS if nested else None
    parser.add_argument("--url", default=default, help="the node (default: $SMG_NODE_URL or http://127.0.0.1:30000)")
    parser.add_argument("--admin-token", default=default, help="admin credential (default: $SMG_NODE_ADMIN_TOKEN, "
                                                               "else the admin token file)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _node_options(parser, nested=False)
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a key; its secret is printed once")
    _node_options(create, nested=True)
    create.add_argument("name")
    create.add_argument("--role", choices=("user", "admin"), default="user")
    create.add_argument("--tenant", default=None)
    create.add_argument("--models", nargs="+", default=None, help="the only models the key may use")
    create.add_argument("--expires-in-secs", type=float, default=None)
    _node_options(actions.add_parser("list", help="the keys (never their secrets)"), nested=True)
    revoke = actions.add_parser("revoke", help="revoke a key on every node")
    _node_options(revoke, nested=True)
    revoke.add_argument("id")


def _call(args: argparse.Namespace, method: str, path: str, body: "dict[str, Any] | None" = None) -> Any:
    url = (args.url or os.environ.get("SMG_NODE_URL") or "http://127.0.0.1:30000").rstrip("/")
    return call_json(method, url + path, args.admin_token or client_token(), body)


def run(args: argparse.Namespace) -> int:
    if args.action == "create":
        body = {"name": args.name, "role": args.role, "tenant": args.tenant, "models": args.models,
                "expires_in_s": args.expires_in_secs}
        print(json.dumps(_call(args, "POST", "/admin/api-keys", body), indent=2))
    elif args.action == "list":
        for key in _call(args, "GET", "/admin/api-keys")["keys"]:
            state = "active" if key["active"] else ("revoked" if key["revoked"] else "expired")
            print(f"{key['id']}  {key['name']}  {key['role']}  {key['tenant'] or '-'}  {state}")
    else:
        _call(args, "DELETE", f"/admin/api-keys/{args.id}")
        print(f"revoked {args.id}")
    return 0

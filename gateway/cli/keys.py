"""``smg-node keys create|list|revoke``: API keys through a node's control plane (/admin/api-keys).

The node is ``--url`` (default ``$SMG_NODE_URL`` or http://127.0.0.1:30000); the
admin credential is ``--admin-token``, ``$SMG_NODE_ADMIN_TOKEN``, or the token file
the node made (mesh/admin_token.py), as for the other commands.
"""

from __future__ import annotations

import argparse
import json

from .node_client import call_node, node_options
from .spend import budget_body, budget_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    node_options(parser, nested=False)
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a key; its secret is printed once")
    node_options(create, nested=True)
    create.add_argument("name")
    create.add_argument("--role", choices=("user", "admin"), default="user")
    create.add_argument("--tenant", default=None)
    create.add_argument("--models", nargs="+", default=None, help="the only models the key may use")
    create.add_argument("--expires-in-secs", type=float, default=None)
    create.add_argument("--budget", type=float, default=None, metavar="USD", help="the key's budget in dollars "
                        "per period (hard unless --budget-soft)")
    budget_options(create, prefix="budget-")
    node_options(actions.add_parser("list", help="the keys (never their secrets)"), nested=True)
    revoke = actions.add_parser("revoke", help="revoke a key on every node")
    node_options(revoke, nested=True)
    revoke.add_argument("id")


def run(args: argparse.Namespace) -> int:
    if args.action == "create":
        body = {"name": args.name, "role": args.role, "tenant": args.tenant, "models": args.models,
                "expires_in_s": args.expires_in_secs}
        if args.budget is not None:
            body["budget"] = budget_body(args, args.budget)
        print(json.dumps(call_node(args, "POST", "/admin/api-keys", body), indent=2))
    elif args.action == "list":
        keys = call_node(args, "GET", "/admin/api-keys")["keys"]
        if not keys:
            print("no run-time API keys (make one: smg-node keys create NAME)")
        for key in keys:
            state = "active" if key["active"] else ("revoked" if key["revoked"] else "expired")
            print(f"{key['id']}  {key['name']}  {key['role']}  {key['tenant'] or '-'}  {state}")
    else:
        call_node(args, "DELETE", f"/admin/api-keys/{args.id}")
        print(f"revoked {args.id}")
    return 0

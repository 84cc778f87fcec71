"""``smg-node adapters list|add|remove|load|unload``: the cluster's LoRA adapters through a node's control plane
(/admin/adapters).

``add NAME --base MODEL --path DIR`` defines one on every node (``--pinned`` keeps it loaded; ``--load-now`` loads it
on every worker of its base before answering); requests then name it as a model (``NAME`` or ``MODEL:NAME``).
``list`` shows each with the workers that hold it; ``load`` and ``unload`` act on every worker now; ``remove``
forgets it and unloads it everywhere. ``--url`` and ``--admin-token`` as for ``smg-node keys``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .node_client import call_node, node_options

COLUMNS = ("name", "base", "path", "pinned", "loaded on")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    node_options(parser, nested=False)
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="the adapters and the workers that hold each")
    node_options(listing, nested=True)
    listing.add_argument("--json", action="store_true", help="the node's JSON instead of a table")
    add = actions.add_parser("add", help="define an adapter on every node")
    node_options(add, nested=True)
    add.add_argument("name", help="the name requests use (also BASE:NAME)")
    add.add_argument("--base", required=True, help="the model it adapts")
    add.add_argument("--path", required=True, help="its weights' directory, as the engines see their disk")
    add.add_argument("--pinned", action="store_true", help="never unloaded to make room for another")
    add.add_argument("--load-now", action="store_true", help="load it on every worker of its base now")
    for action, help_text in (("remove", "forget an adapter and unload it everywhere"),
                              ("load", "load an adapter on every worker of its base now"),
                              ("unload", "unload an adapter from every worker that holds it")):
        sub = actions.add_parser(action, help=help_text)
        node_options(sub, nested=True)
        sub.add_argument("name")


def table(adapters: "list[dict[str, Any]]") -> str:
    rows = [COLUMNS] + [(a["name"], a["base"], a["path"], "yes" if a["pinned"] else "no",
                         ",".join(a["loaded_on"]) or "-") for a in adapters]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows)


def _outcomes(outcomes: "dict[str, str]") -> str:
    return "\n".join(f"  {worker}: {outcome}" for worker, outcome in sorted(outcomes.items())) or "  (no worker)"


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        adapters = call_node(args, "GET", "/admin/adapters")["adapters"]
        print(json.dumps(adapters, indent=2) if args.json else table(adapters) if adapters else
              "no adapters (define one: smg-node adapters add NAME --base MODEL --path DIR)")
    elif args.action == "add":
        answer = call_node(args, "PUT", f"/admin/adapters/{args.name}", {
            "base": args.base, "path": args.path, "pinned": args.pinned, "load": "now" if args.load_now else "lazy"})
        print(table([answer["adapter"]]))
        if "loaded" in answer:
            print("loaded:\n" + _outcomes(answer["loaded"]))
    elif args.action == "remove":
        answer = call_node(args, "DELETE", f"/admin/adapters/{args.name}")
        print(f"removed {answer['removed']}; unloaded:\n" + _outcomes(answer["unloaded"]))
    else:
        answer = call_node(args, "POST", f"/admin/adapters/{args.name}/{args.action}")
        print(f"{args.action}ed:\n" + _outcomes(answer[args.action + "ed"]))
    return 0

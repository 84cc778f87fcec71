"""``smg-node workers list|add|remove``: the cluster's workers through a node's control plane (/workers).

``list`` shows each worker's role (regular, prefill, decode; a prefill's bootstrap port), health and circuit;
``add`` registers one (``--worker-type prefill --bootstrap-port 8998`` for half of a disaggregated pair), and in a
cluster every node then routes to it; ``remove`` drains it everywhere. ``--url`` and ``--admin-token`` as for
``smg-node keys``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .node_client import call_node, node_options

COLUMNS = ("id", "type", "url", "models", "healthy", "circuit", "in_flight")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    node_options(parser, nested=False)
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="the workers, with their roles, health and circuits")
    node_options(listing, nested=True)
    listing.add_argument("--json", action="store_true", help="the node's JSON instead of a table")
    add = actions.add_parser("add", help="register a worker on every node")
    node_options(add, nested=True)
    # Its own name: --url is the node the command talks to (one argparse destination for both made `workers add
    # URL --url NODE` register the node itself).
    add.add_argument("worker_url", metavar="URL",
                     help="grpc://host:port (SGLang/vLLM gRPC) or http(s)://host:port (OpenAI-compatible)")
    add.add_argument("--worker-type", choices=("regular", "prefill", "decode"), default="regular",
                     help="prefill or decode: one half of a disaggregated pair")
    add.add_argument("--bootstrap-port", type=int, default=None, help="a prefill engine's bootstrap port "
                                                                      "(SGLang's --disaggregation-bootstrap-port)")
    add.add_argument("--model", default=None, help="the model name to serve it as (default: what it reports)")
    remove = actions.add_parser("remove", help="drain a worker on every node (requests in flight finish)")
    node_options(remove, nested=True)
    remove.add_argument("id")


def table(workers: "list[dict[str, Any]]") -> str:
    rows = [COLUMNS]
    for w in workers:
        role = w.get("worker_type", "regular")
        if w.get("bootstrap_port"):
            role += f":{w['bootstrap_port']}"
        rows.append((w["id"], role, w["url"], ",".join(w["models"]), "yes" if w["healthy"] else "no",
                     w["circuit_state"] + (" draining" if w["draining"] else ""), str(w["in_flight"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        workers = call_node(args, "GET", "/workers")["workers"]
        print(json.dumps(workers, indent=2) if args.json else table(workers) if workers else
              "no workers (add one: smg-node workers add URL)")
    elif args.action == "add":
        body = {"url": args.worker_url, "worker_type": args.worker_type, "bootstrap_port": args.bootstrap_port,
                "model": args.model}
        worker = call_node(args, "POST", "/workers", {k: v for k, v in body.items() if v is not None})
        print(table([worker]))
    else:
        answer = call_node(args, "DELETE", f"/workers/{args.id}")
        print(f"draining {answer['id']} ({answer['in_flight']} requests in flight)")
    return 0

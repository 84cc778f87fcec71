"""``smg-node models``: the routed models and their targets through a node's control plane (/admin/models): each
route's targets in order (a provider's model, or the fleet's pool), each target's provider, credential reference and
quota, and how long it still cools down. ``--url`` and ``--admin-token`` as for ``smg-node keys``; ``--json`` for
the node's own answer.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .node_client import call_node, node_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    node_options(parser, nested=False)
    parser.add_argument("--json", action="store_true", help="the node's JSON instead of tables")


def _table(rows: "list[tuple[str, ...]]") -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows)


def tables(config: "dict[str, Any]") -> str:
    routes = [("model", "targets (in order)", "falls back on", "tenants")]
    for name, route in sorted(config["routes"].items()):
        order = ", ".join((e.get("target") or f"pool:{e['pool']}") + (f" p{e['priority']}" if e.get("priority") else "")
                          + (f" w{e['weight']:g}" if e.get("weight") else "") for e in route["targets"])
        routes.append((name, order, ",".join(route["fallback_on"]), ",".join(route["tenants"] or ["all"])))
    targets = [("target", "provider", "model", "credential", "rpm", "tpm", "cooling")]
    for name, target in sorted(config["targets"].items()):
        targets.append((name, target["provider"], target["model"], target["credential"] or "-",
                        str(target["rpm"] or "-"), str(target["tpm"] or "-"),
                        f"{target['cooldown_s']:g} s" if target["cooldown_s"] else "no"))
    return _table(routes) + "\n\n" + _table(targets)


def run(args: argparse.Namespace) -> int:
    config = call_node(args, "GET", "/admin/models")
    print(json.dumps(config, indent=2) if args.json else tables(config))
    return 0

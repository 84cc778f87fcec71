"""``smg-node spend`` and ``smg-node budgets``: the cluster's spend report and its budgets, through a node's
control plane (/admin/spend, /admin/budgets). ``--url`` and ``--admin-token`` as for ``smg-node keys``.

    smg-node spend --by tenant,model --since 2026-11-01 --until 2026-11-30 [--tenant T] [--format csv|json]
    smg-node budgets list
    smg-node budgets set tenant team-a 100 --period month [--soft] [--window-secs N]
    smg-node budgets remove tenant team-a
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import urllib.parse

from .node_client import call_node, node_options

VALUES = ("requests", "input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens", "cost_usd")


def add_spend_arguments(parser: argparse.ArgumentParser) -> None:
    node_options(parser, nested=False)
    parser.add_argument("--by", default="key", help="group by these, comma-separated: day, month, key, tenant, "
                                                    "model, target (default key)")
    parser.add_argument("--since", help="first day, YYYY-MM-DD (UTC)")
    parser.add_argument("--until", help="last day, YYYY-MM-DD (UTC)")
    for field in ("key", "tenant", "model", "target"):
        parser.add_argument(f"--{field}", help=f"only this {field}")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    node_options(parser, nested=False)
    actions = parser.add_subparsers(dest="action", required=True)
    node_options(actions.add_parser("list", help="the budgets in force"), nested=True)
    put = actions.add_parser("set", help="set one budget (on every node)")
    node_options(put, nested=True)
    put.add_argument("scope", choices=("key", "tenant"))
    put.add_argument("name", help="the key's id (smg-node keys list) or the tenant")
    put.add_argument("amount_usd", type=float)
    budget_options(put)
    remove = actions.add_parser("remove", help="remove one budget")
    node_options(remove, nested=True)
    remove.add_argument("scope", choices=("key", "tenant"))
    remove.add_argument("name")


def budget_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """A budget's fields as flags (``smg-node keys create`` takes them with ``budget-`` before each)."""
    parser.add_argument(f"--{prefix}period", dest="budget_period", choices=("day", "week", "month", "rolling"),
                        default="month")
    parser.add_argument(f"--{prefix}window-secs", dest="budget_window_secs", type=float, default=None,
                        help="a rolling budget's window")
    parser.add_argument(f"--{prefix}soft", dest="budget_soft", action="store_true",
                        help="count and alert, never refuse")


def budget_body(args: argparse.Namespace, amount_usd: float) -> dict:
    body = {"amount_usd": amount_usd, "period": args.budget_period, "mode": "soft" if args.budget_soft else "hard"}
    if args.budget_window_secs is not None:
        body["window_secs"] = args.budget_window_secs
    return body


def run_spend(args: argparse.Namespace) -> int:
    query = {"group_by": args.by}
    for field in ("since", "until", "key", "tenant", "model", "target"):
        if getattr(args, field):
            query[field] = getattr(args, field)
    answer = call_node(args, "GET", "/admin/spend?" + urllib.parse.urlencode(query))
    groups, rows = answer["group_by"], answer["data"]
    if args.format == "json":
        print(json.dumps(answer, indent=2))
    elif args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow([*groups, *VALUES])
        for row in rows:
            writer.writerow([*(row[g] for g in groups), *(row[v] for v in VALUES)])
    else:
        table = [(*groups, "requests", "input", "output", "cost_usd")]
        table += [(*(str(row[g]) or "-" for g in groups), str(row["requests"]), str(row["input_tokens"]),
                   str(row["output_tokens"]), f"{row['cost_usd']:.6f}") for row in rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        for r in table:
            print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
        print(f"total: ${answer['total_cost_usd']:.6f}")
    return 0


def run_budgets(args: argparse.Namespace) -> int:
    if args.action == "list":
        budgets = call_node(args, "GET", "/admin/budgets")["budgets"]
        if not budgets:
            print("no budgets (set one: smg-node budgets set tenant NAME AMOUNT)")
        for b in budgets:
            scope = "key" if "key" in b else "tenant"
            seen = b["spent_ratio_seen"]
            print(f"{scope} {b[scope]}  ${b['amount_usd']:,.2f} per {b['period']}  {b['mode']}  "
                  f"{'-' if seen is None else f'{seen * 100:.1f} % spent (last seen)'}")
    elif args.action == "set":
        path = f"/admin/budgets/{args.scope}/{urllib.parse.quote(args.name, safe='')}"
        print(json.dumps(call_node(args, "PUT", path, budget_body(args, args.amount_usd)), indent=2))
    else:
        call_node(args, "DELETE", f"/admin/budgets/{args.scope}/{urllib.parse.quote(args.name, safe='')}")
        print(f"removed the budget of {args.scope} {args.name}")
    return 0

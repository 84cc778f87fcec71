"""The spend report and budgets through the control plane (``smg-node spend``, ``smg-node budgets``).

    GET /admin/spend     ?group_by=key,model&since=YYYY-MM-DD&until=YYYY-MM-DD&key=&tenant=&model=&target=
                         &format=csv: the cluster's spend summed by the fields asked (gateway/spend/ledger.py)
    GET /admin/budgets   the budgets in force, each with what this node last saw of its spend
    PUT /admin/budgets   the budgets whole ({budgets: [...]}, as the file's), in force on every node
    PUT /admin/budgets/{scope}/{name}    one budget set (its fields as in the file, without key/tenant)
    DELETE /admin/budgets/{scope}/{name} one budget removed
"""

from __future__ import annotations

import re

from ..spend import GROUPS, BudgetError, ReportError, parse_budget, parse_budget_set, report, report_csv
from .errors import BadRequest, NotFound
from .http import Request
from .protocol import parse_json_body
from .state import GatewayState

_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
CSV_HEADERS = [(b"content-type", b"text/csv; charset=utf-8")]


async def get_spend(state: GatewayState, request: Request) -> None:
    query = request.query()
    group_by = tuple(g for g in query.get("group_by", "key").split(",") if g)
    for bound in ("since", "until"):
        if query.get(bound) is not None and not _DAY.fullmatch(query[bound]):
            raise BadRequest(f"'{bound}' is a day, YYYY-MM-DD", param=bound, code="invalid_spend_query")
    filters = {f: query[f] for f in ("key", "tenant", "model", "target") if query.get(f)}
    if "key" in filters and not filters["key"].startswith(("key:", "anonymous")):
        filters["key"] = f"key:{filters['key']}"  # as smg-node keys list shows ids
    state.spend.fold()  # this node's latest requests too
    try:
        entries = report(state.spend.ledger, group_by, query.get("since"), query.get("until"), filters)
    except ReportError as e:
        raise BadRequest(str(e), param="group_by", code="invalid_spend_query") from None
    if query.get("format") == "csv":
        await request.send_bytes(200, report_csv(entries, group_by).encode(), CSV_HEADERS)
        return
    total = sum(e["cost_usd"] for e in entries)
    await request.send_json(200, {"group_by": list(group_by), "groups": list(GROUPS), "since": query.get("since"),
                                  "until": query.get("until"), "total_cost_usd": round(total, 10),
                                  "data": entries})


def _budgets_answer(state: GatewayState) -> dict:
    spend = state.spend
    out = []
    for (scope, name), budget in spend.budgets.by_scope.items():
        entry = budget.to_dict()
        ratio = spend.last_ratio.get((scope, name))
        entry["spent_ratio_seen"] = round(ratio, 6) if ratio is not None else None
        out.append(entry)
    return {"budgets": out}


async def get_budgets(state: GatewayState, request: Request) -> None:
    await request.send_json(200, _budgets_answer(state))


async def put_budgets(state: GatewayState, request: Request) -> None:
    try:
        budgets = parse_budget_set(parse_json_body(await request.body()))
    except BudgetError as e:
        raise BadRequest(f"budgets: {e}", code="invalid_budgets") from None
    state.spend.publish_budgets(budgets)
    await request.send_json(200, _budgets_answer(state))


def _scope_name(request: Request) -> tuple[str, str]:
    scope, name = request.path_params["scope"], request.path_params["name"]
    if scope not in ("key", "tenant"):
        raise NotFound(f"no budget scope {scope!r}: key or tenant", code="not_found")
    return scope, name


async def put_budget(state: GatewayState, request: Request) -> None:
    scope, name = _scope_name(request)
    body = parse_json_body(await request.body())
    try:
        budget = parse_budget({**{k: v for k, v in body.items() if k not in ("key", "tenant")}, scope: name},
                              "budget")
        budgets = state.spend.budgets.with_budget(budget)
    except BudgetError as e:
        raise BadRequest(str(e), code="invalid_budgets") from None
    state.spend.publish_budgets(budgets)
    await request.send_json(200, budget.to_dict())


async def delete_budget(state: GatewayState, request: Request) -> None:
    scope, name = _scope_name(request)
    spend = state.spend
    if (scope, name) not in spend.budgets.by_scope:
        raise NotFound(f"no budget for {scope} {name!r}", code="not_found")
    spend.publish_budgets(spend.budgets.without(scope, name))
    await request.send_json(200, {"deleted": True, scope: name})

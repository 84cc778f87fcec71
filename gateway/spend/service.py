"""The spend subsystem's service: what each answered request cost, the cluster's ledger of it, and budgets.

``record`` is called once per request when its answer ends (gateway/api/app.py), with the usage it reported:
its cost is the price of what answered it (prices.py) times that usage, added to this node's ledger row and to
the node's counters. ``budget_counters`` gives the rate limiter the counters a request reserves before it runs
(budgets.py), ``crossed`` says which thresholds a decision passed.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import trio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..auth import ANONYMOUS
from ..base.options import Option, secs_ms
from ..observe.metrics import counter, gauge
from ..ratelimit.algorithms import Mode
from .budgets import BUDGETS_SETTING, Budget, BudgetSet, crossed
from .exchange import SpendExchange
from .ledger import ROW_CHARS_MAX, LedgerConfig, SpendLedger
from .prices import FREE, Price

log = logging.getLogger("gateway.spend")
PRICES_REMEMBERED_MAX = 4096
# How often a budget's owner checks its counter against the ledger (and at once after a pull brought rows): what a
# healed partition or a successor may have under-counted is caught within it.
RECONCILE_INTERVAL_S = 5.0


@dataclasses.dataclass(frozen=True)
class SpendConfig:
    budgets_file: Path | None = None
    # x-smg-cost on whole answers (the dollars this answer cost): opt-in, it tells clients the operator's prices.
    cost_header: bool = False
    # Rows sent to peers and journaled this often: what a crash may lose of this node's ledger (not of budgets).
    push_interval_s: float = 1.0
    # A whole peer's ledger pulled this often (and at start): what a push missed comes back within it.
    pull_interval_s: float = 60.0
    peer_timeout_s: float = 2.0
    ledger: LedgerConfig = LedgerConfig()


class Spend:
    def __init__(self, config: SpendConfig, budgets: BudgetSet, providers: Any = None, cluster: Any = None,
                 clock: Any = time.time, node_name: str = "local", settings: Any = None, limiter: Any = None) -> None:
        self.config = config
        self.budgets = budgets
        self.settings = settings  # the cluster's document (or a lone node's): budgets set at run time go there
        self.cluster = cluster
        self.limiter = limiter  # the rate limiter whose counters hold the budgets (reconcile)
        self.reconciled = 0  # budget counters raised to the ledger's spend
        self.providers = providers
        self.clock = clock
        self.ledger = SpendLedger(cluster.node_name if cluster is not None else node_name, config.ledger)
        self.exchange = SpendExchange(self.ledger, cluster, clock, config.push_interval_s, config.pull_interval_s,
                                      config.peer_timeout_s)
        # This node's counters since it started: (tenant, model, target) -> [requests, in, cached, out, reasoning,
        # dollars]; for Prometheus, never pruned (a counter only grows).
        self.counted: dict[tuple[str, str, str], list[float]] = {}
        self.alerts: dict[tuple[str, str], int] = {}  # (scope, threshold) -> crossings seen here
        self.last_ratio: dict[tuple[str, str], float] = {}  # (scope, name) -> spent / amount, last seen here
        self.refused: dict[str, int] = {}  # scope -> requests refused by a hard budget here
        # (key, tenant, model, target) -> [requests, input, cached, output, reasoning, dollars] since the last fold
        self._pending: dict[tuple[Any, ...], list[Any]] = {}
        self.hit_price = "free"  # a response cache hit's price (gateway/cache): "free" or "cached"
        self._prices: dict[tuple[Any, ...], Price] = {}
        self._prices_of: Any = None  # the routes _prices was made from
        self._priced = False  # whether they price anything
        self.tenant_header = b"x-smg-tenant"  # the rate limits' (--tenant-header), for unauthenticated requests
        self.exchange.before_round = self.fold
        self._reconcile_now = trio.Event()
        self.exchange.after_pull = self._reconcile_now.set

    @property
    def budgets(self) -> BudgetSet:
        return self._budgets

    @budgets.setter
    def budgets(self, budgets: BudgetSet) -> None:
        self._budgets = budgets
        self.budgets_active = bool(budgets.by_scope)  # read by every request: an attribute, not a computation

    def set_budgets(self, budgets: BudgetSet) -> None:
        self.budgets = budgets

    def publish_budgets(self, budgets: BudgetSet) -> None:
        """Budgets set at run time: in force here at once, on every node through the document, kept on disk."""
        self.budgets = budgets
        if self.settings is not None:
            self.settings.set_setting(BUDGETS_SETTING, budgets.to_dict())

    # -- prices and costs -------------------------------------------------------

    def price(self, model: str | None, route: str | None, target: str | None) -> Price:
        """What answers of ``target`` (a route entry's name) for the public ``route`` (else ``model``) cost."""
        providers = self.providers
        if providers is None:
            return FREE
        routes = providers.routes
        found = routes.get(route or model) if (route or model) else None
        if found is None:
            return FREE
        return found.price_of(target, routes.targets)

    def _price_of(self, model: str | None, route: str | None, target: str | None) -> Price:
        """``price``, remembered per (model, route, target) until the routes are replaced (the request path's)."""
        routes = self.providers.routes if self.providers is not None else None
        if routes is not self._prices_of:
            self._prices = {}
            self._prices_of = routes
            self._priced = routes is not None and (any(t.price is not None for t in routes.targets.values()) or any(
                r.price is not None for r in routes.routes.values()))
        if not self._priced:  # no price anywhere: every answer is free
            return FREE
        key = (model, route, target)
        price = self._prices.get(key)
        if price is None:
            if len(self._prices) >= PRICES_REMEMBERED_MAX:
                self._prices.clear()
            price = self._prices[key] = self.price(model, route, target)
        return price

    def cost_of(self, request: Any) -> float:
        """What the request's usage cost: its target's price (a response cache hit's: ``hit_price``). The one rule
        for the ledger and for x-smg-cost."""
        providers = self.providers
        if not self._priced and (providers is None or providers.routes is self._prices_of):
            return 0.0  # nothing is priced (the usual case without a models config): no lookup
        price = self._price_of(request.model, request.route, request.target)
        if price is FREE:
            return 0.0
        usage = request.usage
        if request.cache_status == b"hit":
            if self.hit_price == "free":
                return 0.0
            return (usage.prompt_tokens + usage.completion_tokens) * price.cached_input_usd_per_mtok / 1e6
        return price.cost_usd(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens,
                              usage.reasoning_tokens)

    def record(self, request: Any, status: int) -> float | None:
        """The request's answer ended with ``status``: its cost, counted. None when there is nothing to charge: a
        request refused or failed before it generated (a 429, an engine that never answered); one cut off after it
        generated (a client gone, a stream's error) is charged what it generated.

        On the request path the request is only added to its (key, tenant, model, target) sum since the last
        ``fold``, which adds the sums to the ledger and the counters (each round, and before anything reads them)."""
        usage = request.usage
        completion = usage.completion_tokens
        prompt = usage.prompt_tokens
        if prompt + completion <= 0 or (status >= 400 and completion <= 0):
            return None
        model, target = request.model, request.target
        cost = self.cost_of(request)
        principal = request.principal
        if principal is ANONYMOUS:  # the open data plane: the tenant its header names, as the rate limits take it
            tenant = request.headers.get(self.tenant_header)
            tenant = tenant.decode("latin-1")[:ROW_CHARS_MAX] if tenant is not None else None
        else:
            tenant = principal.tenant
        key = (principal.key_id, tenant, model, target)
        sums = self._pending.get(key)
        if sums is None:
            if not self._pending:
                self.exchange.wake()  # the first since the last round: a round follows
            sums = self._pending[key] = [0, 0, 0, 0, 0, 0.0]
        sums[0] += 1
        sums[1] += prompt
        sums[2] += usage.cached_tokens
        sums[3] += completion
        sums[4] += usage.reasoning_tokens
        sums[5] += cost
        return cost

    def fold(self) -> None:
        """The sums recorded since the last fold, into the ledger (today's rows) and the node's counters."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        now = self.clock()
        add, counted = self.ledger.add, self.counted
        for (key, tenant, model, target), sums in pending.items():
            target = target or (f"pool:{model}" if model else "")
            add(now, key, tenant, model, target, *sums)
            labels = (tenant or "", model or "", target)
            values = counted.get(labels)
            if values is None:
                values = counted[labels] = [0.0] * 6
            for i, v in enumerate(sums):
                values[i] += v

    # -- budgets ------------------------------------------------------------------

    def budget_counters(self, principal: Any, estimate_usd: float) -> list[tuple[Any, str, float]]:
        """The counters (spec, key, dollars) a request of ``principal`` reserves: its key's and tenant's budgets.
        Only an authenticated caller has budgets: a tenant header anyone may set names nobody."""
        if not principal.authenticated:
            return []
        key_id = principal.key_id[4:] if principal.key_id.startswith("key:") else principal.key_id
        now = self.clock()
        return [(*budget.counter(now)[:2], estimate_usd) for budget in self.budgets.of(key_id, principal.tenant)]

    def budget_of(self, spec_name: str, key: str) -> Budget | None:
        """The budget a counter of the limiter is (``budget-tenant:team-a:2026-11``)."""
        scope = spec_name.removeprefix("budget-")
        name = key[len(spec_name) + 1:]
        found = self.budgets.by_scope.get((scope, name))
        if found is None and ":" in name:  # a calendar period's counter ends with its period
            found = self.budgets.by_scope.get((scope, name.rsplit(":", 1)[0]))
        return found

    def observe(self, budget: Budget, spent_usd: float, hits_usd: float) -> None:
        """A decision on ``budget``'s counter: ``spent_usd`` counted after it, ``hits_usd`` of them this one's."""
        ratio = spent_usd / budget.amount_usd
        self.last_ratio[(budget.scope, budget.name)] = ratio
        for threshold in crossed(budget.thresholds, (spent_usd - hits_usd) / budget.amount_usd, ratio):
            key = (budget.scope, f"{threshold:g}")
            self.alerts[key] = self.alerts.get(key, 0) + 1
            log.warning("budget of %s %s at %d %% (%s, $%.2f spent)", budget.scope, budget.name,
                        round(threshold * 100), budget.describe(), spent_usd)

    def reconcile(self) -> int:
        """As the owner of calendar budgets' counters: each raised to the spend the ledger holds for its period.

        A counter can under-count: a healed partition merges the two sides' counts as the larger of the two (each
        side spent from the same start), a successor misses what was decided after the last replication. The
        ledger sums every node's answers exactly (ledger.py), so the owner takes the larger of the two; it never
        lowers a count (a count holds reservations not settled yet). Rolling budgets have no calendar period to
        sum: they are left to the counter. The budgets raised."""
        if self.cluster is None or self.limiter is None or not self.budgets_active:
            return 0
        self.fold()
        now = self.clock()
        raised = 0
        node = self.cluster.node_name
        for budget in list(self.budgets.by_scope.values()):
            if budget.period == "rolling":
                continue
            spec, key, period = budget.counter(now)
            if self.cluster.ring.owner(key) != node:
                continue
            spent = self.ledger.spent(budget.scope, budget.name, period.days())
            entry = self.limiter.store.get(key)
            counted = entry.state.current if entry is not None else 0.0
            if spent > counted + 1e-9:
                self.limiter.decide_owned(key, spec.rate, spent - counted, Mode.FORCE)
                raised += 1
        if raised:
            log.info("budgets: %d counters raised to the spend the ledger holds", raised)
        self.reconciled += raised
        return raised

    # -- background and metrics ----------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.cluster is not None:
                nursery.start_soon(self._reconcile_loop)
            await nursery.start(self.exchange.run)
            task_status.started()

    async def _reconcile_loop(self) -> None:
        """Now and then, at once after a pull brought rows, and after a ring change (a heal, a death)."""
        while True:
            with trio.move_on_after(RECONCILE_INTERVAL_S):
                async with trio.open_nursery() as race:
                    async def now() -> None:
                        await self._reconcile_now.wait()
                        race.cancel_scope.cancel()

                    async def ring() -> None:
                        await self.cluster.ring_changed.wait()
                        race.cancel_scope.cancel()

                    race.start_soon(now)
                    race.start_soon(ring)
            self._reconcile_now = trio.Event()
            self.exchange.after_pull = self._reconcile_now.set
            self.reconcile()

    def metric_families(self) -> Iterator[Any]:
        self.fold()
        rows = list(self.counted.items())
        yield counter("smg_spend_usd", "Dollars this node's answers cost, at the models config's prices",
                      ["tenant", "model", "target"], [(list(k), v[5]) for k, v in rows])
        yield counter("smg_spend_requests", "Answered requests this node counted in the spend ledger",
                      ["tenant", "model", "target"], [(list(k), v[0]) for k, v in rows])
        kinds = (("input", 1), ("cached_input", 2), ("output", 3), ("reasoning", 4))
        yield counter("smg_spend_tokens", "Tokens of this node's answers, by kind (cached_input of input, reasoning "
                      "of output)", ["tenant", "model", "target", "kind"],
                      [([*k, kind], v[i]) for k, v in rows for kind, i in kinds])
        yield counter("smg_budget_alerts", "Budget thresholds crossed by a decision of this node", ["scope",
                      "threshold"], [(list(k), v) for k, v in self.alerts.items()])
        yield counter("smg_budget_refused", "Requests refused by a hard budget on this node", ["scope"],
                      [([k], v) for k, v in self.refused.items()])
        yield gauge("smg_budget_spent_ratio", "Spent over amount of each budget, as last decided for this node",
                    ["scope", "name"], [(list(k), v) for k, v in self.last_ratio.items()])
        exchange = self.exchange
        yield gauge("smg_spend_ledger_rows", "Rows of the spend ledger this node holds (every node's)", [],
                    [([], self.ledger.rows)])
        yield counter("smg_spend_exchange_events", "The spend ledger's exchanges with peers", ["event"],
                      [(["bad_frame"], exchange.bad_frames), (["push_failed"], exchange.pushes_failed),
                       (["pull"], exchange.pulls), (["rows_dropped"], self.ledger.rows_dropped)])


OPTIONS = (
    Option("--budgets", "spend.budgets_file", Path, "TOML file of budgets per key and tenant ([[budgets]]; see "
           "docs/spend.md)", "spend"),
    Option("--cost-header", "spend.cost_header", "bool", "add x-smg-cost (dollars) to whole answers", "spend"),
    Option("--spend-push-interval-ms", "spend.push_interval_s", secs_ms, "spend rows sent to peers and journaled "
           "this often", "spend"),
)

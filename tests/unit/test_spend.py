"""Spend without I/O: prices and costs, the ledger's rows (merge, retention, bounds, report), budgets (parsing,
periods, counters) and the fixed-period counter they stand on."""

from __future__ import annotations

import calendar
import time

import pytest

from gateway.ratelimit.algorithms import Algorithm, KeyState, Mode, Rate, decide, is_idle, merge_max
from gateway.ratelimit.limits import LimitConfigError, parse_limit_set
from gateway.spend import BudgetError, PriceError, parse_budget, parse_budget_set, parse_price, report, report_csv
from gateway.spend.budgets import crossed, period_of
from gateway.spend.ledger import BadRows, LedgerConfig, SpendLedger, row_from_wire

NOV_29 = calendar.timegm((2026, 11, 29, 12, 0, 0))


def at(day: str, hour: int = 12) -> float:
    return calendar.timegm(time.strptime(day, "%Y-%m-%d")) + hour * 3600


# -- prices -------------------------------------------------------------------------------------------------

def test_a_cost_charges_cached_and_reasoning_tokens_at_their_own_prices():
    price = parse_price({"price_usd_per_mtok": {"input": 3.0, "cached_input": 0.3, "output": 15.0,
                                                "reasoning": 20.0}, "price_usd_per_request": 0.001}, "t")
    # 1,000 prompt tokens of which 400 cached; 500 completion tokens of which 200 reasoning.
    cost = price.cost_usd(1000, 500, cached_tokens=400, reasoning_tokens=200)
    assert cost == pytest.approx((600 * 3 + 400 * 0.3 + 300 * 15 + 200 * 20) / 1e6 + 0.001)
    # The reservation: no cache assumed, every output token at the dearer price.
    assert price.estimate_usd(1000, 500) == pytest.approx((1000 * 3 + 500 * 20) / 1e6 + 0.001)


def test_unsaid_prices_default_to_the_plain_ones_and_zero():
    price = parse_price({"price_usd_per_mtok": {"input": 2.0, "output": 8.0}}, "t")
    assert (price.cached_input_usd_per_mtok, price.reasoning_usd_per_mtok, price.request_usd) == (2.0, 8.0, 0.0)
    assert parse_price({}, "t") is None
    assert parse_price({"price_usd_per_request": 0.5}, "t").cost_usd(0, 0) == 0.5


@pytest.mark.parametrize("spec", [{"price_usd_per_mtok": {"input": -1}}, {"price_usd_per_mtok": {"inptu": 1}},
                                  {"price_usd_per_mtok": {"input": float("nan")}}, {"price_usd_per_mtok": 3},
                                  {"price_usd_per_request": True}, {"price_usd_per_mtok": {"output": 1e9}}])
def test_a_bad_price_is_refused_naming_its_field(spec):
    with pytest.raises(PriceError, match="models.x"):
        parse_price(spec, "models.x")


def test_the_models_config_prices_targets_and_routes():
    from gateway.providers.routes import parse_routes

    routes = parse_routes({
        "targets": {"gpt": {"provider": "openai", "model": "gpt-x", "credential": "env:K",
                            "price_usd_per_mtok": {"input": 1.0, "output": 2.0}},
                    "cheap": {"provider": "openai", "model": "gpt-y", "credential": "env:K"}},
        "models": {"smart": {"targets": [{"target": "gpt"}, {"target": "cheap"}, {"pool": "Qwen/Qwen3-8B"}],
                             "price_usd_per_mtok": {"input": 0.1, "output": 0.2}}}})
    route = routes.get("smart")
    assert route.price_of("gpt", routes.targets).output_usd_per_mtok == 2.0
    assert route.price_of("cheap", routes.targets).output_usd_per_mtok == 0.2  # no price of its own: the route's
    assert route.price_of("pool:Qwen/Qwen3-8B", routes.targets).input_usd_per_mtok == 0.1
    described = routes.describe({})
    assert described["targets"]["gpt"]["price_usd_per_mtok"]["input"] == 1.0
    assert described["routes"]["smart"]["price_usd_per_mtok"]["output"] == 0.2


# -- the ledger ---------------------------------------------------------------------------------------------

def _add(ledger: SpendLedger, now: float, key: str = "key:a", tenant: str = "t", model: str = "m",
         target: str = "pool:m", cost: float = 1.0) -> None:
    ledger.add(now, key, tenant, model, target, 1, 100, 10, 50, 5, cost)


def test_rows_merge_as_grow_only_counters_in_any_order_and_any_number_of_times():
    a, b, c = SpendLedger("a"), SpendLedger("b"), SpendLedger("c")
    _add(a, NOV_29)
    first = a.take_dirty()
    _add(a, NOV_29)
    second = a.take_dirty()
    _add(b, NOV_29, cost=0.5)
    # c hears a's second copy, then the stale first one, then b's twice: it counts each origin's latest once.
    for origin, rows in (("a", second), ("a", first), ("b", b.take_dirty()), ("b", b.wire()["b"])):
        c.merge(origin, rows, "2026-11-29")
    (entry,) = report(c, ("tenant",))
    assert entry == {"tenant": "t", "requests": 3, "input_tokens": 300, "cached_tokens": 30, "output_tokens": 150,
                     "reasoning_tokens": 15, "cost_usd": 2.5}


def test_a_node_restarted_empty_gets_its_own_rows_back_from_a_peer():
    a, peer = SpendLedger("a"), SpendLedger("b")
    _add(a, NOV_29, cost=2.0)
    peer.merge("a", a.take_dirty(), "2026-11-29")
    restarted = SpendLedger("a")
    restarted.merge("a", peer.wire()["a"], "2026-11-29")
    _add(restarted, NOV_29, cost=1.0)  # counts on from where it was
    assert report(restarted, ("key",))[0]["cost_usd"] == 3.0


def test_a_report_groups_filters_and_bounds_by_day():
    ledger = SpendLedger("a")
    _add(ledger, at("2026-10-31"), tenant="x", cost=1.0)
    _add(ledger, at("2026-11-01"), tenant="x", model="big", cost=4.0)
    _add(ledger, at("2026-11-02"), tenant="y", cost=2.0)
    by_month = report(ledger, ("month",))
    assert [(e["month"], e["cost_usd"]) for e in by_month] == [("2026-11", 6.0), ("2026-10", 1.0)]
    november = report(ledger, ("tenant", "model"), since="2026-11-01", until="2026-11-30")
    assert [(e["tenant"], e["model"], e["cost_usd"]) for e in november] == [("x", "big", 4.0), ("y", "m", 2.0)]
    assert report(ledger, ("day",), filters={"tenant": "y"}) == [
        {"day": "2026-11-02", "requests": 1, "input_tokens": 100, "cached_tokens": 10, "output_tokens": 50,
         "reasoning_tokens": 5, "cost_usd": 2.0}]
    csv = report_csv(november, ("tenant", "model"))
    assert csv.splitlines()[0] == "tenant,model,requests,input_tokens,cached_tokens,output_tokens,reasoning_tokens," \
                                  "cost_usd"
    assert csv.splitlines()[1] == "x,big,1,100,10,50,5,4.0"


def test_rows_past_the_retention_are_forgotten_and_the_bound_drops_the_oldest_day():
    ledger = SpendLedger("a", LedgerConfig(retention_days=30, rows_max=3))
    _add(ledger, at("2026-10-01"))
    _add(ledger, at("2026-11-28"), key="key:b")
    assert ledger.forget_before("2026-11-29") == 1
    _add(ledger, at("2026-11-28"), key="key:c")
    _add(ledger, at("2026-11-29"), key="key:d")
    _add(ledger, at("2026-11-29"), key="key:e")  # a fourth row: the oldest day's two go
    assert ledger.rows == 2 and ledger.rows_dropped == 2
    assert {e["key"] for e in report(ledger, ("key",))} == {"key:d", "key:e"}
    # A peer's row past the retention is not taken.
    assert ledger.merge("b", [["2026-01-01", "k", "", "", "", 1, 1, 0, 1, 0, 1.0]], "2026-11-29") == 0


@pytest.mark.parametrize("item", [
    ["2026-11-29", "k", "", "", ""],  # too short
    ["2026-11-29", "k", "", "", "", 1, 1, 0, 1, 0, -1.0],  # negative
    ["2026-11-29", "k", "", "", "", 1, 1, 0, 1, 0, float("inf")],
    ["2026-11-29", 7, "", "", "", 1, 1, 0, 1, 0, 1.0],
    ["2026-11-29", "k" * 300, "", "", "", 1, 1, 0, 1, 0, 1.0],
    ["yesterday", "k", "", "", "", 1, 1, 0, 1, 0, 1.0],
    ["2026-11-29", "k", "", "", "", 1, 1, 0, 1, 0, True],
])
def test_a_peers_malformed_row_is_refused(item):
    with pytest.raises(BadRows):
        row_from_wire(item)


# -- budgets ----------------------------------------------------------------------------------------------

def test_calendar_periods_are_utc_days_iso_weeks_and_months():
    assert period_of("day", NOV_29).id == "2026-11-29"
    week = period_of("week", NOV_29)  # a Sunday: its ISO week began on Monday the 23rd
    assert week.id == "2026-W48" and week.starts_s == at("2026-11-23", 0) and week.ends_s == at("2026-11-30", 0)
    december = period_of("month", at("2026-12-31", 23))
    assert december.id == "2026-12" and december.ends_s == at("2027-01-01", 0)
    assert period_of("week", at("2027-01-01")).id == "2026-W53"  # ISO: the week holding Thursday's year


def test_a_budgets_counter_is_named_by_its_period_so_the_next_one_starts_at_zero():
    budget = parse_budget({"tenant": "team-a", "amount_usd": 100, "period": "month"}, "b")
    spec, key, period = budget.counter(NOV_29)
    assert key == "budget-tenant:team-a:2026-11" and spec.rate.algorithm is Algorithm.FIXED_PERIOD
    assert spec.rate.window_s == period.ends_s - period.starts_s and not spec.counts_only
    assert budget.counter(at("2026-12-01"))[1] == "budget-tenant:team-a:2026-12"
    soft = parse_budget({"key": "key:abc", "amount_usd": 5, "mode": "soft", "period": "rolling",
                         "window_secs": 86400}, "b")
    spec, key, period = soft.counter(NOV_29)
    assert (key, period, spec.counts_only, spec.rate.algorithm) == ("budget-key:abc", None, True,
                                                                    Algorithm.SLIDING_WINDOW)


@pytest.mark.parametrize("raw, field", [
    ({"amount_usd": 1}, "names either"), ({"tenant": "t", "key": "k", "amount_usd": 1}, "names either"),
    ({"tenant": "t", "amount_usd": 0}, "amount_usd"), ({"tenant": "t", "amount_usd": 1, "period": "year"}, "period"),
    ({"tenant": "t", "amount_usd": 1, "period": "rolling"}, "window_secs"),
    ({"tenant": "t", "amount_usd": 1, "window_secs": 60}, "window_secs"),
    ({"tenant": "t", "amount_usd": 1, "mode": "strict"}, "mode"),
    ({"tenant": "t", "amount_usd": 1, "thresholds": [2, "x"]}, "thresholds"),
    ({"tenant": "t", "amount_usd": 1, "owner": "x"}, "unknown"),
])
def test_a_bad_budget_is_refused_naming_its_field(raw, field):
    with pytest.raises(BudgetError, match=field):
        parse_budget(raw, "budgets[0]")


def test_a_budget_set_refuses_two_budgets_for_one_tenant_and_round_trips():
    with pytest.raises(BudgetError, match="second"):
        parse_budget_set({"budgets": [{"tenant": "t", "amount_usd": 1}, {"tenant": "t", "amount_usd": 2}]})
    budgets = parse_budget_set({"budgets": [{"tenant": "t", "amount_usd": 1}, {"key": "abc", "amount_usd": 2,
                                                                              "mode": "soft"}]})
    assert parse_budget_set(budgets.to_dict()) == budgets
    assert [b.name for b in budgets.of("abc", "t")] == ["abc", "t"]


def test_thresholds_crossed_are_those_between_before_and_after():
    assert crossed((0.5, 0.8, 1.0), 0.4, 0.85) == [0.5, 0.8]
    assert crossed((0.5, 0.8, 1.0), 0.5, 0.6) == []  # 0.5 was reached by an earlier decision


# -- the fixed-period counter ----------------------------------------------------------------------------

def test_a_fixed_period_counts_until_the_amount_and_never_decays():
    rate = Rate(Algorithm.FIXED_PERIOD, 10.0, 86400.0, 10.0)
    state = KeyState(tat_s=0.0)
    assert decide(rate, state, 1.0, 6.0).allowed
    denied = decide(rate, state, 50_000.0, 5.0)  # half a day later: nothing came back
    assert not denied.allowed and denied.remaining == 4.0 and denied.retry_after_s == pytest.approx(36_400.0)
    assert decide(rate, state, 2.0, 11.0).retry_after_s == float("inf")  # never fits
    decide(rate, state, 3.0, 2.0, Mode.REFUND)
    decide(rate, state, 3.0, 7.0, Mode.FORCE)  # counted past the amount: a settlement above its estimate
    assert state.current == 11.0 and not is_idle(rate, state, 80_000.0)
    assert is_idle(rate, state, 86_400.0)  # the period is over: forgetting it loses nothing
    theirs = KeyState(tat_s=5.0, current=12.0)
    merge_max(rate, state, theirs, 10.0)
    assert (state.current, state.tat_s) == (12.0, 0.0)


def test_a_rate_limit_file_may_not_use_a_budgets_counter():
    with pytest.raises(LimitConfigError, match="budget"):
        parse_limit_set({"limits": [{"name": "x", "limit": 1, "algorithm": "fixed_period"}]})
    with pytest.raises(LimitConfigError, match="budgets"):
        parse_limit_set({"limits": [{"name": "x", "limit": 1, "unit": "usd"}]})


# -- a budget's owner reconciles its counter with the ledger --------------------------------------------------

def test_an_owner_raises_an_under_counting_budget_to_the_ledgers_spend_and_never_lowers_one():
    from gateway.ratelimit import LimitSet, RateLimitConfig, RateLimiter
    from gateway.spend import Spend, SpendConfig, parse_budget_set

    class Ring:
        members = ("a", "b")

        def owner(self, key: str) -> str:
            return "a"

    class Cluster:
        node_name = "a"
        ring = Ring()

        def serve_requests(self, mark, handler) -> None:
            pass

    limiter = RateLimiter(RateLimitConfig(), LimitSet(), node_name="a")
    budgets = parse_budget_set({"budgets": [{"tenant": "t", "amount_usd": 10}, {"key": "abc", "amount_usd": 10},
                                            {"tenant": "r", "amount_usd": 10, "period": "rolling",
                                             "window_secs": 3600}]})
    spend = Spend(SpendConfig(), budgets, cluster=Cluster(), clock=lambda: NOV_29, limiter=limiter)
    tenant_spec, tenant_key, _ = budgets.by_scope[("tenant", "t")].counter(NOV_29)
    limiter.decide_owned(tenant_key, tenant_spec.rate, 2.0, Mode.DECIDE)  # what this owner decided itself
    # A healed partition: the other side's node b answered $5 of tenant t and $3 of key abc, in the same period.
    spend.ledger.merge("b", [["2026-11-03", "key:abc", "t", "m", "pool:m", 3, 30, 0, 15, 0, 3.0],
                             ["2026-11-20", "key:other", "t", "m", "pool:m", 2, 20, 0, 10, 0, 2.0],
                             ["2026-10-31", "key:abc", "t", "m", "pool:m", 9, 90, 0, 45, 0, 9.0]], "2026-11-29")
    assert spend.reconcile() == 2
    assert limiter.store.get(tenant_key).state.current == pytest.approx(5.0)  # October's $9 is another period
    key_spec, key_key, _ = budgets.by_scope[("key", "abc")].counter(NOV_29)
    assert limiter.store.get(key_key).state.current == pytest.approx(3.0)
    limiter.decide_owned(tenant_key, tenant_spec.rate, 4.0, Mode.DECIDE)  # a reservation not settled yet
    assert spend.reconcile() == 0 and limiter.store.get(tenant_key).state.current == pytest.approx(9.0)

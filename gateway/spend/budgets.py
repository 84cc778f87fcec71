"""Budgets: an amount of dollars per period for an API key or a tenant, held by the cluster. No I/O.

A budgets file (``--budgets FILE``, TOML; the same as JSON through ``PUT /admin/budgets``; a key's own with
``smg-node keys create --budget``)::

    [[budgets]]
    tenant = "team-a"          # or key = "<key id>" (smg-node keys list)
    amount_usd = 100.0
    period = "month"           # "day", "week" (ISO, from Monday), "month" (UTC calendar), or "rolling"
    window_secs = 2592000      # rolling only: the window (here 30 days)
    mode = "hard"              # hard: refuse past it (429 budget_exceeded); soft: count and alert only
    thresholds = [0.5, 0.8, 1.0]   # a log line and a metric when spend crosses each fraction
    when_owner_unreachable = "refuse"   # or "share" (admit this node's share: see spend/__init__.py)

A budget is one of the rate limiter's counters (``gateway/ratelimit``): its owner on the ring decides every
request's reservation and replicates the count; a calendar period's counter is named by its period
(``budget-tenant:team-a:2026-11``), so the next period starts at zero by itself. A rolling budget is a sliding
window (the rate limiter's weighted estimate of the last ``window_secs``).
"""

from __future__ import annotations

import calendar
import dataclasses
import datetime
import functools
import math
import time
from typing import Any

from ..ratelimit.algorithms import Algorithm, Rate
from ..ratelimit.limits import FailurePolicy, LimitSpec, Scope, Unit

BUDGETS_SETTING = "budgets"  # the cluster document's setting holding the BudgetSet
BUDGETS_MAX = 10_000
NAME_CHARS_MAX = 256
AMOUNT_USD_MAX = 1e12
PERIODS = ("day", "week", "month", "rolling")
SCOPES = ("key", "tenant")
DEFAULT_THRESHOLDS = (0.5, 0.8, 1.0)
_FIELDS = {"key", "tenant", "amount_usd", "period", "window_secs", "mode", "thresholds", "when_owner_unreachable"}


class BudgetError(ValueError):
    """A budget that cannot be used (the message names the field)."""


@dataclasses.dataclass(frozen=True)
class Period:
    id: str  # "2026-11-29", "2026-W48", "2026-11"; "" for a rolling window
    starts_s: float
    ends_s: float  # when the budget is whole again (a rolling window: never at once)

    def days(self) -> "tuple[str, ...]":
        """The UTC days the period holds (the spend ledger's rows are by day)."""
        return _days(int(self.starts_s), int(self.ends_s))


@functools.lru_cache(maxsize=64)  # a few periods are current at once; each budget's owner asks every 5 s
def _days(starts_s: int, ends_s: int) -> "tuple[str, ...]":
    return tuple(time.strftime("%Y-%m-%d", time.gmtime(t)) for t in range(starts_s, ends_s, 86_400))


def period_of(kind: str, now_s: float) -> Period:
    """The calendar period (UTC) holding ``now_s``."""
    t = time.gmtime(now_s)
    if kind == "day":
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return Period(time.strftime("%Y-%m-%d", t), start, start + 86_400)
    if kind == "week":
        day_start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        start = day_start - t.tm_wday * 86_400  # tm_wday: Monday is 0
        year, week, _ = _iso_week(start)
        return Period(f"{year}-W{week:02d}", start, start + 7 * 86_400)
    if kind == "month":
        start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        return Period(f"{t.tm_year:04d}-{t.tm_mon:02d}", start, calendar.timegm((year, month, 1, 0, 0, 0)))
    raise BudgetError(f"no calendar period {kind!r}")


def _iso_week(monday_s: float) -> tuple[int, int, int]:
    year, week, weekday = datetime.datetime.fromtimestamp(monday_s, datetime.timezone.utc).isocalendar()
    return year, week, weekday


@dataclasses.dataclass(frozen=True)
class Budget:
    scope: str  # SCOPES
    name: str  # the key's id or the tenant
    amount_usd: float
    period: str = "month"
    window_s: float | None = None  # rolling only
    hard: bool = True
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    refuse_unreachable: bool = True

    def counter(self, now_s: float) -> "tuple[LimitSpec, str, Period | None]":
        """The rate limiter's counter for this budget now: its spec, its key, and the calendar period."""
        policy = FailurePolicy.CLOSED if self.refuse_unreachable else FailurePolicy.PROPORTIONAL
        name = f"budget-{self.scope}"
        if self.period == "rolling":
            assert self.window_s is not None
            rate = Rate(Algorithm.SLIDING_WINDOW, self.amount_usd, self.window_s, self.amount_usd)
            return (LimitSpec(name, Scope.GLOBAL, Unit.USD, rate, counts_only=not self.hard, failure_policy=policy),
                    f"{name}:{self.name}", None)
        period = period_of(self.period, now_s)
        rate = Rate(Algorithm.FIXED_PERIOD, self.amount_usd, period.ends_s - period.starts_s, self.amount_usd)
        return (LimitSpec(name, Scope.GLOBAL, Unit.USD, rate, counts_only=not self.hard, failure_policy=policy),
                f"{name}:{self.name}:{period.id}", period)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {self.scope: self.name, "amount_usd": self.amount_usd, "period": self.period,
                               "mode": "hard" if self.hard else "soft", "thresholds": list(self.thresholds),
                               "when_owner_unreachable": "refuse" if self.refuse_unreachable else "share"}
        if self.window_s is not None:
            out["window_secs"] = self.window_s
        return out

    def describe(self) -> str:
        per = f"per {self.period}" if self.period != "rolling" else f"per rolling {_duration(self.window_s or 0)}"
        return f"${self.amount_usd:,.2f} {per}"


def _duration(seconds: float) -> str:
    if seconds % 86_400 == 0:
        return f"{int(seconds // 86_400)} days"
    if seconds % 3_600 == 0:
        return f"{int(seconds // 3_600)} hours"
    return f"{seconds:g} s"


@dataclasses.dataclass(frozen=True)
class BudgetSet:
    by_scope: "dict[tuple[str, str], Budget]" = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.by_scope)

    def of(self, key_id: str | None, tenant: str | None) -> list[Budget]:
        """The budgets a request of this key and tenant counts against."""
        found = []
        if key_id is not None:
            budget = self.by_scope.get(("key", key_id))
            if budget is not None:
                found.append(budget)
        if tenant is not None:
            budget = self.by_scope.get(("tenant", tenant))
            if budget is not None:
                found.append(budget)
        return found

    def with_budget(self, budget: Budget) -> "BudgetSet":
        if (budget.scope, budget.name) not in self.by_scope and len(self.by_scope) >= BUDGETS_MAX:
            raise BudgetError(f"at most {BUDGETS_MAX} budgets")
        return BudgetSet({**self.by_scope, (budget.scope, budget.name): budget})

    def without(self, scope: str, name: str) -> "BudgetSet":
        return BudgetSet({k: v for k, v in self.by_scope.items() if k != (scope, name)})

    def to_dict(self) -> dict[str, Any]:
        return {"budgets": [b.to_dict() for b in self.by_scope.values()]}


def parse_budget(raw: Any, where: str) -> Budget:
    if not isinstance(raw, dict):
        raise BudgetError(f"{where}: a table/object")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise BudgetError(f"{where}: unknown field(s) {', '.join(unknown)}")
    scopes = [s for s in SCOPES if raw.get(s) is not None]
    if len(scopes) != 1:
        raise BudgetError(f"{where}: names either a key (its id) or a tenant")
    scope = scopes[0]
    name = raw[scope]
    if not isinstance(name, str) or not 0 < len(name) <= NAME_CHARS_MAX:
        raise BudgetError(f"{where}.{scope}: a string of 1 to {NAME_CHARS_MAX} characters")
    if scope == "key" and name.startswith("key:"):
        name = name[4:]
    amount = raw.get("amount_usd")
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) \
            or not 0 < amount <= AMOUNT_USD_MAX:
        raise BudgetError(f"{where}.amount_usd: a number of dollars above 0, at most {AMOUNT_USD_MAX:g}")
    period = raw.get("period", "month")
    if period not in PERIODS:
        raise BudgetError(f"{where}.period: one of {', '.join(PERIODS)}, not {period!r}")
    window = raw.get("window_secs")
    if period == "rolling":
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not 60 <= window <= 366 * 86_400:
            raise BudgetError(f"{where}.window_secs: a rolling budget's window, 60 s to 366 days")
        window = float(window)
    elif window is not None:
        raise BudgetError(f"{where}.window_secs: only a rolling budget has a window")
    mode = raw.get("mode", "hard")
    if mode not in ("hard", "soft"):
        raise BudgetError(f"{where}.mode: hard or soft")
    thresholds = raw.get("thresholds", list(DEFAULT_THRESHOLDS))
    if not isinstance(thresholds, list) or len(thresholds) > 16 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 10 for x in thresholds):
        raise BudgetError(f"{where}.thresholds: a list of fractions of the amount (0.8 is 80 %)")
    unreachable = raw.get("when_owner_unreachable", "refuse")
    if unreachable not in ("refuse", "share"):
        raise BudgetError(f"{where}.when_owner_unreachable: refuse or share")
    return Budget(scope, name, float(amount), period, window, mode == "hard",
                  tuple(sorted(float(x) for x in thresholds)), unreachable == "refuse")


def parse_budget_set(raw: Any) -> BudgetSet:
    if not isinstance(raw, dict) or set(raw) - {"budgets"}:
        raise BudgetError("the budgets config is {budgets = [...]}")
    items = raw.get("budgets", [])
    if not isinstance(items, list) or len(items) > BUDGETS_MAX:
        raise BudgetError(f"budgets: a list of at most {BUDGETS_MAX}")
    out: dict[tuple[str, str], Budget] = {}
    for i, item in enumerate(items):
        budget = parse_budget(item, f"budgets[{i}]")
        if (budget.scope, budget.name) in out:
            raise BudgetError(f"budgets[{i}]: a second budget for {budget.scope} {budget.name!r}")
        out[(budget.scope, budget.name)] = budget
    return BudgetSet(out)


def crossed(thresholds: "tuple[float, ...]", before: float, after: float) -> list[float]:
    """The thresholds (fractions) a count that went from ``before`` to ``after`` (fractions) passed."""
    return [t for t in thresholds if before < t <= after + 1e-12]

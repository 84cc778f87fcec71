"""Spend: what each answered request cost, the cluster's ledger of it by key, tenant, model, target and day, and
budgets per key and tenant held by the cluster's counters.

    prices.py    the models config's prices, and a usage's cost
    ledger.py    the ledger's rows (grow-only counters per node), the report
    exchange.py  the ledger between nodes and on disk
    budgets.py   budgets, their periods, their counters
    service.py   the subsystem's service: record, budgets' counters and thresholds, metrics
    subsystem.py the node's registration

How far N nodes together overshoot a hard budget (B its amount; S the rate limiter's sync interval, 50 ms; R the
cluster's spend rate on that budget in dollars per second; D the failure-detection time; F the forward timeout):

* under load, every node up: no overshoot. Each request reserves its most expensive outcome (its prompt and
  max_tokens at the target's price) from the budget's owner before it runs and settles with its real cost after:
  a reservation that does not fit is refused, and a real cost is never above its reservation.
* the owner dies: its successor, a replica, continues from the count last replicated: at most R * S more (the
  reservations decided after the last replication); it applies B times the share of members it sees (4/5 of B
  in a cluster of 5 until the dead member is reaped), so it errs on the side of refusing. Until the death is detected (D) the other nodes cannot reach
  the owner: with ``when_owner_unreachable = "refuse"`` (the default) they refuse the budget's requests (503
  budget_unavailable, retry in a second) rather than guess; with ``"share"`` each admits up to B / N of its own,
  so at most B * (N - 1) / N more, once.
* a partition into k and N - k nodes: until detection, as for a dead owner, on the side without it. After, each
  side's owner applies B times the share of the members it sees (the rate limiter's proportional rule), counting
  from its copy of the count. At the heal the two counts merge as the larger of the two (each side spent from the
  same start), which under-counts by the smaller side's spend; the owner then raises its count to the spend the
  ledger holds (every node's answers summed exactly: ledger.py), at once after pulling the rows of the members
  that came back, and every 5 s (``Spend.reconcile``). The overshoot is what passes between the heal and that:
  measured $0.08 over a $12 budget on three real nodes with six requests in flight. Without the ledger's rows
  (a side that never comes back) it is at most the smaller side's spend during the partition, (k / N) * B.

A soft budget refuses nothing: it counts, alerts at its thresholds, and says so in the metrics.
"""

from .budgets import BUDGETS_SETTING, Budget, BudgetError, BudgetSet, parse_budget, parse_budget_set
from .ledger import GROUPS, ReportError, report, report_csv
from .prices import FREE, Price, PriceError, parse_price
from .service import Spend, SpendConfig

_EXPORTS = (BUDGETS_SETTING, Budget, BudgetError, BudgetSet, parse_budget, parse_budget_set, GROUPS, ReportError,
            report, report_csv, FREE, Price, PriceError, parse_price, Spend, SpendConfig)

"""Spend as a subsystem of the node (gateway/base/subsystem.py): the budgets file checked before the node starts,
the ledger read back from the data directory, kept in step with peers, and the budgets followed through the
cluster's document (``PUT /admin/budgets`` on any node is every node's)."""

from __future__ import annotations

import logging
import tomllib
from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from .budgets import BUDGETS_SETTING, BudgetError, BudgetSet, parse_budget_set
from .service import OPTIONS, Spend, SpendConfig

log = logging.getLogger("gateway.spend")


def budget_set(config: SpendConfig) -> BudgetSet:
    if config.budgets_file is None:
        return BudgetSet()
    try:
        with open(config.budgets_file, "rb") as f:
            return parse_budget_set(tomllib.load(f))
    except (OSError, tomllib.TOMLDecodeError, BudgetError) as e:
        raise ConfigProblem(f"--budgets {config.budgets_file}: {e}") from None


def _check(config: Any) -> None:
    budget_set(config.spend)
    if not 0 < config.spend.push_interval_s <= 60:
        raise ConfigProblem("--spend-push-interval-ms must be from 1 to 60000")


async def _start(context: StartContext) -> Spend:
    config = context.config.spend
    settings = context.need("settings")
    spend = Spend(config, budget_set(config), providers=context.need("providers"), cluster=context.need("cluster"),
                  settings=settings, limiter=context.need("rate_limiter"))
    spend.hit_price = context.config.cache.hit_price  # what a response cache hit costs (gateway/cache)
    spend.tenant_header = context.config.rate_limit.tenant_header.lower().encode("latin-1")
    if settings.data_dir is not None:
        for problem in spend.exchange.keep_on_disk(settings.data_dir, context.config.data_fsync):
            log.warning("spend ledger on disk: %s", problem)

    def on_setting(name: str, value: Any) -> None:
        if name != BUDGETS_SETTING:
            return
        try:
            spend.set_budgets(parse_budget_set(value))
            log.info("budgets changed by a peer (or kept on disk): %d budgets", len(spend.budgets))
        except BudgetError as e:
            log.warning("ignored budgets from a peer: %s", e)

    settings.follow_settings(on_setting)
    await context.nursery.start(spend.run)
    return spend


SUBSYSTEM = Subsystem("spend", SpendConfig(), OPTIONS, _check, _start,
                      needs=("providers", "cluster", "settings", "rate_limiter"))

"""Rate limits as subsystems of the node (gateway/base/subsystem.py): their section, flags and checks (the limits
this node starts with: ``limit_set``), and the cluster's rate limiter (always running: limits can be set at run
time, and it costs nothing while none is set)."""

from __future__ import annotations

import dataclasses
import logging
import tomllib
from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from . import limiter
from .limiter import RateLimitConfig, RateLimiter
from .limits import RATE_LIMITS_SETTING, FailurePolicy, LimitConfigError, LimitSet, parse_limit_set

log = logging.getLogger("gateway.ratelimit")


def limit_set(config: Any) -> LimitSet:
    """The limits a node starts with: --rate-limits' file, --global-rate-limit and --rate-limit-policy;
    ConfigProblem when the file or a flag is wrong."""
    limits = LimitSet()
    if config.rate_limits_file is not None:
        try:
            with open(config.rate_limits_file, "rb") as f:
                limits = parse_limit_set(tomllib.load(f))
        except (OSError, tomllib.TOMLDecodeError, LimitConfigError) as e:
            raise ConfigProblem(f"--rate-limits {config.rate_limits_file}: {e}") from None
    if config.global_rate_limit is not None:
        if not config.global_rate_limit > 0:
            raise ConfigProblem("--global-rate-limit must be a positive number of requests per second")
        limits = limits.with_global_limit(config.global_rate_limit)
    if config.rate_limit_policy is not None:
        try:
            limits = dataclasses.replace(limits, failure_policy=FailurePolicy(config.rate_limit_policy))
        except ValueError:
            raise ConfigProblem("--rate-limit-policy must be proportional, open or closed") from None
    return limits


def _check(config: Any) -> None:
    limit_set(config)
    rl = config.rate_limit
    if rl.batch_wait_s < 0 or rl.batch_items_max < 1 or rl.sync_interval_s <= 0 or rl.forward_timeout_s <= 0:
        raise ConfigProblem("--rate-limit-batch-wait-ms must be >= 0, --rate-limit-batch-max >= 1, and the sync "
                            "interval and forward timeout positive")


async def _start_limiter(context: StartContext) -> RateLimiter:
    config, cluster = context.config, context.need("cluster")
    rate_limiter = RateLimiter(config.rate_limit, limit_set(config), cluster=cluster, metrics=context.need("metrics"))

    def on_setting(name: str, value: Any) -> None:
        if name != RATE_LIMITS_SETTING:
            return
        try:
            rate_limiter.set_limits(parse_limit_set(value))
            log.info("rate limits changed by a peer (or kept on disk): %d limits", len(rate_limiter.limits.limits))
        except LimitConfigError as e:
            log.warning("ignored rate limits from a peer: %s", e)

    context.need("settings").follow_settings(on_setting)
    await context.nursery.start(rate_limiter.run)
    return rate_limiter


RATE_LIMIT = Subsystem("rate_limit", RateLimitConfig(), limiter.OPTIONS, _check)
RATE_LIMITER = Subsystem("rate_limiter", start=_start_limiter, needs=("cluster", "settings", "metrics"))

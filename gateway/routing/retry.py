"""Retry timing: exponential backoff with jitter, as smg computes it.

    delay = min(initial_backoff_s * multiplier ** attempt, max_backoff_s)
    delay *= 1 + uniform(-jitter_factor, +jitter_factor)

``attempt`` counts from 0 (the delay before the first retry). Only failures
that happen before the first token reaches the client are retried: after that,
a retry would repeat text the client already has.
"""

from __future__ import annotations

import dataclasses
import random
from ..base.options import Option, secs_ms


@dataclasses.dataclass(frozen=True)
class RetryConfig:
    enabled: bool = True
    # smg's defaults: 5 retries, 50 ms first backoff x1.5 each time, at most 30 s, +-20 % jitter.
    max_retries: int = 5
    initial_backoff_s: float = 0.050
    max_backoff_s: float = 30.0
    multiplier: float = 1.5
    jitter_factor: float = 0.2

    @property
    def attempts_max(self) -> int:
        return 1 + (self.max_retries if self.enabled else 0)


def backoff_s(config: RetryConfig, attempt: int, rng: random.Random) -> float:
    delay = min(config.initial_backoff_s * config.multiplier ** attempt, config.max_backoff_s)
    if config.jitter_factor:
        delay *= 1 + rng.uniform(-config.jitter_factor, config.jitter_factor)
    return max(0.0, delay)


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--retry-max-retries", "retry.max_retries", int, "retries of a failed attempt", "routing"),
    Option("--retry-initial-backoff-ms", "retry.initial_backoff_s", secs_ms, "first backoff", "routing"),
    Option("--retry-max-backoff-ms", "retry.max_backoff_s", secs_ms, "longest backoff", "routing"),
    Option("--retry-backoff-multiplier", "retry.multiplier", float, "backoff growth per retry", "routing"),
    Option("--retry-jitter-factor", "retry.jitter_factor", float, "random +- share of each backoff", "routing"),
    Option("--disable-retries", "retry.enabled", "disable", "no retries", "routing"),
)

"""Cluster-wide rate limits (see ``limiter.py`` for the design and its overshoot bounds)."""

from .algorithms import Algorithm, Decision, Mode, Rate
from .limiter import RateLimitConfig, RateLimiter, Verdict
from .limits import FailurePolicy, Identity, LimitConfigError, LimitSet, LimitSpec, Scope, Unit, parse_limit_set

__all__ = ["Algorithm", "Decision", "FailurePolicy", "Identity", "LimitConfigError", "LimitSet", "LimitSpec", "Mode",
           "Rate", "RateLimitConfig", "RateLimiter", "Scope", "Unit", "Verdict", "parse_limit_set"]

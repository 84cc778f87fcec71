"""Routing as subsystems of the node (gateway/base/subsystem.py): the policy, retries and the circuit breaker (their
sections and flags), and the KV index cache-aware routing reads (a service: None with --disable-kv-events)."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from . import breaker, kv_index, policies, retry
from .breaker import BreakerConfig
from .kv_index import KvIndex
from .policies import PolicyConfig
from .retry import RetryConfig


def _check_kv(config: Any) -> None:
    if config.kv_event_followers < 1:
        raise ConfigProblem("--kv-event-followers must be at least 1")


async def _start_kv_index(context: StartContext) -> "KvIndex | None":
    config = context.config
    return KvIndex(config.kv_index_blocks_max) if config.kv_events else None


POLICY = Subsystem("policy", PolicyConfig(), policies.OPTIONS)
RETRY = Subsystem("retry", RetryConfig(), retry.OPTIONS)
BREAKER = Subsystem("breaker", BreakerConfig(), breaker.OPTIONS)
KV_INDEX = Subsystem("kv_index", options=kv_index.OPTIONS, check=_check_kv, start=_start_kv_index)

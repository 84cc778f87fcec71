"""Stored responses and conversations as a subsystem of the node (gateway/base/subsystem.py): the section and flags
of every backend (the registered ones bring theirs), their checks, and the store --history-backend chose, ready
before the node serves (a durable one connected and migrated, the memory one replicating over the mesh)."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from . import backends, store
from .backends import HISTORY_BACKENDS
from .store import RECORD_BYTES_MAX, HistoryConfig


def _check(config: Any) -> None:
    backend = HISTORY_BACKENDS[config.history_backend]
    problem = backend.check(config.section(backend.section) if backend.section else None)
    if problem is not None:
        raise ConfigProblem(problem)
    history = config.history
    if history.max_responses < 1 or history.max_items < 1 or history.retention_s <= 0 or history.max_bytes < 1:
        raise ConfigProblem("--history-memory-max-responses, --history-memory-max-items, --history-memory-max-bytes "
                            "and --history-memory-retention-secs must be positive")
    if any(v is not None and v < 1 for v in (history.tenant_max_bytes, history.tenant_max_responses,
                                             history.tenant_max_conversations, history.tenant_max_items)) \
            or not 1 <= history.record_bytes_max <= RECORD_BYTES_MAX:
        raise ConfigProblem(f"--history-tenant-max-* must be positive, and --history-record-max-bytes from 1 to "
                            f"{RECORD_BYTES_MAX} (a record travels between nodes in one mesh frame)")


async def _start(context: StartContext) -> Any:
    config = context.config
    backend = HISTORY_BACKENDS[config.history_backend]
    started = await backend.start(config.section(backend.section) if backend.section else None, config.history,
                                  context.need("cluster"), context.nursery)
    tracing = context.need("tracing")
    return tracing.traced(started, "history") if started is not None and tracing is not None else started


def _options() -> tuple:
    plugins = tuple(option for plugin in HISTORY_BACKENDS.plugins() for option in plugin.make.options)
    return (*store.OPTIONS, *backends.OPTIONS, *plugins)


SUBSYSTEM = Subsystem("history", HistoryConfig(), _options(), _check, _start, needs=("cluster", "tracing"))

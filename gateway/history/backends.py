"""The history backends (``--history-backend``), one registry: each backend registers itself in its module.

A backend says what it is (``summary``: --help, the docs), the config section of its own settings (``section``
and its ``defaults``: ``postgres``'s URL and pool, ``redis``'s), the options that set them (``options``), what
makes those settings unusable (``check``), how it starts (``start``: the store, ready before the node serves,
or None for a node that stores nothing), and whether nodes without a mesh share it (``shared``: PostgreSQL
and Redis; a background response then learns of a cancel made on another node from the store). The config
(choices, sections, validation), ``--help``, the docs' table and the server read the registry: adding a
backend is its own module, its tests and its docs line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..base.options import Option
from ..base.registry import Registry
from .store import HistoryConfig, HistoryStore

Start = Callable[[Any, HistoryConfig, Any, trio.Nursery], Awaitable["HistoryStore | None"]]


@dataclasses.dataclass(frozen=True)
class HistoryBackend:
    start: Start  # (its section, --history-* settings, the node's ClusterState or None, a nursery) -> store
    section: str | None = None  # its own settings' config section, None without any
    defaults: Any = None  # that section's defaults (a frozen dataclass)
    options: tuple[Option, ...] = ()
    check: Callable[[Any], "str | None"] = lambda section: None  # why its settings cannot be used, or None
    shared: bool = False  # nodes reach the same store without a mesh between them


HISTORY_BACKENDS: Registry[HistoryBackend] = Registry("history backend")


async def _start_nothing(section: Any, history: HistoryConfig, cluster: Any, nursery: trio.Nursery) -> None:
    return None


HISTORY_BACKENDS.add("none", HistoryBackend(_start_nothing), "nothing is stored: previous_response_id, "
                     "conversations and background responses are refused")

OPTIONS = (
    Option("--history-backend", "history_backend", str, "where stored responses and conversations live (memory: "
           "replicated on three nodes of the mesh)", "history", choices=HISTORY_BACKENDS),
)

"""Where an adapter's request goes and what makes room for it, without I/O (service.py acts on the answers).

A request naming an adapter goes to a worker of its base model whose kind loads adapters: one that holds it already
if any does (no load), else any of them, chosen by the routing policy as usual, which then loads it. A worker holds
at most ``per_worker`` adapters (its engine's slots; SGLang's max_loras_per_batch is 8 by default): to load another,
the one used longest ago is unloaded, never a pinned one nor one a request is using; a worker whose every adapter
is pinned or in use takes no other until one is released.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def candidates_for(workers: "Sequence[Any]", adapter_id: str) -> "list[Any]":
    """The workers that may answer with the adapter: those holding it, else every one that loads adapters."""
    takers = [w for w in workers if getattr(w.client, "takes_adapters", False)]
    holders = [w for w in takers if adapter_id in w.adapters]
    return holders or takers


def eviction(loaded: "frozenset[str]", per_worker: int, keep: "frozenset[str] | set[str]",
             last_used: "Mapping[str, float]") -> "str | None | bool":
    """What to unload before one more adapter can load on a worker holding ``loaded``: None when there is room,
    the id used longest ago (never used here first) among those not to ``keep`` (pinned, in use), False when every
    one is kept."""
    if len(loaded) < per_worker:
        return None
    free = [a for a in loaded if a not in keep]
    if not free:
        return False
    return min(free, key=lambda a: (last_used.get(a, float("-inf")), a))

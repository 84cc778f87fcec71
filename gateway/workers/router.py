"""Picks the worker for one attempt: candidates from the registry, choice from the policy."""

from __future__ import annotations

from typing import Any

import trio

from ..base.errors import NoCapacity
from ..routing.policies import Policy, RoutingRequest
from .registry import WorkerRegistry
from .worker import Worker


class Router:
    def __init__(self, registry: WorkerRegistry, policy: Policy, adapters: Any = None) -> None:
        self.registry = registry
        self.policy = policy
        # gateway/adapters' service: a request naming an adapter goes to the workers that may answer with it
        self.adapters = adapters
        registry.on_removed.append(policy.forget)

    def select(self, model: str | None, request: RoutingRequest, exclude: "set[str]" = frozenset(),
               kind: str | None = None) -> Worker:
        """A worker (of this kind, if given) whose circuit admitted this attempt.

        Raises NoCapacity if none can take it.
        """
        now = trio.current_time()
        candidates = self.registry.candidates(model, now, kind)
        if request.adapter is not None and self.adapters is not None:
            candidates = self.adapters.candidates(candidates, request.adapter)
        if exclude and len(candidates) > 1:
            # A retry prefers another worker, but falls back to the same one if it is the only one.
            others = [w for w in candidates if w.id not in exclude]
            candidates = others or candidates
        while candidates:
            worker = self.policy.choose(candidates, request)
            if worker.breaker.acquire(now):
                return worker
            candidates = [w for w in candidates if w is not worker]
        # The model named: in a fleet of several, which one is down is the first thing an operator needs.
        raise NoCapacity(f"no healthy worker can serve model {model!r} right now", code="no_healthy_worker",
                         retry_after_s=1)

"""The providers subsystem's service: the routes in use (replaced whole on a reload), the calls to targets, their
cooldowns, and what a route did with each request (answered, fell back, overflowed, skipped), counted by target.

In a cluster two things travel as settings of the cluster's document (``gateway/cluster/state.py``): a target's
cooldown (``provider-cooldown:NAME``, the wall-clock time it ends, 0 when a probe ended it), so that every node
skips a target one node found failing, at once, for the time it asked; and a models config put through the
admin API (``models-config``), which every node takes in place of its file's. What a peer sends is checked as a
file would be (a config that does not parse is ignored and counted; a cooldown for an unknown target, or one
longer than the longest we would set, is dropped).

``gateway/api/routed.py`` asks it which targets to try and in what order (``plan``), sends provider targets'
calls through ``calls``, and tells it how each attempt ended (``succeeded``, ``failed``).
"""

from __future__ import annotations

import logging
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import trio

from ..observe.metrics import counter, gauge
from .config import ProvidersConfig
from .cooldowns import Cooldowns
from .dispatch import ProviderCalls
from .quotas import QuotaCounters, counters
from .routes import NO_ROUTES, Route, Routes, RouteTarget, RoutesError, load_routes, parse_routes

log = logging.getLogger("gateway.providers")
COOLDOWN_SETTING = "provider-cooldown:"
MODELS_SETTING = "models-config"


class Providers:
    def __init__(self, config: ProvidersConfig, calls: ProviderCalls, routes: Routes = NO_ROUTES,
                 rng: random.Random | None = None, clock: Any = time.time, cluster: Any = None) -> None:
        self.config = config
        self.calls = calls
        self.routes = routes
        self.cooldowns = Cooldowns(config.cooldowns())
        self._rng = rng or random.Random()
        self._clock = clock  # wall time: cooldowns are compared across nodes
        # (route, target, event): answered, fallback, overflow, cooling (skipped), quota (skipped)
        self.events: dict[tuple[str, str, str], int] = {}
        self.reloads: dict[str, int] = {}  # outcome: ok, failed
        self._quotas: dict[str, QuotaCounters] = {}
        self._quotas_of: Routes | None = None
        self.refused_settings = 0  # peers' cooldowns and configs that could not be used
        self.cluster = cluster
        if cluster is not None:
            cluster.follow_settings(self._on_setting)

    def route(self, model: str) -> Route | None:
        return self.routes.get(model)

    def quota(self, target: str) -> QuotaCounters | None:
        """The cluster's counters of ``target``'s account quota, when the models config gives it one."""
        routes = self.routes
        if self._quotas_of is not routes:
            self._quotas = {name: counters(name, quota) for name, quota in routes.quotas.items()}
            self._quotas_of = routes
        return self._quotas.get(target)

    def now(self) -> float:
        return self._clock()

    def plan(self, route: Route) -> list[RouteTarget]:
        """The route's targets in the order this request tries them (priority, then a weighted draw)."""
        return route.ordered(self._rng)

    def count(self, route: Route, target: RouteTarget, event: str) -> None:
        key = (route.name, target.name, event)
        self.events[key] = self.events.get(key, 0) + 1

    def succeeded(self, target: RouteTarget) -> None:
        if target.target is None:
            return
        ended = self.cooldowns.cooling(target.name, 0.0) > 0  # it had a cooldown: this was its probe
        self.cooldowns.succeeded(target.name)
        if ended:
            self._share(target.name, 0.0)

    def failed(self, target: RouteTarget, kind: str, retry_after_s: float | None) -> None:
        until = self.cooldowns.failed(target.name, kind, retry_after_s, self.now())
        if until is not None:
            log.warning("target %s cools down for %.1f s after a %s failure", target.name, until - self.now(), kind)
            self._share(target.name, until)

    def _share(self, name: str, until: float) -> None:
        if self.cluster is not None:
            self.cluster.set_setting(COOLDOWN_SETTING + name, {"until": until})

    def _on_setting(self, name: str, value: Any) -> None:
        """A peer's cooldown or models config (the module's docstring says what is kept)."""
        if name == MODELS_SETTING:
            try:
                self.routes = parse_routes(value)
                log.info("models config replaced by a peer: %d routes", len(self.routes.routes))
            except RoutesError as e:
                self.refused_settings += 1
                log.warning("ignored a models config from a peer: %s", e)
            return
        if not name.startswith(COOLDOWN_SETTING):
            return
        target = name[len(COOLDOWN_SETTING):]
        until = value.get("until") if isinstance(value, dict) else None
        now = self.now()
        if target not in self.routes.targets or isinstance(until, bool) or not isinstance(until, (int, float)) \
                or not 0 <= until <= now + self.config.cooldown_max_s + 60.0:
            self.refused_settings += 1
            return
        if until == 0:
            self.cooldowns.succeeded(target)
        else:
            self.cooldowns.told(target, float(until), now)

    def publish_models(self, raw: Any) -> Routes:
        """A models config given whole (``PUT /admin/models``): checked, in use here, and every node's (the cluster
        keeps it); RoutesError leaves the routes in use."""
        routes = self.replace(raw)
        if self.cluster is not None:
            self.cluster.set_setting(MODELS_SETTING, raw)
        return routes

    # -- the models config --------------------------------------------------------------------------------------

    def reload(self) -> Routes:
        """Read the models config again; the routes in use stay when it cannot be used (RoutesError)."""
        path = self.config.models_config
        if path is None:
            raise RoutesError("no --models-config to read")
        try:
            routes = load_routes(path)
        except RoutesError:
            self.reloads["failed"] = self.reloads.get("failed", 0) + 1
            raise
        self.routes = routes
        self.reloads["ok"] = self.reloads.get("ok", 0) + 1
        log.info("models config %s: %d routes, %d targets", path, len(routes.routes), len(routes.targets))
        return routes

    def replace(self, raw: Any) -> Routes:
        """Routes from a models config given whole (``PUT /admin/models``); RoutesError leaves the ones in use."""
        routes = parse_routes(raw)
        self.routes = routes
        return routes

    async def reload_on_sighup(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Re-read the models config at each SIGHUP (the main thread's signal: a process of the node)."""
        with trio.open_signal_receiver(signal.SIGHUP) as signals:
            task_status.started()
            async for _ in signals:
                try:
                    self.reload()
                except RoutesError as e:
                    log.error("models config not reloaded, the routes in use stay: %s", e)

    def metric_families(self) -> Iterator[Any]:
        yield counter("smg_route_events", "What routes did with requests, by route, target and event (answered, "
                      "fallback: failed and the next target was tried, overflow: its pool saturated, cooling: skipped "
                      "while it cooled down, quota: skipped past the account's quota)", ["route", "target", "event"],
                      [([r, t, e], float(n)) for (r, t, e), n in sorted(self.events.items())])
        yield counter("smg_models_config_reloads", "Reloads of the models config, by outcome", ["outcome"],
                      [([o], float(n)) for o, n in sorted(self.reloads.items())])
        now = self.now()
        yield gauge("smg_target_cooldown_seconds", "Seconds left of each target's cooldown (0: available)",
                    ["target"], [([name], self.cooldowns.cooling(name, now)) for name in sorted(self.routes.targets)])
        yield counter("smg_target_cooldowns", "Cooldowns started on this node", [],
                      [([], float(self.cooldowns.started))])
        yield counter("smg_provider_settings_refused", "Cooldowns and models configs from peers that could not be used",
                      [], [([], float(self.refused_settings))])
        yield from self.calls.metric_families()

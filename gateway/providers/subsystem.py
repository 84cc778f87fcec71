"""Hosted providers as a subsystem of the node (gateway/base/subsystem.py): the models config checked before the node
starts (a bad one stops it in one line), the calls' own HTTP client, and the reload on SIGHUP."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from ..net.http_client import HttpClient
from .config import OPTIONS, ProvidersConfig
from .dispatch import ProviderCalls
from .routes import NO_ROUTES, RoutesError, load_routes
from .service import Providers


def _check(config: Any) -> None:
    providers = config.providers
    if not 0 < providers.cooldown_s <= providers.cooldown_max_s:
        raise ConfigProblem("--provider-cooldown-secs must be positive and at most --provider-cooldown-max-secs")
    if providers.models_config:
        try:
            load_routes(providers.models_config)
        except RoutesError as e:
            raise ConfigProblem(str(e)) from None


async def _start(context: StartContext) -> Providers:
    config = context.config.providers
    routes = load_routes(config.models_config) if config.models_config else NO_ROUTES
    service = Providers(config, ProviderCalls(HttpClient(), tracing=context.need("tracing")), routes,
                        cluster=context.need("cluster"))
    if config.models_config:
        try:
            await context.nursery.start(service.reload_on_sighup)
        except RuntimeError:  # not the main thread (a node started inside another program): no signals to read
            pass
    return service


SUBSYSTEM = Subsystem("providers", ProvidersConfig(), OPTIONS, _check, _start, needs=("tracing", "cluster"))

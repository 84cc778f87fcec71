"""LoRA adapters as a subsystem of the node (gateway/base/subsystem.py): their flags, checked, and the service
(definitions followed in the settings document, holdings listed on the workers this node checks)."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from .service import OPTIONS, AdapterConfig, AdapterService


def _check(config: Any) -> None:
    adapters = config.adapters
    if adapters.per_worker < 1 or adapters.load_timeout_s <= 0 or adapters.poll_interval_s <= 0:
        raise ConfigProblem("--max-adapters-per-worker must be at least 1 and --adapter-load-timeout-secs positive")


async def _start(context: StartContext) -> AdapterService:
    service = AdapterService(context.config.adapters, context.need("settings"), context.need("registry"),
                             context.need("cluster"))
    await context.nursery.start(service.run)
    return service


SUBSYSTEM = Subsystem("adapters", AdapterConfig(), OPTIONS, _check, _start, needs=("settings", "registry", "cluster"))

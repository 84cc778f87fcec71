"""The response cache as a subsystem of the node (gateway/base/subsystem.py): its bounds checked, its service
started (always: off, it holds nothing and answers peers' lookups with misses)."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from .service import OPTIONS, CacheConfig, ResponseCache

HIT_PRICES = ("free", "cached")


def _check(config: Any) -> None:
    cache = config.cache
    if cache.hit_price not in HIT_PRICES:
        raise ConfigProblem("--response-cache-hit-price must be free or cached")
    if not (cache.ttl_s > 0 and cache.bytes_max > 0 and 0 < cache.partition_bytes_max):
        raise ConfigProblem("--response-cache-ttl-secs, --response-cache-bytes and --response-cache-tenant-bytes "
                            "must be positive")


async def _start(context: StartContext) -> ResponseCache:
    cache = ResponseCache(context.config.cache, cluster=context.need("cluster"))
    await context.nursery.start(cache.run)
    return cache


SUBSYSTEM = Subsystem("cache", CacheConfig(), OPTIONS, _check, _start, needs=("cluster",))

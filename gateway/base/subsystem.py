"""A subsystem as the node knows it: one registered thing.

Each subsystem declares, beside its own code, a ``Subsystem``:

    name        what it is called: its config section (``config.<name>``) when it has one, and its service in the
                request context (``state.<name>``) when it starts one
    config      its section's defaults, an instance of its frozen config class (None: no section of its own; its
                flags set fields of the node's own config)
    options     its flags (``base/options.py``): --help's lines, the environment's and the TOML file's keys
    check       what it refuses of a configuration (``ConfigProblem``, one line for the operator), before anything
                starts
    start       how its service is built, given what it ``needs`` (other subsystems' services by name, and the
                node's own resources: ``config``, ``metrics``, ``cluster``, ``http_client``, ``engine_bridge``), in
                a nursery of the node's; a service with ``metric_families`` is scraped with the node's metrics
    needs       those names: the node starts subsystems in an order that gives each what it needs

The node's list of them (``gateway/node/subsystems.py``) is the one registration: the config's sections, its flags
and its checks, the server's start-up and the request context all loop over it, and name no subsystem. A service is
built once, given everything it uses when it is made, and not assigned to afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from .options import Option


class ConfigProblem(ValueError):
    """A setting a subsystem cannot use: said to the operator in one line; the node does not start."""


@dataclasses.dataclass(frozen=True)
class StartContext:
    """What a subsystem's ``start`` is given: the node's config, a nursery that lives as long as the node serves,
    and the services (and node resources) it declared it ``needs``."""

    config: Any
    nursery: Any
    services: Mapping[str, Any]

    def need(self, name: str) -> Any:
        return self.services[name]


@dataclasses.dataclass(frozen=True)
class Subsystem:
    name: str
    config: Any = None
    options: tuple[Option, ...] = ()
    check: "Callable[[Any], None] | None" = None
    start: "Callable[[StartContext], Awaitable[Any]] | None" = None
    needs: tuple[str, ...] = ()


def start_order(subsystems: "Iterable[Subsystem]", provided: "Iterable[str]") -> list[Subsystem]:
    """The subsystems that start a service, each after those it needs (in the listed order where free to choose);
    ValueError for a need that nothing provides or a cycle (a bug in the registrations, not a setting)."""
    pending = [s for s in subsystems if s.start is not None]
    known = set(provided)
    startable = known | {s.name for s in pending}
    for subsystem in pending:
        missing = [need for need in subsystem.needs if need not in startable]
        if missing:
            raise ValueError(f"the subsystem {subsystem.name!r} needs {', '.join(missing)}, which nothing provides")
    order: list[Subsystem] = []
    while pending:
        ready = next((s for s in pending if all(need in known for need in s.needs)), None)
        if ready is None:
            raise ValueError(f"the subsystems {', '.join(s.name for s in pending)} need each other in a cycle")
        order.append(ready)
        known.add(ready.name)
        pending.remove(ready)
    return order

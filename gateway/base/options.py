"""How a subsystem declares its command-line options: beside its own frozen config.

Each subsystem (admission, routing, the history backends, tracing, ...) lists its ``Option``s in its own
module, next to the config class whose fields they set; ``gateway/node/config.py`` gathers them (and those of
every registered plugin, such as a history backend) into the flags, the environment variables and the TOML
keys of ``smg-node serve``, and ``--help`` is laid out from them: each option names its ``section``, and the
sections appear in ``HELP_SECTIONS``' order. An option's default is read from the config class, never
written twice; an option that names a registered member (a parser, a policy, a backend) gives its registry as
``choices``, from which --help lists the names and the config checks the value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

# --help's sections, in order: (key an Option names, title).
HELP_SECTIONS: tuple[tuple[str, str], ...] = (
    ("http", "HTTP: the OpenAI-compatible front"),
    ("history", "history: stored responses and conversations"),
    ("disaggregation", "disaggregation: prefill and decode on separate engines"),
    ("discovery", "discovery: engines and nodes found as Kubernetes pods"),
    ("tracing", "tracing: OpenTelemetry over OTLP"),
    ("engines", "engines: where generations run"),
    ("tools", "tools: MCP servers the node runs for the Responses and Messages APIs"),
    ("providers", "providers: hosted models beside the fleet, models as routes, fallbacks, cooldowns"),
    ("routing", "routing: which engine takes a request, admission, retries, circuits"),
    ("cluster", "cluster: the mesh of nodes"),
    ("ratelimits", "rate limits: cluster-wide, per key, tenant or model"),
    ("spend", "spend: what requests cost, budgets per key and tenant, the response cache"),
    ("security", "security: credentials, TLS, what clients may send"),
    ("performance", "performance: processes, threads, caches, fast paths"),
)
SECTION_KEYS = frozenset(key for key, _ in HELP_SECTIONS)


@dataclasses.dataclass(frozen=True)
class Option:
    flag: str  # --like-this; its environment variable is SMG_NODE_LIKE_THIS, its TOML key like_this
    path: str  # "field" or "section.field" of GatewayConfig (a plugin's section: its registered name)
    # A converter (str -> value), or "bool" (a switch on), "disable" (a switch off: sets the field false),
    # "list" (several values), "selector" (Kubernetes label selectors), "prefill" (URL [PORT], repeated),
    # "append" (a repeated flag's values).
    kind: "Callable[[str], Any] | str"
    help: str
    section: str  # which --help section it is listed in (HELP_SECTIONS)
    # A credential, key or URL with a password: never on a command line another local user can read (ps); the
    # processes of --workers N get it by environment.
    secret: bool = False
    internal: bool = False  # set by the node for its own processes, not by people: hidden from --help
    # A registry (gateway/base/registry.py) whose names are the values: --help lists them and the config refuses
    # others, both read when they are needed (a member registered later is listed).
    choices: Any = None
    then: "Callable[[Any], Any] | None" = None  # applied to the value its kind made (a list's items -> a config)

    def __post_init__(self) -> None:
        if self.section not in SECTION_KEYS:
            raise ValueError(f"{self.flag}: no --help section {self.section!r}")


def secs_ms(value: str) -> float:
    """An option given in milliseconds, kept in seconds."""
    return float(value) / 1000.0

"""MCP servers the operator configures (``--mcp-config-path``): clients name them by ``server_label`` without a
URL, and they may back built-in tool types.

The file is YAML (``.yaml``, ``.yml``) or TOML (anything else), one table per server under ``servers``::

    [servers.search]
    transport = "streamable_http"            # or "sse", or "stdio"
    url = "https://search.internal/mcp"
    headers = { Authorization = "Bearer ${SEARCH_TOKEN}" }   # ${VAR}: from the node's environment
    allowed_tools = ["search"]               # what clients may call (default: every tool it lists)
    tenants = ["team-a"]                     # who may use it (default: every caller)
    builtin = "web_search_preview"           # a Responses built-in tool type it serves

    [servers.files]
    transport = "stdio"
    command = "python"
    args = ["-m", "files_server", "--root", "/srv/files"]
    env = { FILES_TOKEN = "${FILES_TOKEN}" }

A server's credentials (its headers, its environment) are the operator's: they never leave the node, are never
shown or logged, and a server with ``tenants`` is refused to every other caller, so one tenant cannot use
another's. Everything here is checked when the node starts (a missing variable, an unknown key, a stdio server
without a command): a bad file stops the start with one line saying what is wrong.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from pathlib import Path
from typing import Any

TRANSPORTS = ("streamable_http", "sse", "stdio")
# The Responses API's built-in tool types a configured server may serve: a request's {"type": "web_search_preview"}
# gives the model that server's tools (their calls shown as mcp_call items of the server).
BUILTINS = ("web_search_preview", "web_search")
_KEYS = frozenset({"transport", "url", "command", "args", "env", "headers", "allowed_tools", "tenants", "builtin",
                   "description"})
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ServerConfigError(ValueError):
    """The servers file cannot be used; the message says where."""


@dataclasses.dataclass(frozen=True)
class ConfiguredServer:
    name: str
    transport: str
    url: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # secrets: never shown
    headers: tuple[tuple[str, str], ...] = ()  # secrets: never shown
    allowed_tools: "tuple[str, ...] | None" = None  # None: every tool
    tenants: "tuple[str, ...] | None" = None  # None: every caller
    builtin: str | None = None
    description: str | None = None

    def usable_by(self, tenant: str | None) -> bool:
        return self.tenants is None or (tenant is not None and tenant in self.tenants)

    def __repr__(self) -> str:  # the credentials stay out of logs and tracebacks
        return f"ConfiguredServer({self.name!r}, {self.transport}, {self.url or self.command!r})"


def load_servers(path: str) -> dict[str, ConfiguredServer]:
    """The servers of the file at ``path``, by name; ServerConfigError for anything wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ServerConfigError(f"--mcp-config-path {path}: {e.strerror or e}") from None
    is_yaml = path.endswith((".yaml", ".yml"))
    try:
        if is_yaml:
            import yaml  # loaded only for a YAML file
            document = yaml.safe_load(text)
        else:
            document = tomllib.loads(text)
    except Exception as e:  # yaml's and tomllib's own errors: say where, stop the start
        raise ServerConfigError(f"--mcp-config-path {path}: not valid {'YAML' if is_yaml else 'TOML'}: {e}") from None
    return parse_servers(document, os.environ, path)


def parse_servers(document: Any, environ: "dict[str, str] | Any", source: str = "the MCP servers file"
                  ) -> dict[str, ConfiguredServer]:
    if not isinstance(document, dict) or not isinstance(document.get("servers"), dict) or set(document) - {"servers"}:
        raise ServerConfigError(f"{source}: expected one table 'servers' of server tables")
    servers: dict[str, ConfiguredServer] = {}
    builtins: dict[str, str] = {}
    for name, table in document["servers"].items():
        where = f"{source}: servers.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ServerConfigError(f"{where}: a server's name is 1-64 letters, digits, '_' or '-'")
        if not isinstance(table, dict):
            raise ServerConfigError(f"{where}: expected a table")
        unknown = set(table) - _KEYS
        if unknown:
            raise ServerConfigError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
        transport = table.get("transport", "streamable_http")
        if transport not in TRANSPORTS:
            raise ServerConfigError(f"{where}: transport is one of {', '.join(TRANSPORTS)}")
        server = ConfiguredServer(
            name=name, transport=transport, url=_string(table, "url", where), command=_string(table, "command", where),
            args=_strings(table, "args", where) or (), env=_expanded_pairs(table, "env", where, environ),
            headers=_expanded_pairs(table, "headers", where, environ),
            allowed_tools=_strings(table, "allowed_tools", where), tenants=_strings(table, "tenants", where),
            builtin=_string(table, "builtin", where), description=_string(table, "description", where))
        if transport == "stdio":
            if not server.command or server.url or server.headers:
                raise ServerConfigError(f"{where}: a stdio server has a command (and args, env), not a url or headers")
        elif not server.url or not server.url.startswith(("http://", "https://")) or server.command:
            raise ServerConfigError(f"{where}: a {transport} server has an http(s) url, not a command")
        if server.builtin is not None:
            if server.builtin not in BUILTINS:
                raise ServerConfigError(f"{where}: builtin is one of {', '.join(BUILTINS)}")
            if server.builtin in builtins:
                raise ServerConfigError(f"{where}: {server.builtin} is served by {builtins[server.builtin]} already")
            builtins[server.builtin] = name
        servers[name] = server
    return servers


def _string(table: dict[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ServerConfigError(f"{where}: {key} must be a non-empty string")
    return value


def _strings(table: dict[str, Any], key: str, where: str) -> "tuple[str, ...] | None":
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ServerConfigError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def _expanded_pairs(table: dict[str, Any], key: str, where: str, environ: Any) -> tuple[tuple[str, str], ...]:
    value = table.get(key)
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()):
        raise ServerConfigError(f"{where}: {key} must be a table of strings")

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ServerConfigError(f"{where}: {key} uses ${{{name}}}, which is not set in the environment")
        return environ[name]

    return tuple((k, _VARIABLE.sub(variable, v)) for k, v in value.items())

"""A request's MCP tools (gateway/mcp runs them): which servers, which of their tools the model sees, which calls
need the user's approval.

Responses API tools::

    {"type": "mcp", "server_label": "docs", "server_url": "https://docs.example.com/mcp",  # a client's server
     "allowed_tools": ["search"] | {"tool_names": [...], "read_only": true},
     "require_approval": "always" | "never" | {"always": {filter}, "never": {filter}},   # default: always
     "headers": {"Authorization": "Bearer ..."}, "authorization": "...", "server_description": "..."}
    {"type": "mcp", "server_label": "search"}        # an operator-configured server, by its name
    {"type": "web_search_preview"}                   # a configured server whose builtin says it serves this

Messages API: ``mcp_servers: [{"type": "url", "url", "name", "authorization_token",
"tool_configuration": {"enabled", "allowed_tools"}}]`` (no approvals there).

A client's ``server_url`` is checked against ``--mcp-allowed-hosts`` before anything runs (a 400 naming the
field); its headers are sent to that server only, never logged, never stored (the stored response keeps the
request's tools without them). A configured server is refused, as if it did not exist, to a caller outside its
``tenants``. The model sees each tool by its own name; two servers offering one name, or a tool named like one of
the request's functions, is a 400 (the model could not say which it means).
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Any

from ..mcp.results import ToolInfo
from ..mcp.servers import BUILTINS, ConfiguredServer
from ..mcp.sessions import ServerRef
from ..net.outbound import OutboundRefused, OutboundUnresolved
from .errors import BadRequest, shown, type_name
from .http import Request
from .state import GatewayState

HEADERS_MAX = 32
HEADER_BYTES_MAX = 8192
SERVERS_MAX = 16
_LABEL_CHARS_MAX = 64


@dataclasses.dataclass(frozen=True)
class ToolFilter:
    """OpenAI's tool filter: by names, by the server's read-only hint, or both (None: not said)."""

    names: "frozenset[str] | None" = None
    read_only: bool | None = None

    def matches(self, tool: ToolInfo) -> bool:
        return (self.names is None or tool.name in self.names) and \
            (self.read_only is None or tool.read_only == self.read_only)


@dataclasses.dataclass(frozen=True)
class HostedServer:
    """One MCP server of a request: how it is reached and what of it the model may use."""

    label: str
    ref: ServerRef
    allowed: "ToolFilter | None" = None  # None: every tool it lists
    configured_tools: "frozenset[str] | None" = None  # the operator's allowed_tools
    # Approval: "always", "never", or filters (a tool matching ``never`` runs; one matching ``always`` or neither
    # waits for the user).
    approval: str = "always"
    always: "ToolFilter | None" = None
    never: "ToolFilter | None" = None
    where: str = "tools"  # the request field it came from, for errors

    def offers(self, tool: ToolInfo) -> bool:
        return (self.configured_tools is None or tool.name in self.configured_tools) and \
            (self.allowed is None or self.allowed.matches(tool))

    def needs_approval(self, tool: ToolInfo) -> bool:
        if self.approval in ("always", "never"):
            return self.approval == "always"
        if self.never is not None and self.never.matches(tool):
            return False
        return True  # matched by ``always``, or by neither: OpenAI's default is to ask


@dataclasses.dataclass
class HostedTools:
    """A request's servers, and once listed, the tools the model sees (by name: its server and the tool)."""

    servers: list[HostedServer]
    tools: dict[str, tuple[HostedServer, ToolInfo]] = dataclasses.field(default_factory=dict)

    def add(self, server: HostedServer, listed: "list[ToolInfo]", function_names: "set[str]") -> None:
        for tool in listed:
            if not server.offers(tool):
                continue
            if tool.name in self.tools or tool.name in function_names:
                other = self.tools[tool.name][0].label if tool.name in self.tools else "a function tool"
                raise BadRequest(f"the tool name {tool.name!r} is offered by the MCP server '{server.label}' and by "
                                 f"{other if other == 'a function tool' else repr(other)}: the model could not say "
                                 "which it calls", param=server.where, code="duplicate_tool_name")
            self.tools[tool.name] = (server, tool)

    def function_tools(self) -> list[dict[str, Any]]:
        """The tools as the chat template takes functions."""
        return [{"type": "function", "function": {"name": name, "description": tool.description or "",
                                                  "parameters": tool.input_schema}}
                for name, (_, tool) in self.tools.items()]

    def server_of(self, name: str) -> "HostedServer | None":
        found = self.tools.get(name)
        return found[0] if found is not None else None

    def server_labelled(self, label: str) -> "HostedServer | None":
        return next((s for s in self.servers if s.label == label), None)


# -- the Responses API's tools ------------------------------------------------------------------------------

def is_hosted(tool: Any) -> bool:
    return isinstance(tool, dict) and (tool.get("type") == "mcp" or tool.get("type") in BUILTINS)


async def responses_servers(state: GatewayState, request: Request, tools: "list[Any]") -> list[HostedServer]:
    """The hosted servers of a Responses request's ``tools`` (each checked: a 400 names the entry)."""
    servers: list[HostedServer] = []
    for index, tool in enumerate(tools):
        if not is_hosted(tool):
            continue
        where = f"tools[{index}]"
        if tool["type"] != "mcp":
            server = _builtin_server(state, request, tool["type"], where)
        else:
            server = await _mcp_tool(state, request, tool, where)
        if any(s.label == server.label for s in servers):
            raise BadRequest(f"{where}: server_label {server.label!r} is used twice", param=f"{where}.server_label",
                             code="invalid_value")
        servers.append(server)
    if len(servers) > SERVERS_MAX:
        raise BadRequest(f"more than {SERVERS_MAX} MCP servers in one request", param="tools", code="invalid_value")
    return servers


async def _mcp_tool(state: GatewayState, request: Request, tool: dict[str, Any], where: str) -> HostedServer:
    label = tool.get("server_label")
    if not isinstance(label, str) or not label or len(label) > _LABEL_CHARS_MAX:
        raise BadRequest(f"{where}.server_label must be a string of 1-{_LABEL_CHARS_MAX} characters",
                         param=f"{where}.server_label", code="invalid_value")
    for unsupported in ("connector_id", "tunnel_id"):
        if tool.get(unsupported) is not None:
            raise BadRequest(f"{where}.{unsupported}: OpenAI's connectors are not served here; give a server_url, "
                             "or the name of a server this node is configured with", param=f"{where}.{unsupported}",
                             code="unsupported_parameter")
    allowed = _allowed_tools(tool.get("allowed_tools"), f"{where}.allowed_tools")
    approval, always, never = _approval(tool.get("require_approval"), f"{where}.require_approval")
    url = tool.get("server_url")
    if url is None:
        if tool.get("headers") is not None or tool.get("authorization") is not None:
            raise BadRequest(f"{where}: headers and authorization are for a server_url; a configured server brings "
                             "its own", param=f"{where}.headers", code="invalid_value")
        configured = _configured(state, request, label, where)
        return HostedServer(label, _configured_ref(configured, label), allowed, _names(configured.allowed_tools),
                            approval, always, never, where)
    headers = _headers(tool.get("headers"), tool.get("authorization"), where)
    return HostedServer(label, await _client_ref(state, request, label, url, headers, f"{where}.server_url"), allowed,
                        None, approval, always, never, where)


def _builtin_server(state: GatewayState, request: Request, kind: str, where: str) -> HostedServer:
    tenant = request.principal.tenant
    for server in _servers(state).values():
        if server.builtin == kind and server.usable_by(tenant):
            return HostedServer(server.name, _configured_ref(server, server.name),
                                configured_tools=_names(server.allowed_tools), approval="never", where=where)
    raise BadRequest(f"{where}: this node runs no {kind} tool (an operator serves one with an MCP server whose "
                     f"--mcp-config-path entry says builtin = \"{kind}\")", param=where, code="unsupported_tool")


# -- the Messages API's mcp_servers -------------------------------------------------------------------------

async def messages_servers(state: GatewayState, request: Request, raw: Any) -> list[HostedServer]:
    """Anthropic's ``mcp_servers``: a URL (and its bearer token) or, here, a configured server by name."""
    if not isinstance(raw, list):
        raise BadRequest(f"'mcp_servers' must be a list, got {type_name(raw)}", param="mcp_servers",
                         code="invalid_type")
    if len(raw) > SERVERS_MAX:
        raise BadRequest(f"more than {SERVERS_MAX} MCP servers in one request", param="mcp_servers",
                         code="invalid_value")
    servers: list[HostedServer] = []
    for index, entry in enumerate(raw):
        where = f"mcp_servers[{index}]"
        if not isinstance(entry, dict) or entry.get("type", "url") != "url" or not isinstance(entry.get("name"), str) \
                or not entry["name"]:
            raise BadRequest(f"{where} must be {{\"type\": \"url\", \"url\": ..., \"name\": ...}}", param=where,
                             code="invalid_value")
        name = entry["name"][:_LABEL_CHARS_MAX]
        configuration = entry.get("tool_configuration") or {}
        if not isinstance(configuration, dict):
            raise BadRequest(f"{where}.tool_configuration must be an object", param=f"{where}.tool_configuration",
                             code="invalid_type")
        if configuration.get("enabled") is False:
            continue
        allowed = _allowed_tools(configuration.get("allowed_tools"), f"{where}.tool_configuration.allowed_tools")
        if entry.get("url") is None:
            configured = _configured(state, request, name, where)
            ref, configured_tools = _configured_ref(configured, name), _names(configured.allowed_tools)
        else:
            token = entry.get("authorization_token")
            if token is not None and not isinstance(token, str):
                raise BadRequest(f"{where}.authorization_token must be a string", param=f"{where}.authorization_token",
                                 code="invalid_type")
            headers = _headers(None, token, where)
            ref, configured_tools = await _client_ref(state, request, name, entry["url"], headers, f"{where}.url"), None
        if any(s.label == name for s in servers):
            raise BadRequest(f"{where}: the name {name!r} is used twice", param=f"{where}.name", code="invalid_value")
        servers.append(HostedServer(name, ref, allowed, configured_tools, "never", where=where))
    return servers


# -- checks -------------------------------------------------------------------------------------------------

def _servers(state: GatewayState) -> dict[str, ConfiguredServer]:
    return state.mcp.servers


def _configured(state: GatewayState, request: Request, name: str, where: str) -> ConfiguredServer:
    server = _servers(state).get(name)
    if server is None or not server.usable_by(request.principal.tenant):  # another tenant's: as if it were not
        raise BadRequest(f"{where}: no MCP server named {name!r} is configured on this node for you; give a "
                         "server_url", param=where, code="unknown_mcp_server")
    return server


def _configured_ref(server: ConfiguredServer, label: str) -> ServerRef:
    return ServerRef(label, server.transport, server.url, server.headers, server.command, server.args, server.env,
                     pinned=False, scope="", metric_name=server.name)


async def _client_ref(state: GatewayState, request: Request, label: str, url: Any, headers: tuple[tuple[str, str], ...],
                      where: str) -> ServerRef:
    if not isinstance(url, str):
        raise BadRequest(f"{where} must be a string, got {type_name(url)}", param=where, code="invalid_type")
    try:
        target = await state.mcp.policy.checked(url, "MCP server URL")
    except (OutboundRefused, OutboundUnresolved) as e:
        raise BadRequest(f"{where}: {e.message}", param=where, code="mcp_server_url_not_allowed"
                         if e.code == "url_not_allowed" else "invalid_mcp_server_url") from None
    path = urllib.parse.urlsplit(url).path.rstrip("/")
    transport = "sse" if path.endswith("/sse") else "streamable_http"  # the two remote transports, by their paths
    # A client's server: its sessions are the client's own (its credentials, its tool list).
    return ServerRef(label, transport, url, headers, pinned=True, scope=request.owner, metric_name=target.host)


def _headers(raw: Any, authorization: Any, where: str) -> tuple[tuple[str, str], ...]:
    headers: dict[str, str] = {}
    if raw is not None:
        if not isinstance(raw, dict) or len(raw) > HEADERS_MAX or not all(
                isinstance(k, str) and isinstance(v, str) and k and len(k) + len(v) <= HEADER_BYTES_MAX
                and "\n" not in k + v and "\r" not in k + v for k, v in raw.items()):
            raise BadRequest(f"{where}.headers must be an object of at most {HEADERS_MAX} string headers",
                             param=f"{where}.headers", code="invalid_value")
        headers.update(raw)
    if authorization is not None:
        if not isinstance(authorization, str) or not authorization or len(authorization) > HEADER_BYTES_MAX \
                or "\n" in authorization or "\r" in authorization:
            raise BadRequest(f"{where}: the authorization must be a string", param=f"{where}.authorization",
                             code="invalid_value")
        if not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = f"Bearer {authorization}"
    return tuple(sorted(headers.items()))


def _names(names: "tuple[str, ...] | None") -> "frozenset[str] | None":
    return frozenset(names) if names is not None else None


def _filter(raw: Any, where: str) -> ToolFilter:
    if isinstance(raw, list):
        raw = {"tool_names": raw}
    if not isinstance(raw, dict) or set(raw) - {"tool_names", "read_only"}:
        raise BadRequest(f"{where} must be a list of tool names or {{\"tool_names\": [...], \"read_only\": ...}}",
                         param=where, code="invalid_value")
    names = raw.get("tool_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise BadRequest(f"{where}.tool_names must be a list of strings", param=where, code="invalid_type")
    read_only = raw.get("read_only")
    if read_only is not None and not isinstance(read_only, bool):
        raise BadRequest(f"{where}.read_only must be a boolean", param=where, code="invalid_type")
    return ToolFilter(frozenset(names) if names is not None else None, read_only)


def _allowed_tools(raw: Any, where: str) -> "ToolFilter | None":
    return None if raw is None else _filter(raw, where)


def _approval(raw: Any, where: str) -> "tuple[str, ToolFilter | None, ToolFilter | None]":
    if raw is None or raw in ("always", "never"):
        return raw or "always", None, None
    if not isinstance(raw, dict) or not raw or set(raw) - {"always", "never"}:
        raise BadRequest(f"{where} must be 'always', 'never' or {{\"always\": {{...}}, \"never\": {{...}}}}, got "
                         f"{shown(raw)}", param=where, code="invalid_value")
    always = _filter(raw["always"], f"{where}.always") if raw.get("always") is not None else None
    never = _filter(raw["never"], f"{where}.never") if raw.get("never") is not None else None
    return "filters", always, never


def without_secrets(tools: Any) -> Any:
    """A request's ``tools`` as the response shows and stores them: an MCP tool's headers and authorization out."""
    if not isinstance(tools, list):
        return tools
    return [{k: v for k, v in tool.items() if k not in ("headers", "authorization")} if is_hosted(tool) else tool
            for tool in tools]

"""How the node runs MCP tools for the Responses and Messages APIs: where it may connect, how long it waits, how
much it takes back.

A tool a client names with a ``server_url`` makes the node connect to that URL from inside the operator's
network: nothing is reached until ``--mcp-allowed-hosts`` lists hosts (names, ``.domain``) or networks, and even
then private, loopback and link-local addresses only when a listed network holds them (gateway/net/outbound.py).
Servers the operator configures (``--mcp-config-path``) need no entry: the operator chose them.
"""

from __future__ import annotations

import dataclasses

from ..base.options import Option


@dataclasses.dataclass(frozen=True)
class McpConfig:
    allowed_hosts: tuple[str, ...] = ()  # empty: no client-supplied server_url is reached
    config_path: str | None = None  # operator-configured servers (YAML or TOML: gateway/mcp/servers.py)
    # Connecting, the MCP handshake and listing the tools, together: a server that hangs costs this, then an
    # error item. A tool call's own bound is longer: tools do real work (a search, a query).
    connect_timeout_s: float = 15.0
    call_timeout_s: float = 60.0
    # A tool's output, in UTF-8 bytes, before it reaches the prompt (64 KiB is ~16 k tokens); what is over is
    # cut, and the model is told so. A tool list's JSON is bounded the same way, times 4.
    output_bytes_max: int = 64 * 1024
    # One message a server answers (a JSON body, or one SSE event), read no further: 1 MiB, the SDK's own bound on
    # an SSE event (a tool's output past output_bytes_max is cut, so more is no use to the prompt; a page of
    # text still fits). And the typed items in one (a call's content parts, a list's tools): the SDK validates
    # each into a model on the event loop at ~6.5 us, so 1,024 cost ~7 ms at most (gateway/mcp/answers.py).
    answer_bytes_max: int = 1024 * 1024
    answer_items_max: int = 1024
    # Open sessions on this process (each holds a connection, or a process for stdio), and how long an unused
    # one stays open: a follow-up turn reuses it without a new handshake.
    sessions_max: int = 64
    session_idle_s: float = 300.0
    # MCP calls one response may run when the request gives no max_tool_calls (then the model answers without
    # tools), and how long one response's whole tool loop may take.
    tool_calls_max: int = 16
    response_time_max_s: float = 600.0


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--mcp-allowed-hosts", "mcp.allowed_hosts", "list", "hosts (names, .domain for its subdomains) or networks "
           "(CIDRs) a client's MCP server_url may reach; default none. Private, loopback and link-local addresses "
           "only when a listed network holds them", "security"),
    Option("--mcp-config-path", "mcp.config_path", str, "MCP servers run for clients, by name (YAML or TOML: "
           "transport, url or command, headers from the environment, allowed tools, tenants, built-in tool types)",
           "tools"),
    Option("--mcp-connect-timeout-secs", "mcp.connect_timeout_s", float, "longest an MCP server may take to connect "
           "and list its tools", "tools"),
    Option("--mcp-call-timeout-secs", "mcp.call_timeout_s", float, "longest one MCP tool call may take", "tools"),
    Option("--mcp-max-output-bytes", "mcp.output_bytes_max", int, "most bytes of a tool's output that reach the "
           "prompt (the rest is cut)", "tools"),
    Option("--mcp-max-answer-bytes", "mcp.answer_bytes_max", int, "most bytes of one MCP server answer (a JSON body "
           "or an SSE event) the node reads; past it the call fails", "security"),
    Option("--mcp-max-answer-items", "mcp.answer_items_max", int, "most content parts, tools, resources or prompts "
           "one MCP server answer may hold", "security"),
    Option("--mcp-max-sessions", "mcp.sessions_max", int, "MCP sessions open at once on a process", "tools"),
    Option("--mcp-session-idle-secs", "mcp.session_idle_s", float, "an unused MCP session is closed after this "
           "long", "tools"),
    Option("--mcp-max-tool-calls", "mcp.tool_calls_max", int, "MCP calls one response runs when the request sets "
           "no max_tool_calls", "tools"),
    Option("--mcp-response-time-limit-secs", "mcp.response_time_max_s", float, "longest one response's MCP tool "
           "loop may take", "tools"),
)

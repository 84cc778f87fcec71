"""MCP tools as a subsystem of the node (gateway/base/subsystem.py): their section, flags and bounds, the operator's
servers file (checked at start: a bad one stops the node in one line), and the sessions to servers."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from ..net.outbound import HostPolicy
from .config import OPTIONS, McpConfig
from .servers import ServerConfigError, load_servers
from .sessions import McpSessions


def _check(config: Any) -> None:
    mcp = config.mcp
    try:
        HostPolicy(mcp.allowed_hosts, "--mcp-allowed-hosts")
    except ValueError as e:
        raise ConfigProblem(str(e)) from None
    if not (mcp.connect_timeout_s > 0 and mcp.call_timeout_s > 0 and mcp.output_bytes_max > 0 and mcp.sessions_max > 0
            and mcp.session_idle_s > 0 and mcp.tool_calls_max > 0 and mcp.response_time_max_s > 0
            and mcp.answer_bytes_max > 0 and mcp.answer_items_max > 0):
        raise ConfigProblem("--mcp-* bounds must be positive")
    if mcp.config_path:
        try:
            load_servers(mcp.config_path)
        except ServerConfigError as e:
            raise ConfigProblem(str(e)) from None


async def _start(context: StartContext) -> McpSessions:
    mcp = context.config.mcp
    sessions = McpSessions(mcp, load_servers(mcp.config_path) if mcp.config_path else {})
    await context.nursery.start(sessions.run)
    return sessions


SUBSYSTEM = Subsystem("mcp", McpConfig(), OPTIONS, _check, _start)

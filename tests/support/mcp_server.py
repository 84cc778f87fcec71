"""A real MCP server for the tests, written with the official ``mcp`` SDK:

    python tests/support/mcp_server.py streamable-http|sse HOST PORT JOURNAL
    python tests/support/mcp_server.py stdio JOURNAL

Its tools: ``add`` (read-only), ``echo``, ``whoami`` (the Authorization header it got), ``slow`` (sleeps; a
cancel is journaled), ``big`` (an output of N bytes), ``fail`` (an error the tool reports), ``search`` (for a
built-in web_search_preview). Every call is appended to JOURNAL (one JSON line: the tool, its arguments, and
for ``slow`` whether it finished or was cancelled), so a test can see what reached the server.
"""

from __future__ import annotations

import json
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

transport = sys.argv[1]
journal_path = sys.argv[-1]
server = MCPServer("smg-test-tools")


def journal(entry: dict) -> None:
    with open(journal_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    journal({"tool": "add", "arguments": {"a": a, "b": b}})
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    journal({"tool": "echo", "arguments": {"text": text}})
    return text


@server.tool()
def whoami(ctx: Context) -> str:
    """The Authorization header this call came with."""
    headers = ctx.headers or {}
    journal({"tool": "whoami"})
    return headers.get("authorization", "nobody")


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    journal({"tool": "slow", "arguments": {"seconds": seconds}})
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        journal({"tool": "slow", "cancelled": True})
        raise
    journal({"tool": "slow", "finished": True})
    return "slept"


@server.tool()
def big(size: int) -> str:
    """An answer of `size` bytes."""
    journal({"tool": "big", "arguments": {"size": size}})
    return "x" * size


@server.tool()
def fail() -> str:
    """Always fails."""
    journal({"tool": "fail"})
    raise ValueError("the tool failed on purpose")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def search(query: str) -> str:
    """Search the web."""
    journal({"tool": "search", "arguments": {"query": query}})
    return f"Top result for {query}: smg-node serves MCP tools."


if __name__ == "__main__":
    if transport == "stdio":
        server.run(transport="stdio")
    else:
        server.run(transport=transport, host=sys.argv[2], port=int(sys.argv[3]))

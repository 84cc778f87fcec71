"""MCP tools the node runs for the Responses and Messages APIs (issue 38).

    config.py     McpConfig and the --mcp-* flags
    servers.py    servers the operator configures (--mcp-config-path): parsed and checked at start
    sessions.py   the SDK's sessions, pooled, bounded, every wait timed; client URLs only where allowed
    results.py    what servers answer, in the APIs' shapes, bounded before it reaches a prompt

What a request asks (its tools, approvals, the loop) is the API's: gateway/api/mcp_tools.py, tool_loop.py.
"""

"""A stdio MCP server that answers a tool call with a line that never ends (issue 59):

    python tests/support/hostile_stdio.py endless|parts|ok

It answers initialize and tools/list (one tool, ``flood``) as a server should; a call to ``flood`` gets, by the
mode: ``endless``, a JSON line written in 64 KB pieces until the node stops reading; ``parts``, 30,000 empty
content parts on one line; ``ok``, "fine".
"""

from __future__ import annotations

import json
import sys

mode = sys.argv[1]
out = sys.stdout.buffer


def send(value: dict) -> None:
    out.write(json.dumps(value).encode() + b"\n")
    out.flush()


for line in sys.stdin.buffer:
    message = json.loads(line)
    method, ident = message.get("method"), message.get("id")
    if ident is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {"protocolVersion": message["params"]["protocolVersion"],
                                                        "capabilities": {"tools": {}},
                                                        "serverInfo": {"name": "hostile-stdio", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [
            {"name": "flood", "description": "Answers.", "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call" and mode == "endless":
        out.write(b'{"jsonrpc":"2.0","id":%d,"result":{"content":[' % ident)
        try:
            while True:
                out.write(b'{"type":"text","text":"' + b"x" * 65_000 + b'"},')
                out.flush()
        except (BrokenPipeError, OSError):
            sys.exit(0)
    elif method == "tools/call" and mode == "parts":
        send({"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": ""}] * 30_000}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": "fine"}]}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "result": {}})

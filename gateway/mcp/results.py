"""What an MCP server answered, in the shapes the APIs show, bounded before anything reaches a prompt.

A tool as ``mcp_list_tools`` lists it (``ToolInfo``: name, description, input_schema, annotations); a call's
outcome (``CallOutcome``): its output text, or an error in OpenAI's ``McpToolCallError`` shapes:

    {"type": "mcp_tool_execution_error", "content": [...]}   the tool ran and said it failed (isError)
    {"type": "mcp_protocol_error", "code": N, "message": ...} the server answered the call with a JSON-RPC error
    {"type": "http_error", "code": N, "message": ...}        the server could not be reached or answered HTTP N;
                                                             504: it did not answer in time

Output text is the text of the result's content parts, in order (an image or audio part is named, not inlined:
its bytes are no use in a text prompt; an embedded text resource is inlined, a link named); a result with only
structured content gives its JSON. Cut at ``bytes_max`` UTF-8 bytes (on a character boundary), with a line
saying how much was left out, so the model knows the answer is partial.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

NAME_CHARS_MAX = 64  # a tool's name as the model may call it (OpenAI's function-name bound)
DESCRIPTION_CHARS_MAX = 4096


@dataclasses.dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: "dict[str, Any] | None" = None

    @property
    def read_only(self) -> bool:
        """The server says the tool changes nothing (MCP's readOnlyHint), for the read_only filters."""
        return bool((self.annotations or {}).get("readOnlyHint"))

    def listed(self) -> dict[str, Any]:
        """As an ``mcp_list_tools`` item lists it."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema,
                "annotations": self.annotations}

    @classmethod
    def from_listed(cls, entry: Any) -> "ToolInfo | None":
        """From a stored ``mcp_list_tools`` item's entry; None for one that is not a tool."""
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            return None
        schema = entry.get("input_schema")
        annotations = entry.get("annotations")
        return cls(entry["name"], entry.get("description") if isinstance(entry.get("description"), str) else None,
                   schema if isinstance(schema, dict) else {"type": "object"},
                   annotations if isinstance(annotations, dict) else None)


def tool_from_sdk(tool: Any) -> "ToolInfo | None":
    """An SDK ``Tool`` as ours; None for one whose name a model cannot call (too long, empty)."""
    name = tool.name
    if not isinstance(name, str) or not 0 < len(name) <= NAME_CHARS_MAX:
        return None
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {"type": "object"}
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
    description = tool.description[:DESCRIPTION_CHARS_MAX] if isinstance(tool.description, str) else None
    return ToolInfo(name, description, schema, annotations or None)


@dataclasses.dataclass(frozen=True)
class CallOutcome:
    output: str | None = None
    error: "dict[str, Any] | None" = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def for_model(self) -> str:
        """What the model reads as the tool's answer."""
        if self.error is None:
            return self.output or ""
        return f"Error: {error_text(self.error)}"


def error_text(error: dict[str, Any]) -> str:
    if error.get("type") == "mcp_tool_execution_error":
        return content_text(error.get("content") or [], 1 << 20) or "the tool failed"
    return str(error.get("message") or "the call failed")


def outcome_from_sdk(result: Any, bytes_max: int) -> CallOutcome:
    """A ``CallToolResult`` as an outcome, its text bounded."""
    parts = [part.model_dump(by_alias=True, exclude_none=True, mode="json") for part in result.content or ()]
    if result.is_error:
        text = content_text(parts, bytes_max)
        return CallOutcome(error={"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": text}]})
    if not parts and result.structured_content is not None:
        return CallOutcome(output=bounded(orjson.dumps(result.structured_content).decode(), bytes_max))
    return CallOutcome(output=content_text(parts, bytes_max))


def protocol_error(code: int, message: str) -> CallOutcome:
    return CallOutcome(error={"type": "mcp_protocol_error", "code": int(code), "message": bounded(message, 2048)})


def http_error(code: int, message: str) -> CallOutcome:
    return CallOutcome(error={"type": "http_error", "code": int(code), "message": bounded(message, 2048)})


def content_text(parts: "list[dict[str, Any]]", bytes_max: int) -> str:
    pieces = []
    for part in parts:
        kind = part.get("type")
        if kind == "text":
            pieces.append(str(part.get("text", "")))
        elif kind == "resource":
            resource = part.get("resource") or {}
            pieces.append(str(resource.get("text")) if "text" in resource
                          else f"[resource {resource.get('uri', '')} ({resource.get('mimeType', 'binary')})]")
        elif kind == "resource_link":
            pieces.append(f"[resource {part.get('uri', '')}]")
        elif kind in ("image", "audio"):
            pieces.append(f"[{kind} ({part.get('mimeType', 'unknown type')})]")
    return bounded("\n".join(pieces), bytes_max)


def bounded(text: str, bytes_max: int) -> str:
    """``text`` cut to at most ``bytes_max`` UTF-8 bytes and a note of what was cut."""
    data = text.encode("utf-8", "replace")
    if len(data) <= bytes_max:
        return text
    head = data[:bytes_max].decode("utf-8", "ignore")  # a character cut in half is dropped
    return f"{head}\n[... {len(data) - len(head.encode())} more bytes cut: the answer was longer than the gateway keeps]"

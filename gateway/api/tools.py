"""The request's tools: ``tools``, ``tool_choice``, ``parallel_tool_calls``, and the legacy ``functions`` /
``function_call`` (mapped to the former), checked as OpenAI defines them.

What is checked here fails with a 400 naming the field, rather than being ignored with a 200 (which
is what agent frameworks cannot detect): a malformed tool, duplicate names, a ``tool_choice`` naming
a function the request does not offer, ``required`` without tools. ``required`` and a named function
are enforced by the engine's constrained decoding (``structured.tool_call_schema``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .errors import BadRequest

TOOLS_MAX = 128
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # OpenAI: a-z, A-Z, 0-9, underscores and dashes, at most 64


@dataclasses.dataclass(frozen=True, slots=True)
class ToolSpec:
    tools: "list[dict[str, Any]] | None"  # as the chat template takes them
    choice: str  # "none", "auto", "required" or "named"
    parallel: bool
    name: str | None = None  # the function a named tool_choice calls


NO_TOOLS = ToolSpec(None, "none", True)


def parse_tools(body: dict[str, Any]) -> ToolSpec:
    if ("tools" not in body and "tool_choice" not in body and "functions" not in body
            and "function_call" not in body and "parallel_tool_calls" not in body):
        return NO_TOOLS  # the common request: one look per field (no generator: every request passes here)
    tools, choice = body.get("tools"), body.get("tool_choice")
    if body.get("functions") is not None or body.get("function_call") is not None:
        if tools is not None or choice is not None:
            raise BadRequest("'functions'/'function_call' and 'tools'/'tool_choice' cannot be used together",
                             param="functions", code="invalid_value")
        functions = body.get("functions")
        if functions is not None and not isinstance(functions, list):
            raise BadRequest("'functions' must be an array", param="functions", code="invalid_type")
        tools = [{"type": "function", "function": f} for f in functions] if functions is not None else None
        legacy = body.get("function_call")
        choice = {"type": "function", "function": legacy} if isinstance(legacy, dict) else legacy
    return tool_spec(tools, choice, body.get("parallel_tool_calls", True))


def tool_spec(tools: Any, choice: Any, parallel: Any = True) -> ToolSpec:
    """Function tools in OpenAI's chat shape, a ``tool_choice`` in its shape and ``parallel_tool_calls``, checked:
    what every API's translation of its tools ends in."""
    if tools is None and choice is None and parallel is True:
        return NO_TOOLS
    checked = _check_tools(tools) if tools is not None else None
    if not isinstance(parallel, bool):
        raise BadRequest("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls", code="invalid_type")
    choice, name = _check_choice(choice, checked)
    return ToolSpec(checked or None, choice, parallel, name)


def _check_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be an array", param="tools", code="invalid_type")
    if len(tools) > TOOLS_MAX:
        raise BadRequest(f"'tools' has more than {TOOLS_MAX} entries", param="tools", code="invalid_value")
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise BadRequest(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", param=where,
                             code="invalid_value")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise BadRequest(f"{where}.function.name must be 1-64 letters, digits, '_', '-', '.' or ':'",
                             param=f"{where}.function.name", code="invalid_value")
        if name in names:
            raise BadRequest(f"{where}.function.name {name!r} is offered twice", param=f"{where}.function.name",
                             code="invalid_value")
        names.add(name)
        if "parameters" in function and not isinstance(function["parameters"], dict):
            raise BadRequest(f"{where}.function.parameters must be a JSON Schema object",
                             param=f"{where}.function.parameters", code="invalid_type")
        if "description" in function and not isinstance(function["description"], str):
            raise BadRequest(f"{where}.function.description must be a string", param=f"{where}.function.description",
                             code="invalid_type")
    return tools


def _check_choice(choice: Any, tools: "list[dict[str, Any]] | None") -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("none", "auto"):
        return choice, None
    if choice == "required":
        if not tools:
            raise BadRequest("tool_choice 'required' needs 'tools'", param="tool_choice", code="invalid_value")
        return "required", None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not any(t["function"]["name"] == name for t in tools or ()):
            raise BadRequest(f"tool_choice names the function {name!r}, which is not in 'tools'",
                             param="tool_choice", code="invalid_value")
        return "named", name
    raise BadRequest("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                     "{\"name\": ...}}", param="tool_choice", code="invalid_value")

"""POST /parse/function_call and POST /parse/reasoning: a parser run on a text, no engine involved.

For operators checking what a model's raw output turns into (smg and SGLang have both; the
shapes are SGLang's):

    /parse/function_call  {"text", "tool_call_parser", "tools"?} -> {"normal_text", "calls": [
                          {"tool_index", "name", "parameters"}]}  (parameters: JSON text)
    /parse/reasoning      {"text", "reasoning_parser"} -> {"text", "reasoning_text"}
"""

from __future__ import annotations

from typing import Any

from ..parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, HarmonyUnavailable, reasoning_parser, tool_call_parser
from ..base.registry import Registry
from .errors import BadRequest, Unavailable
from .http import Request
from .protocol import parse_json_body
from .state import GatewayState


# The longest text a parse endpoint takes: as long as a model's answer gets (a 128k-token answer is ~512 KB),
# parsed in one step on the event loop (linear parsers: ~10 ms a megabyte, tests/unit/test_parser_complexity.py).
TEXT_CHARS_MAX = 1024 * 1024


def _text(body: dict[str, Any]) -> str:
    text = body.get("text")
    if not isinstance(text, str):
        raise BadRequest("'text' must be a string", param="text")
    if len(text) > TEXT_CHARS_MAX:
        raise BadRequest(f"'text' is longer than {TEXT_CHARS_MAX} characters", param="text", code="text_too_long")
    return text


def _parser_name(body: dict[str, Any], field: str, known: Registry[Any]) -> str:
    name = body.get(field)
    if not isinstance(name, str) or name not in known:
        raise BadRequest(f"'{field}' must be one of {', '.join(known.names())} (or an alias: vLLM's and SGLang's "
                         "names)", param=field, code="unknown_parser")
    return name


def _tools(body: dict[str, Any]) -> "list[dict[str, Any]] | None":
    tools = body.get("tools")
    if tools is None:
        return None
    if isinstance(tools, list) and all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                       and isinstance(t["function"].get("name"), str) for t in tools):
        return tools
    raise BadRequest("'tools' must be a list of {\"type\": \"function\", \"function\": {\"name\": ...}}",
                     param="tools")


async def parse_function_call(state: GatewayState, request: Request) -> None:
    body = parse_json_body(await request.body())
    text, name, tools = _text(body), _parser_name(body, "tool_call_parser", TOOL_CALL_PARSERS), _tools(body)
    names = [t["function"]["name"] for t in tools] if tools is not None else None
    try:
        result = tool_call_parser(name, tools).parse(text)  # the tools' schemas type the values some formats write
    except HarmonyUnavailable as e:
        raise Unavailable(str(e), code="parser_unavailable") from None
    calls = [{"tool_index": names.index(c.name) if names is not None else -1, "name": c.name,
              "parameters": c.arguments} for c in result.calls]
    await request.send_json(200, {"normal_text": result.content, "calls": calls})


async def parse_reasoning(state: GatewayState, request: Request) -> None:
    body = parse_json_body(await request.body())
    text, name = _text(body), _parser_name(body, "reasoning_parser", REASONING_PARSERS)
    try:
        result = reasoning_parser(name).parse(text)
    except HarmonyUnavailable as e:
        raise Unavailable(str(e), code="parser_unavailable") from None
    await request.send_json(200, {"text": result.content, "reasoning_text": result.reasoning})

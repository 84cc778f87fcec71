"""A Responses request as the chat request it means (``to_chat_request``), with the chat path's field checks, so the
template, tools, constraints, parsers and bounds are the chat path's; and the items of a conversation as the chat
messages a model reads (``chat_messages``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...mcp.results import error_text
from ..errors import BadRequest, shown, type_name
from ..items import content_text, input_items, message_content
from ..mcp_tools import is_hosted
from ..protocol import (TOP_LOGPROBS_MAX, ImageRef, apply_reasoning_effort, chat_request, check_message_count, field,
                        positive_int, temperature_value, top_p_value)
from ...serving.chat import REDACTED_REASONING_PREFIX, ChatRequest, SamplingRequest
from ..structured import response_format_constraint
from ..tools import tool_spec


def chat_messages(items: "list[dict[str, Any]]", images: "list[ImageRef] | None" = None) -> list[dict[str, Any]]:
    """Items as chat messages: consecutive calls join one assistant message, reasoning goes with the next; a user
    message's images into ``images`` (in order), each an image part of its content. An MCP call is a call and its
    result; an approval the user refused, the call and the refusal; a tool list and a pending approval, nothing
    (the tools are the request's, the call not made)."""
    messages: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []  # MCP calls' results: after their calls' assistant message
    approvals: dict[Any, dict[str, Any]] | None = None  # the approvals asked, by id: made when a refusal needs them
    reasoning: dict[str, Any] = {}  # the reasoning for the next assistant message: its text, a provider's signature
    for item in items:
        kind = item["type"]
        if kind == "mcp_call":
            reasoning = _add_call(messages, item["id"], item["name"], item["arguments"], reasoning)
            error = item.get("error")
            results.append({"role": "tool", "tool_call_id": item["id"], "content": item.get("output") or "" if error
                            is None else f"Error: {error_text(error) if isinstance(error, dict) else error}"})
            continue
        if kind == "mcp_approval_response" and not item["approve"]:
            if approvals is None:
                approvals = {asked.get("id"): asked for asked in items if asked["type"] == "mcp_approval_request"}
            asked = approvals.get(item["approval_request_id"])
            if asked is not None:
                reasoning = _add_call(messages, asked["id"], asked["name"], asked["arguments"], reasoning)
                refusal = "The user did not approve this call" + (f": {item['reason']}" if item.get("reason") else ".")
                results.append({"role": "tool", "tool_call_id": asked["id"], "content": refusal})
                continue
        if kind == "function_call":
            reasoning = _add_call(messages, item["call_id"], item["name"], item["arguments"], reasoning)
            continue
        messages += results
        results = []
        if kind == "reasoning":
            text = "".join(c.get("text", "") for c in item.get("content") or () if isinstance(c, dict))
            encrypted = item.get("encrypted_content")
            if isinstance(encrypted, str) and encrypted.startswith(REDACTED_REASONING_PREFIX):
                reasoning.setdefault("thinking_blocks", []).append(
                    {"type": "redacted_thinking", "data": encrypted[len(REDACTED_REASONING_PREFIX):]})
                continue
            if text:
                reasoning["reasoning_content"] = reasoning.get("reasoning_content", "") + text
            if isinstance(encrypted, str) and encrypted:  # a provider's signature (gateway/providers/anthropic.py)
                reasoning["reasoning_signature"] = encrypted
                # block by block too: each signature is of its own item's text (Anthropic's interleaved thinking)
                reasoning.setdefault("thinking_blocks", []).append(
                    {"type": "thinking", "thinking": text, "signature": encrypted})
        elif kind == "message":
            role = item["role"]
            content = message_content(item["content"], "input", images) if role == "user" and images is not None \
                else content_text(item["content"], "input")
            message = {"role": "system" if role == "developer" else role, "content": content}
            if role == "assistant" and reasoning:
                message.update(reasoning)
                reasoning = {}
            messages.append(message)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        # (mcp_list_tools, mcp_approval_request, an approved mcp_approval_response: nothing the model reads)
    return messages + results


def _add_call(messages: "list[dict[str, Any]]", call_id: str, name: str, arguments: str,
              reasoning: "dict[str, Any]") -> "dict[str, Any]":
    """A call into the last assistant message (or a new one, with the pending reasoning); the reasoning left."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
        return reasoning
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    message.update(reasoning)
    messages.append(message)
    return {}


def _tools(raw: Any) -> list[dict[str, Any]]:
    """The Responses API's function tools (flat: name, description, parameters) in the chat shape; the tools the
    node runs itself (MCP servers, built-in types a configured server serves) are the tool loop's."""
    if not isinstance(raw, list):
        raise BadRequest(f"'tools' must be a list, got {type_name(raw)}", param="tools", code="invalid_type")
    tools = []
    for i, tool in enumerate(raw):
        if is_hosted(tool):
            continue
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise BadRequest(f"tools[{i}]: only function and mcp tools are supported, got {shown(kind)}",
                             param=f"tools[{i}]", code="unsupported_parameter")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        tools.append({"type": "function", "function": function})
    return tools


def has_hosted_tools(body: dict[str, Any], inputs: "list[dict[str, Any]]") -> bool:
    """Tools the node runs (MCP), or an MCP approval being answered among the body's ``inputs`` (as
    ``input_items`` checked them): the request takes the tool loop."""
    tools = body.get("tools")
    if isinstance(tools, list) and any(is_hosted(tool) for tool in tools):
        return True
    for item in inputs:  # a loop, not any(): most inputs are a message or two, and a generator costs more
        if item["type"] == "mcp_approval_response":
            return True
    return False


def _tool_choice(choice: Any) -> Any:
    """The Responses API's tool_choice in the chat shape: a named function is flat here; an MCP server's tool
    (``{"type": "mcp", "server_label", "name"}``) is that function, a server without a name any tool."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict) and choice.get("type") == "mcp":
        name = choice.get("name")
        return {"type": "function", "function": {"name": name}} if isinstance(name, str) else "required"
    return choice


def _text_format(text: Any) -> "dict[str, Any] | None":
    """``text.format`` in chat's response_format shape (json_schema's fields are flat here)."""
    if not isinstance(text, dict) or text.get("format") is None:
        return None
    fmt = text["format"]
    if not isinstance(fmt, dict):
        raise BadRequest(f"text.format must be an object, got {type_name(fmt)}", param="text.format",
                         code="invalid_type")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    return fmt  # text, json_object: the chat shape already


def _reasoning_effort(body: dict[str, Any]) -> str | None:
    reasoning = body.get("reasoning")
    if not isinstance(reasoning, dict) or reasoning.get("effort") is None:
        return None
    effort = reasoning["effort"]
    if not isinstance(effort, str):
        raise BadRequest(f"'reasoning.effort' must be a string, got {type_name(effort)}", param="reasoning.effort",
                         code="invalid_type")
    return effort


def to_chat_request(body: dict[str, Any], history: "Sequence[dict[str, Any]]", after: "list[dict[str, Any]]" = (),
                    hosted: "list[dict[str, Any]]" = (), tools_off: bool = False,
                    inputs: "list[dict[str, Any]] | None" = None) -> ChatRequest:
    """The chat request a Responses request means, after the stored conversation ``history``; in a tool loop,
    with the response's items so far (``after``), the MCP tools as functions (``hosted``), and no tools at all
    once the loop's calls are spent (``tools_off``). ``inputs``: the body's input as ``input_items`` gave it,
    when the caller has it already."""
    model = field(body, "model", str)
    images: list[ImageRef] = []
    if inputs is None:
        inputs = input_items(body.get("input"))
    messages = chat_messages([*history, *inputs, *after], images)
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise BadRequest(f"'instructions' must be a string, got {type_name(body['instructions'])}",
                             param="instructions", code="invalid_type")
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    check_message_count(len(messages), "input")
    # A field's check runs when the request has the field: most have two or three of them.
    sampling = SamplingRequest(max_tokens=positive_int(body, "max_output_tokens"),
                               temperature=temperature_value(body) if "temperature" in body else None,
                               top_p=top_p_value(body) if "top_p" in body else None)
    if "include" in body and INCLUDE_LOGPROBS in included(body):  # top_logprobs alone has nothing to show
        sampling.logprobs = positive_int(body, "top_logprobs", None, minimum=0, maximum=TOP_LOGPROBS_MAX) or 0
    response_format = _text_format(body["text"]) if "text" in body else None
    if response_format is not None:
        sampling.constraint = response_format_constraint(response_format, "text.format")
        sampling.constraint_field = "text.format" if sampling.constraint is not None else None
    functions = [*_tools(body["tools"]), *hosted] if body.get("tools") else None
    tools = tool_spec(functions or None, "none" if tools_off else
                      (_tool_choice(body["tool_choice"]) if "tool_choice" in body else None),
                      body["parallel_tool_calls"] if body.get("parallel_tool_calls") is not None else True)
    template_kwargs: dict[str, Any] = {}
    thinking = apply_reasoning_effort(_reasoning_effort(body), template_kwargs, "reasoning.effort") \
        if "reasoning" in body else True
    return chat_request(model, messages, sampling, stream=field(body, "stream", bool, False), tools=tools,
                        template_kwargs=template_kwargs, thinking=thinking, images=tuple(images))


# OpenAI's includable fields. Only the output text's logprobs exist here; the others belong to tools this
# gateway does not run (file search, web search, code interpreter, computer use, images) or to
# encrypted reasoning, which it does not make: asked for, they have nothing to add.
INCLUDE_LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = frozenset({INCLUDE_LOGPROBS, "reasoning.encrypted_content", "file_search_call.results",
                        "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
                        "computer_call_output.output.image_url", "code_interpreter_call.outputs"})


def included(body: dict[str, Any]) -> frozenset[str]:
    raw = body.get("include")
    if raw is None:
        return frozenset()
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise BadRequest("'include' must be a list of strings", param="include", code="invalid_type")
    unknown = [v for v in raw if v not in INCLUDABLE]
    if unknown:
        raise BadRequest(f"'include': unknown value {shown(unknown[0])}; one of {', '.join(sorted(INCLUDABLE))}",
                         param="include", code="invalid_value")
    return frozenset(raw)


# -- the answer ----------------------------------------------------------------------------------------------

# A response object's fields in OpenAI's order, with the values of a request that sets none of them: every
# response starts as a copy. A dict display this size cost ~650 ns on CPython 3.11 (each key inserted in
# turn), a copy of a made dict ~150 (its table copied whole). Only immutable values here: copies share them.

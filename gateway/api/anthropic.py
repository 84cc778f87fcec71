"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API on the chat pipeline.

A Messages request is translated into the chat request it means (``to_chat_request``), with the same
field checks as chat completions, so bounds, tools, tool_choice and the chat template work the same;
the answer goes through the same pipeline and parsers (``pipeline.answer_chat``) and is shaped as
Anthropic's (``MessagesShape``):

    request                                  chat request
    system (text or text blocks)             a system message first
    user text / tool_result blocks           a user message / tool messages (tool_call_id)
    assistant text / tool_use / thinking     content / tool_calls / reasoning_content
    tools [{name, description, input_schema}]  function tools
    tool_choice auto / any / tool / none     auto / required / a named function / none
      (disable_parallel_tool_use)            (parallel_tool_calls false)
    thinking enabled / disabled              chat_template_kwargs enable_thinking (and thinking) true /
                                             false; absent: the template's own default
    stop_sequences, temperature, top_p, top_k, max_tokens, stream

    answer: content blocks thinking, text, tool_use (ids toolu_...); stop_reason end_turn, max_tokens,
    stop_sequence (with stop_sequence), tool_use; usage input_tokens, output_tokens.

Streamed: ``message_start``, ``ping``, then per block ``content_block_start``, ``content_block_delta``
(``thinking_delta``, ``text_delta``, ``input_json_delta``), ``content_block_stop``, and
``message_delta`` (stop_reason, usage) and ``message_stop``; a failure after the start is an
``error`` event. Errors are Anthropic's shape (``anthropic_error_body``). ``x-api-key``
authenticates like a bearer key; ``anthropic-version`` is accepted and not required.
``thinking.budget_tokens`` is checked as Anthropic checks it (at least 1,024, below max_tokens)
but not enforced: the engine contract has no thinking budget.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from ..serving.generation import GenerationResult, UsageTally
from ..base.ids import new_id
from .chat_output import ChatOutput
from ..serving.chat import (Call, ChatAnswer, ChatRequest, Content, Delta, Reasoning, ReasoningSignature,
                            RedactedReasoning, SamplingRequest)
from .errors import ApiError, BadRequest
from .http import Request
from .mcp_tools import HostedTools
from .messages_tools import answer_with_mcp
from .pipeline import answer_chat, chat_prompt, plan_generation
from .protocol import (INT32_MAX, ImageRef, chat_request, check_message_count, field, image_part, parse_json_body,
                       stop_strings, template_content, temperature_value, text_part, thinking_of, top_k_value,
                       top_p_value)
from .ratelimits import counted_tokens
from .routed import answer_provider, answer_routed, route_of
from .state import GatewayState
from .tools import NO_TOOLS, tool_spec

THINKING_BUDGET_MIN = 1024  # Anthropic's floor for budget_tokens


def _error_type(status: int) -> str:
    return {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            503: "overloaded_error", 529: "overloaded_error"}.get(status, "api_error")


def anthropic_error_body(error: ApiError) -> bytes:
    """Anthropic's error shape: {"type": "error", "error": {"type", "message"}}."""
    return orjson.dumps({"type": "error", "error": {"type": _error_type(error.status), "message": error.message}})


def _named_event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


# -- the request ---------------------------------------------------------------------------------------------

def _text_of(value: Any, where: str) -> str:
    """A string, or text blocks joined; anything else is a 400 naming where."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, block in enumerate(value):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise BadRequest(f"{where}[{i}]: only text blocks are supported here", param=where,
                                 code="unsupported_content")
            texts.append(block["text"])
        return "".join(texts)
    raise BadRequest(f"{where} must be a string or a list of text blocks", param=where, code="invalid_type")


def _messages(raw: Any, images: "list[ImageRef]") -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list", param="messages", code="invalid_type")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BadRequest(f"{where}.role must be 'user' or 'assistant'", param=f"{where}.role",
                             code="invalid_value")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise BadRequest(f"{where}.content must be a string or a list of blocks", param=f"{where}.content",
                             code="invalid_type")
        out += _user_blocks(content, where, images) if message["role"] == "user" else \
            _assistant_blocks(content, where)
    return out


def _user_blocks(blocks: list[Any], where: str, images: "list[ImageRef]") -> list[dict[str, Any]]:
    """Tool results become tool messages (first, as Anthropic orders them), the text and images a user message."""
    results, parts = [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(text_part(block["text"]))
        elif kind == "image":
            part_where = f"{where}.content[{j}]"
            parts.append(image_part((_image_source(block.get("source"), part_where), "auto"), part_where, images))
        elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            content = _text_of(block.get("content", ""), f"{where}.content[{j}].content")
            if block.get("is_error"):
                content = "Error: " + content
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": content})
        else:
            raise BadRequest(f"{where}.content[{j}]: a user block must be text, image or tool_result, got {kind!r}",
                             param=f"{where}.content[{j}]", code="unsupported_content")
    return results + ([{"role": "user", "content": template_content(parts)}] if parts or not results else [])


IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # Anthropic's


def _image_source(source: Any, where: str) -> str:
    """An image block's source as a URL: base64 data as a data: URI, or the url as it is."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and source.get("media_type") in IMAGE_MEDIA_TYPES and isinstance(source.get("data"), str):
        return f"data:{source['media_type']};base64,{source['data']}"
    if kind == "url" and isinstance(source.get("url"), str) and source["url"]:
        return source["url"]
    raise BadRequest(f"{where}.source must be {{\"type\": \"base64\", \"media_type\": one of "
                     f"{', '.join(IMAGE_MEDIA_TYPES)}, \"data\"}} or {{\"type\": \"url\", \"url\"}}",
                     param=f"{where}.source", code="invalid_value")


def _assistant_blocks(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """An assistant message; split where an MCP tool's result (``mcp_tool_result``, run by the server) follows its
    call: the calls so far, their results as tool messages, then the rest as the next assistant message."""
    out: list[dict[str, Any]] = []
    texts, thinking, calls, results = [], [], [], []
    signatures: list[str] = []
    # The thinking blocks as the client sent them back (signed, or redacted): an Anthropic target is given them as
    # they were (gateway/providers/anthropic.py), block for block; the others read the reasoning's text.
    kept: list[dict[str, Any]] = []

    def flush() -> None:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if thinking:
            message["reasoning_content"] = "".join(thinking)
            if signatures:  # Anthropic's, for a turn sent back to Anthropic (gateway/providers/anthropic.py)
                message["reasoning_signature"] = signatures[-1]
        if kept:
            message["thinking_blocks"] = list(kept)
        if calls:
            message["tool_calls"] = list(calls)
        out.append(message)
        out.extend(results)
        texts.clear(), thinking.clear(), calls.clear(), results.clear(), signatures.clear(), kept.clear()

    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if results and kind != "mcp_tool_result":
            flush()
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
            if isinstance(block.get("signature"), str) and block["signature"]:
                signatures.append(block["signature"])
                kept.append({"type": "thinking", "thinking": block["thinking"], "signature": block["signature"]})
        elif kind == "redacted_thinking":  # nothing a model can read but Anthropic's own (encrypted for it)
            if isinstance(block.get("data"), str) and block["data"]:
                kept.append({"type": "redacted_thinking", "data": block["data"]})
        elif kind in ("tool_use", "mcp_tool_use") and isinstance(block.get("id"), str) \
                and isinstance(block.get("name"), str) and isinstance(block.get("input"), dict):
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": orjson.dumps(block["input"]).decode()}})
        elif kind == "mcp_tool_result" and isinstance(block.get("tool_use_id"), str):
            content = _text_of(block.get("content", ""), f"{where}.content[{j}].content")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": "Error: " + content if block.get("is_error") else content})
        else:
            raise BadRequest(f"{where}.content[{j}]: an assistant block must be text, thinking, tool_use, "
                             f"mcp_tool_use or mcp_tool_result, got {kind!r}", param=f"{where}.content[{j}]",
                             code="unsupported_content")
    flush()
    return out


def _tools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise BadRequest("'tools' must be a list", param="tools", code="invalid_type")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise BadRequest(f"tools[{i}]: only client tools (name, input_schema) are supported, got {kind!r}",
                             param=f"tools[{i}]", code="unsupported_parameter")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if "description" in tool:
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(raw: Any) -> tuple[Any, bool]:
    """(OpenAI's tool_choice, parallel calls allowed)."""
    if not isinstance(raw, dict) or raw.get("type") not in ("auto", "any", "tool", "none"):
        raise BadRequest("tool_choice must be {\"type\": \"auto\"|\"any\"|\"tool\"|\"none\"}", param="tool_choice",
                         code="invalid_value")
    parallel = not raw.get("disable_parallel_tool_use", False)
    kind = raw["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": raw.get("name")}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def to_chat_request(body: dict[str, Any], count_only: bool = False, hosted: "list[dict[str, Any]]" = ()
                    ) -> ChatRequest:
    """The chat request a Messages request means (``count_only``: a count_tokens request, without max_tokens;
    ``hosted``: the request's MCP servers' tools, as functions)."""
    max_tokens = body.get("max_tokens")
    if not (count_only and max_tokens is None) and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= INT32_MAX):
        raise BadRequest("'max_tokens' is required: a positive integer", param="max_tokens",
                         code="missing_required_parameter" if max_tokens is None else "invalid_value")
    model = field(body, "model", str)
    images: list[ImageRef] = []
    messages = _messages(body.get("messages"), images)
    if body.get("system") is not None:
        messages.insert(0, {"role": "system", "content": _text_of(body["system"], "system")})
    check_message_count(len(messages), "messages")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise BadRequest("'metadata' must be an object", param="metadata", code="invalid_type")
    tools = NO_TOOLS
    if body.get("tools") or body.get("tool_choice") is not None or hosted:
        choice, parallel = _tool_choice(body["tool_choice"]) if body.get("tool_choice") is not None else (None, True)
        functions = [*(_tools(body["tools"]) if body.get("tools") else ()), *hosted]
        tools = tool_spec(functions or None, choice, parallel)
    template_kwargs: dict[str, Any] = {}
    budget = None
    thinking = body.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled"):
            raise BadRequest("thinking must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": "
                             "\"disabled\"}", param="thinking", code="invalid_value")
        enabled = thinking["type"] == "enabled"
        if enabled:
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < THINKING_BUDGET_MIN or (
                    max_tokens is not None and budget >= max_tokens):
                raise BadRequest(f"thinking.budget_tokens must be at least {THINKING_BUDGET_MIN} and less than "
                                 f"max_tokens", param="thinking.budget_tokens", code="invalid_value")
        template_kwargs = {"enable_thinking": enabled, "thinking": enabled}
    sampling = SamplingRequest(max_tokens=max_tokens, temperature=temperature_value(body), top_p=top_p_value(body),
                               top_k=top_k_value(body), stop=stop_strings(body, "stop_sequences"))
    return chat_request(model, messages, sampling, stream=field(body, "stream", bool, False), tools=tools,
                        template_kwargs=template_kwargs, thinking=thinking_of(template_kwargs), images=tuple(images),
                        reasoning_budget=budget)


# -- the answer ----------------------------------------------------------------------------------------------

def new_message_id() -> str:
    return new_id("msg")


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(result: GenerationResult, called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished generation."""
    if result.finish_reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(result.matched_stop, str):
        return "stop_sequence", result.matched_stop
    return "end_turn", None


def _usage(result: GenerationResult) -> dict[str, int]:
    """Anthropic's counts: ``input_tokens`` are the prompt's tokens not read from the cache, which clients add to
    ``cache_read_input_tokens`` (a 133-token prompt with 128 cached was counted 261)."""
    cached = min(result.cached_tokens, result.prompt_tokens)
    return {"input_tokens": result.prompt_tokens - cached, "output_tokens": result.completion_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


class MessagesShape:
    """One answer as Anthropic's Messages: the body, or the stream of its events (the ``ChatRenderer`` of this
    API). Each kind of delta is a content block: ``thinking``, ``text``, ``tool_use`` (one block per call)."""

    done = b""  # a Messages stream ends with message_stop, not [DONE]
    api = "messages"

    def __init__(self, message_id: str, model: str, prompt_tokens: int) -> None:
        self.id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self._index = -1  # the open block's index; -1: none open
        self._kind: str | None = None  # the open block's type
        # An MCP tool loop's (messages_tools.py): the tools the node runs, by name; the blocks so far (whole);
        # the calls to them of the step just generated.
        self.hosted: HostedTools | None = None
        self.content: list[dict[str, Any]] = []
        self.pending: list[tuple[dict[str, Any], Call]] = []

    def whole(self, answer: ChatAnswer) -> dict[str, Any]:
        self.add_answer(answer)
        return self.message(answer.result, answer.called)

    @staticmethod
    def passed(delta: Any) -> bytes:
        """Anthropic's own events (``providers.Passed``) go as they are, its message id with them."""
        return delta.events

    @staticmethod
    def passed_whole(body: "dict[str, Any]") -> "dict[str, Any]":
        return body

    def message(self, result: GenerationResult, called: bool) -> dict[str, Any]:
        reason, sequence = stop_reason(result, called)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": self.content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(result)}

    def add_answer(self, answer: ChatAnswer) -> None:
        """A whole answer's blocks (an MCP loop's step: its calls to the node's tools wait in ``pending``)."""
        if answer.thinking_blocks is not None:  # a provider's, block by block (signed; redacted)
            self.content += answer.thinking_blocks
        elif answer.reasoning:
            # A provider's signature (Anthropic's, Bedrock's): the client sends it back with the block.
            self.content.append({"type": "thinking", "thinking": answer.reasoning,
                                 "signature": answer.reasoning_signature or ""})
        if answer.content:
            self.content.append({"type": "text", "text": answer.content})
        for call in answer.calls:
            self.content.append(self._call_block(call))

    def _call_block(self, call: Call) -> dict[str, Any]:
        server = self.hosted.server_of(call.name) if self.hosted is not None else None
        if server is None:
            return {"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name, "input": _input(call)}
        block = {"type": "mcp_tool_use", "id": "mcptoolu_" + call.id.removeprefix("call_"), "name": call.name,
                 "server_name": server.label, "input": _input(call)}
        self.pending.append((block, call))
        return block

    def result_events(self, call_block: dict[str, Any], text: str, is_error: bool, streamed: bool) -> bytes:
        """An MCP call's result: a block of its own after the call's."""
        block = {"type": "mcp_tool_result", "tool_use_id": call_block["id"], "is_error": is_error,
                 "content": [{"type": "text", "text": text}]}
        if not streamed:
            self.content.append(block)
            return b""
        return self._open("mcp_tool_result", block, new=True) + self._close()

    def text_event(self, text: str, first: bool) -> bytes:
        out = self._opening() if first else b""
        if text:
            out += self._open("text", _TEXT_BLOCK) + self._delta({"type": "text_delta", "text": text})
        return out

    def delta_events(self, deltas: "list[Delta]", first: bool) -> bytes:
        out = self._opening() if first else b""
        for delta in deltas:
            kind = type(delta)
            if kind is Content:
                out += self._open("text", _TEXT_BLOCK) + self._delta({"type": "text_delta", "text": delta.text})
            elif kind is Reasoning:
                out += self._open("thinking", _THINKING_BLOCK)
                out += self._delta({"type": "thinking_delta", "thinking": delta.text})
            elif kind is ReasoningSignature:  # a provider's, at the end of its thinking block (as Anthropic sends it)
                out += self._open("thinking", _THINKING_BLOCK)
                out += self._delta({"type": "signature_delta", "signature": delta.signature}) + self._stop()
            elif kind is RedactedReasoning:  # whole in its block's start, as Anthropic sends it
                out += self._open("redacted_thinking", {"type": "redacted_thinking", "data": delta.data}, new=True)
                out += self._stop()
            elif kind is Call:  # a call is a block of its own
                block = self._call_block(delta)
                out += self._open(block["type"], {**block, "input": {}}, new=True)
                if delta.arguments:
                    out += self._delta({"type": "input_json_delta", "partial_json": delta.arguments})
        return out

    def final_events(self, deltas: "list[Delta]", answer: ChatAnswer) -> bytes:
        out = self.delta_events(deltas, False) if deltas else b""
        return out + self.closing_events(answer.result, answer.called)

    def close(self) -> bytes:
        return self._close() if self._kind is not None else b""

    def closing_events(self, result: GenerationResult, called: bool) -> bytes:
        out = self.close()
        reason, sequence = stop_reason(result, called)
        # The final counts (cumulative: a client takes them over message_start's, whose cache reads were not
        # known yet).
        out += _named_event("message_delta", {"type": "message_delta",
                                              "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                              "usage": _usage(result)})
        return out + _named_event("message_stop", {"type": "message_stop"})

    def error_event(self, error: ApiError) -> bytes:
        return b"event: error\ndata: " + anthropic_error_body(error) + b"\n\n"

    def opening(self) -> bytes:
        return self._opening()

    def _opening(self) -> bytes:
        return _named_event("message_start", {"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}}) + _named_event("ping", {"type": "ping"})

    def _open(self, kind: str, block: dict[str, Any], new: bool = False) -> bytes:
        if self._kind == kind and not new:
            return b""
        out = self._close() if self._kind is not None else b""
        self._index += 1
        self._kind = kind
        return out + _named_event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                          "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _named_event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                    "delta": delta})

    def _close(self) -> bytes:
        out = b""
        if self._kind == "thinking":  # the SDK's thinking block carries a signature: ours is empty
            out += self._delta({"type": "signature_delta", "signature": ""})
        return out + self._stop()

    def _stop(self) -> bytes:
        self._kind = None
        return _named_event("content_block_stop", {"type": "content_block_stop", "index": self._index})


_TEXT_BLOCK = {"type": "text", "text": ""}
_THINKING_BLOCK = {"type": "thinking", "thinking": ""}


def _input(call: Call) -> Any:
    """A call's arguments as a block's input (an object; what is not JSON, as the model wrote it)."""
    try:
        return orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return {"arguments": call.arguments}


# -- the endpoints -------------------------------------------------------------------------------------------

async def messages(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    body = parse_json_body(raw)
    if body.get("mcp_servers"):  # tools the node runs: the loop (messages_tools.py)
        await answer_with_mcp(state, request, body, to_chat_request,
                              lambda model: MessagesShape(new_message_id(), model, 0))
        return
    chat = to_chat_request(body)
    route = route_of(state, chat.model, request)
    if route is None:
        await _messages_on_pool(state, request, chat)
        return
    await answer_routed(state, request, route,
                        lambda model: _messages_on_pool(state, request, dataclasses.replace(chat, model=model)),
                        lambda target: answer_provider(state, request, chat, target, route.name,
                                                       MessagesShape(new_message_id(), target.model, 0)), len(raw))


async def _messages_on_pool(state: GatewayState, request: Request, chat: ChatRequest) -> None:
    """A Messages request answered by the fleet's workers serving ``chat.model``."""
    prompt = await chat_prompt(state, request, chat, "Messages API")
    entry = prompt.entry
    plan = plan_generation(state, request, entry, prompt.ids, chat.sampling, chat.stream, "messages", prompt.media,
                           prompt.routing_ids)
    output = ChatOutput.for_request(entry, chat)
    if output is not None:
        plan.kept_special = output.kept_special
    await answer_chat(state, request, plan, prompt.tokenizer, output, MessagesShape(new_message_id(), entry.name,
                                                                                    len(prompt.ids)))


async def count_tokens(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    usage = UsageTally()
    chat = to_chat_request(parse_json_body(raw), count_only=True)
    async with counted_tokens(state, request, len(raw), chat.model, usage):
        input_ids = (await chat_prompt(state, request, chat, "Messages API")).ids
        usage.prompt_tokens = len(input_ids)
    await request.send_json(200, {"input_tokens": len(input_ids)})

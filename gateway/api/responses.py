"""OpenAI's Responses API on the chat pipeline: POST /v1/responses, GET and DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items.

A request is translated into the chat request it means (``to_chat_body``) and checked by the chat
parser, so the template, tools, constraints, parsers and bounds are the chat path's:

    input (a string, or items)          messages; function_call -> an assistant message's tool_calls;
                                        function_call_output -> a tool message; reasoning -> the next
                                        assistant message's reasoning_content
    instructions                        a system message first (not carried to a follow-up)
    previous_response_id                the stored conversation (input and output) before this input
    tools [{type: function, name, ..}]  function tools; tool_choice, parallel_tool_calls
    reasoning.effort                    reasoning_effort
    text.format                         response_format (json_schema's fields flat, as the API has them)
    max_output_tokens, temperature, top_p, metadata, store (default true), stream

The answer's output items: ``reasoning`` (reasoning_text content), ``message`` (output_text),
``function_call``; status completed, or incomplete (max_output_tokens). Streamed: response.created,
response.in_progress, then per item output_item.added / content_part.added / *.delta / *.done /
output_item.done, and response.completed (or response.failed), each with its sequence_number.
Stored responses are scoped to their creator and kept by the history backend (``gateway/history``):
with the default memory backend, on three nodes of the cluster, so a follow-up works on any node.
``conversation`` (an id from /v1/conversations) gives the model the conversation's items before the
input, and adds the input and output items to it. Not yet: ``background``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson
import trio

from ..generation import GenerationResult
from ..history import ID_CHARS_MAX, StoredResponse
from .chat_output import ChatOutput
from .errors import ApiError, BadRequest, NotFound
from .http import Request
from .openai import _OpenAIShape, chat_prompt, plan_generation
from .protocol import parse_chat, parse_json_body
from .respond import admitted, run_streamed, run_unary

METADATA_KEYS_MAX = 16  # OpenAI's bounds for metadata
METADATA_VALUE_CHARS_MAX = 512


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def owner_of(request: Request) -> str:
    """Whose stored data this is: the tenant, else the key, else "anonymous"."""
    principal = request.principal
    return f"tenant:{principal.tenant}" if principal.tenant else principal.key_id


# -- the request ---------------------------------------------------------------------------------------------

def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}[{i}]: only text parts are supported, got {kind!r}", param=where,
                                 code="unsupported_content")
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequest(f"{where} must be a string or a list of parts", param=where, code="invalid_type")


def input_items(raw: Any) -> list[dict[str, Any]]:
    """The request's input as items (a string is one user message), each checked."""
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]}]
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'input' must be a string or a non-empty list of items", param="input", code="invalid_type")
    items = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object", param=where, code="invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                raise BadRequest(f"{where}.role must be user, assistant, system or developer", param=f"{where}.role",
                                 code="invalid_value")
            _content_text(item.get("content"), f"{where}.content")
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise BadRequest(f"{where}: a function_call needs call_id, name and arguments", param=where,
                                 code="invalid_value")
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
                raise BadRequest(f"{where}: a function_call_output needs call_id and output", param=where,
                                 code="invalid_value")
        elif kind != "reasoning":
            raise BadRequest(f"{where}: items of type {kind!r} are not supported", param=where,
                             code="unsupported_content")
        items.append({**item, "type": kind})
    return items


def chat_messages(items: "list[dict[str, Any]]") -> list[dict[str, Any]]:
    """Items as chat messages: consecutive calls join one assistant message, reasoning goes with the next."""
    messages: list[dict[str, Any]] = []
    reasoning = ""
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            reasoning += "".join(c.get("text", "") for c in item.get("content") or () if isinstance(c, dict))
        elif kind == "message":
            message = {"role": item["role"], "content": _content_text(item["content"], "input")}
            if item["role"] == "assistant" and reasoning:
                message["reasoning_content"], reasoning = reasoning, ""
            messages.append(message)
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning:
                    message["reasoning_content"], reasoning = reasoning, ""
                messages.append(message)
        else:  # function_call_output
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


def _tools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise BadRequest("'tools' must be a list", param="tools", code="invalid_type")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise BadRequest(f"tools[{i}]: only function tools are supported, got {kind!r}", param=f"tools[{i}]",
                             code="unsupported_parameter")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        tools.append({"type": "function", "function": function})
    return tools


def _text_format(text: Any) -> "dict[str, Any] | None":
    if not isinstance(text, dict) or text.get("format") is None:
        return None
    fmt = text["format"]
    if not isinstance(fmt, dict):
        raise BadRequest("text.format must be an object", param="text.format", code="invalid_type")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    return fmt  # text, json_object: the chat shape already


def to_chat_body(body: dict[str, Any], history: "list[dict[str, Any]]") -> dict[str, Any]:
    """The chat request a Responses request means, after the stored conversation ``history``."""
    messages = chat_messages([*history, *input_items(body.get("input"))])
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise BadRequest("'instructions' must be a string", param="instructions", code="invalid_type")
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": body.get("stream", False)}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "parallel_tool_calls", "top_logprobs"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        chat["tool_choice"] = choice
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    response_format = _text_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    metadata = body.get("metadata")
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or len(metadata) > METADATA_KEYS_MAX or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= METADATA_VALUE_CHARS_MAX
            for k, v in metadata.items()):
        raise BadRequest(f"'metadata' must map at most {METADATA_KEYS_MAX} keys (64 chars) to strings "
                         f"({METADATA_VALUE_CHARS_MAX} chars)", param="metadata", code="invalid_value")
    return metadata


# -- the answer ----------------------------------------------------------------------------------------------

class ResponseShape:
    """One response object, its output items as they are decided, and its stream's events."""

    def __init__(self, response_id: str, model: str, body: dict[str, Any], chat: Any, metadata: dict[str, str],
                 previous_response_id: str | None, store: bool, conversation_id: str | None = None) -> None:
        self.id = response_id
        self.created_at = int(time.time())
        self.base = {
            "id": response_id, "object": "response", "created_at": self.created_at, "model": model,
            "instructions": body.get("instructions"), "metadata": metadata,
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "max_output_tokens": body.get("max_output_tokens"), "previous_response_id": previous_response_id,
            "reasoning": body.get("reasoning"), "text": body.get("text") or {"format": {"type": "text"}},
            "store": store, "truncation": "disabled", "error": None, "incomplete_details": None,
        }
        if conversation_id is not None:
            self.base["conversation"] = {"id": conversation_id}
        self.output: list[dict[str, Any]] = []
        self._sequence = 0
        self._open: dict[str, Any] | None = None  # the item being streamed

    def response(self, status: str, result: GenerationResult | None = None, usage_details: Any = None
                 ) -> dict[str, Any]:
        body = {**self.base, "status": status, "output": self.output, "usage": None}
        if result is not None:
            body["usage"] = {"input_tokens": result.prompt_tokens,
                             "input_tokens_details": {"cached_tokens": result.cached_tokens},
                             "output_tokens": result.completion_tokens,
                             "output_tokens_details": {"reasoning_tokens": usage_details or 0},
                             "total_tokens": result.prompt_tokens + result.completion_tokens}
            if result.finish_reason == "length":
                body["status"] = "incomplete"
                body["incomplete_details"] = {"reason": "max_output_tokens"}
        return body

    # -- whole --

    def items_from(self, message: dict[str, Any]) -> None:
        if message.get("reasoning_content"):
            self.output.append({"type": "reasoning", "id": new_id("rs"), "summary": [],
                                "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}]})
        if message.get("content"):
            self.output.append(_message_item(new_id("msg"), message["content"], "completed"))
        for call in message.get("tool_calls") or ():
            self.output.append({"type": "function_call", "id": new_id("fc"), "call_id": call["id"],
                                "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                                "status": "completed"})

    # -- streamed --

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def opening(self) -> bytes:
        return self.event("response.created", response=self.response("in_progress")) + \
            self.event("response.in_progress", response=self.response("in_progress"))

    def deltas(self, deltas: "list[dict[str, Any]]") -> bytes:
        out = b""
        for delta in deltas:
            if delta.get("reasoning_content"):
                out += self._ensure("reasoning") + self._text_delta("response.reasoning_text.delta",
                                                                    delta["reasoning_content"])
            elif delta.get("content"):
                out += self._ensure("message") + self._text_delta("response.output_text.delta", delta["content"])
            elif delta.get("tool_calls"):
                call = delta["tool_calls"][0]
                if "id" in call:
                    out += self._close() + self._open_item({
                        "type": "function_call", "id": new_id("fc"), "call_id": call["id"],
                        "name": call["function"]["name"], "arguments": "", "status": "in_progress"})
                elif call["function"].get("arguments"):
                    item = self._open
                    item["arguments"] += call["function"]["arguments"]
                    out += self.event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=len(self.output) - 1, delta=call["function"]["arguments"])
        return out

    def close(self) -> bytes:
        return self._close()

    def _ensure(self, kind: str) -> bytes:
        if self._open is not None and self._open["type"] == kind:
            return b""
        out = self._close()
        if kind == "reasoning":
            item = {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = _message_item(new_id("msg"), None, "in_progress")
            part = {"type": "output_text", "text": "", "annotations": []}
        out += self._open_item(item)
        self._text = ""
        return out + self.event("response.content_part.added", item_id=item["id"], output_index=len(self.output) - 1,
                                content_index=0, part=part)

    def _open_item(self, item: dict[str, Any]) -> bytes:
        self.output.append(item)
        self._open = item
        return self.event("response.output_item.added", output_index=len(self.output) - 1, item=item)

    def _text_delta(self, kind: str, text: str) -> bytes:
        self._text += text
        extra = {"logprobs": []} if kind == "response.output_text.delta" else {}
        return self.event(kind, item_id=self._open["id"], output_index=len(self.output) - 1, content_index=0,
                          delta=text, **extra)

    def _close(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        self._open = None
        index = len(self.output) - 1
        out = b""
        if item["type"] == "function_call":
            item["status"] = "completed"
            out += self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              name=item["name"], arguments=item["arguments"])
        else:
            if item["type"] == "reasoning":
                part = {"type": "reasoning_text", "text": self._text}
                out += self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=self._text)
            else:
                part = {"type": "output_text", "text": self._text, "annotations": []}
                out += self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=self._text, logprobs=[])
                item["status"] = "completed"
            item["content"] = [part]
            out += self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                              part=part)
        return out + self.event("response.output_item.done", output_index=index, item=item)


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


# -- the endpoints -------------------------------------------------------------------------------------------

def stored_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as it is stored and listed: a message's text as parts, with a status (OpenAI's shape)."""
    if item["type"] == "message":
        content = item["content"]
        if isinstance(content, str):
            kind = "output_text" if item["role"] == "assistant" else "input_text"
            content = [{"type": kind, "text": content}]
        return {"id": item["id"], "type": "message", "status": item.get("status", "completed"),
                "role": item["role"], "content": content}
    return item


def _with_ids(items: "list[dict[str, Any]]") -> list[dict[str, Any]]:
    return [stored_item(item if "id" in item else {**item, "id": new_id("item")}) for item in items]


def _history_store(state: Any, param: str) -> Any:
    if state.history is None:
        raise BadRequest(f"this node stores nothing (--history-backend none): '{param}' cannot be used",
                         param=param, code="storage_disabled")
    return state.history


def _conversation_id(body: dict[str, Any]) -> str | None:
    raw = body.get("conversation")
    if raw is None:
        return None
    conversation_id = raw.get("id") if isinstance(raw, dict) else raw
    if not isinstance(conversation_id, str) or not conversation_id:
        raise BadRequest("'conversation' must be a conversation id or {\"id\": ...}", param="conversation",
                         code="invalid_type")
    if body.get("previous_response_id") is not None:
        raise BadRequest("'conversation' and 'previous_response_id' cannot be used together",
                         param="conversation", code="invalid_value")
    return conversation_id


async def _history(state: Any, body: dict[str, Any], owner: str, conversation_id: str | None
                   ) -> list[dict[str, Any]]:
    """What the model sees before this input: the previous response's conversation, or the conversation's items."""
    previous_id = body.get("previous_response_id")
    if previous_id is not None:
        store = _history_store(state, "previous_response_id")
        previous = await store.get_response(previous_id, owner) if isinstance(previous_id, str) and \
            len(previous_id) <= ID_CHARS_MAX else None
        if previous is None:
            raise NotFound(f"Previous response with id '{previous_id}' not found.", param="previous_response_id",
                           code="previous_response_not_found")
        return list(previous.history)
    if conversation_id is not None:
        store = _history_store(state, "conversation")
        items = await store.all_items(conversation_id, owner) if len(conversation_id) <= ID_CHARS_MAX else None
        if items is None:
            raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation",
                           code="conversation_not_found")
        return items
    return []


async def create(state: Any, request: Request) -> None:
    body = parse_json_body(await request.body())
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise BadRequest("'store' must be a boolean", param="store", code="invalid_type")
    if body.get("background") not in (None, False):
        raise BadRequest("'background' is not supported by this gateway yet", param="background",
                         code="unsupported_parameter")
    metadata = _metadata(body)
    owner = owner_of(request)
    conversation_id = _conversation_id(body)
    history = await _history(state, body, owner, conversation_id)
    items = _with_ids(input_items(body.get("input")))
    if conversation_id is not None:  # the conversation's items get ids of their own (no clash with older ones)
        items = [{**item, "id": new_id("item")} for item in items]
    chat = parse_chat(to_chat_body(body, history))
    entry, tokenizer, input_ids = await chat_prompt(state, request, chat, "Responses API")
    plan = plan_generation(state, request, entry, input_ids, chat.sampling, chat.stream, "input")
    response_id = new_id("resp")
    shape = ResponseShape(response_id, entry.name, body, chat, metadata, body.get("previous_response_id"), store,
                          conversation_id)
    output = ChatOutput.for_request(_OpenAIShape(True, response_id, entry.name), entry, chat) or \
        ChatOutput(_OpenAIShape(True, response_id, entry.name), None, None)
    plan.kept_special = output.kept_special

    async def keep(response: dict[str, Any]) -> None:
        """Stored before the client hears of it: a follow-up sent at once, to any node, finds it."""
        if state.history is None or not (store or conversation_id):
            return
        with trio.CancelScope(shield=True):  # bounded by the store's own timeouts; a half-kept turn helps nobody
            if conversation_id is not None and not await state.history.add_items(
                    conversation_id, owner, [*items, *shape.output]):
                raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation",
                               code="conversation_not_found")
            if store:
                await state.history.put_response(StoredResponse(response_id, owner, response, tuple(items),
                                                                (*history, *items, *shape.output)))

    async with admitted(state, request, plan):
        if not chat.stream:
            result = await run_unary(state, request, plan, tokenizer)
            if result is None:
                return
            chat_body = output.full(result.text, result)
            shape.items_from(chat_body["choices"][0]["message"])
            response = shape.response("completed", result, output.reasoning_tokens(result))
            await keep(response)
            await request.send_json(200, response)
            return
        final: dict[str, Any] = {}

        def text_event(text: str, first: bool) -> bytes:
            return (shape.opening() if first else b"") + shape.deltas(output.deltas(text, final=False))

        def final_events(result: GenerationResult) -> bytes:
            out = shape.deltas(output.deltas("", final=True)) + shape.close()
            final["response"] = shape.response("completed", result, output.reasoning_tokens(result))
            return out

        async def finish() -> bytes:
            await keep(final["response"])
            return shape.event("response.completed", response=final["response"])

        def error_event(error: ApiError) -> bytes:
            failed = shape.response("failed")
            failed["error"] = {"code": error.code or "server_error", "message": error.message}
            return shape.close() + shape.event("response.failed", response=failed)

        await run_streamed(state, request, plan, tokenizer, text_event, final_events, error_event=error_event,
                           done=b"", finish=finish)


async def _stored(state: Any, request: Request) -> StoredResponse:
    response_id = request.path_params["response_id"]
    store = state.history
    entry = await store.get_response(response_id, owner_of(request)) if store is not None else None
    if entry is None:
        raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="not_found")
    return entry


async def retrieve(state: Any, request: Request) -> None:
    await request.send_json(200, (await _stored(state, request)).response)


async def delete(state: Any, request: Request) -> None:
    response_id = request.path_params["response_id"]
    store = state.history
    if store is None or not await store.delete_response(response_id, owner_of(request)):
        raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="not_found")
    await request.send_json(200, {"id": response_id, "object": "response", "deleted": True})


async def list_input_items(state: Any, request: Request) -> None:
    items = list((await _stored(state, request)).input_items)
    await request.send_json(200, list_page(items, False))


def list_page(items: "list[dict[str, Any]]", has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}

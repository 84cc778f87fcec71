"""OpenAI's Responses API on the serving pipeline: POST /v1/responses, GET and DELETE /v1/responses/{id},
POST /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items.

A request is translated into the chat request it means (``to_chat_request``), with the chat path's
field checks, so the template, tools, constraints, parsers and bounds are the chat path's:

    input (a string, or items)          messages; function_call -> an assistant message's tool_calls;
                                        function_call_output -> a tool message; reasoning -> the next
                                        assistant message's reasoning_content; developer -> system
    instructions                        a system message first (not carried to a follow-up)
    previous_response_id                the stored conversation (input and output) before this input
    tools [{type: function, name, ..}]  function tools; tool_choice, parallel_tool_calls
    reasoning.effort                    the reasoning effort (the chat template's switches)
    text.format                         the engine's constraint (json_schema's fields flat, as the API has them)
    max_output_tokens, temperature, top_p, metadata, store (default true), stream

The answer is rendered by ``ResponseShape`` from the pipeline's typed deltas and answer: output items
``reasoning`` (reasoning_text content), ``message`` (output_text), ``function_call``; status completed, or
incomplete (max_output_tokens). Streamed: response.created, response.in_progress, then per item
output_item.added / content_part.added / *.delta / *.done / output_item.done, and the event of the final
status (response.completed, response.incomplete or response.failed), each with its sequence_number.

Stored responses are scoped to their creator and kept by the history backend (``gateway/history``): with
the default memory backend, on three nodes of the cluster, so a follow-up works on any node.
``conversation`` (an id from /v1/conversations) gives the model the conversation's items before the
input, and adds the input and output items to it (``store: false`` stores nothing: neither the response
nor the conversation's new items). ``background: true`` answers at once with the response queued and
generates on this node (``background.BackgroundRuns``), storing each state (queued, in_progress, then
completed, incomplete or failed); POST /v1/responses/{id}/cancel works from any node: the node that
runs it is told at once. With ``stream: true`` too, the client follows the stream (response.created and
response.queued, both queued, then response.in_progress ...), and a client that dropped resumes it on any
node with GET /v1/responses/{id}?stream=true&starting_after=N (``response_stream``). An unknown
``previous_response_id`` is a 400 (OpenAI's), a completed response has its ``completed_at``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
import trio

from ..engine.errors import EngineCallError
from ..base.errors import GatewayError
from ..serving.generation import GenerationPlan, GenerationResult, MidStreamError
from ..history import CHAIN_LENGTH_MAX, ID_CHARS_MAX, HistoryStore, StoredResponse
from ..base.ids import new_id
from ..mcp.results import error_text
from ..tokenizer.service import TokenizerService
from .background import STORE_POLL_S, BackgroundRun
from .chat_output import Call, ChatAnswer, ChatOutput, Content, Delta, Reasoning, plain_answer
from .errors import ApiError, BadRequest, NotFound, TooManyRequests, UpstreamTimeout, from_engine_error, shown, \
    to_api_error, type_name
from .http import SSE_HEADERS, Request
from .items import content_text, input_items, list_page, list_query, message_content, metadata_of, with_ids
from .logprobs import LogprobShape
from .mcp_tools import HostedTools, is_hosted, responses_servers, without_secrets
from .pipeline import (answer_chat, chat_prompt, logprob_shape, plan_generation, rate_limited_generation,
                       ready_model_entry)
from .protocol import (TOP_LOGPROBS_MAX, ChatRequest, ImageRef, SamplingRequest, apply_reasoning_effort, chat_request,
                       check_message_count, field, parse_json_body, positive_int, temperature_value, top_p_value)
from .ratelimits import counted_write
from .responses_tools import ToolLoop, no_emit
from .response_stream import (FLUSH_INTERVAL_S, StreamLog, follow_log, follow_store, starting_after,
                              stored_events_bytes_max)
from .state import GatewayState
from .structured import response_format_constraint
from .tools import tool_spec

log = logging.getLogger("gateway.api")


# -- the request ---------------------------------------------------------------------------------------------

def chat_messages(items: "list[dict[str, Any]]", images: "list[ImageRef] | None" = None) -> list[dict[str, Any]]:
    """Items as chat messages: consecutive calls join one assistant message, reasoning goes with the next; a user
    message's images into ``images`` (in order), each an image part of its content. An MCP call is a call and its
    result; an approval the user refused, the call and the refusal; a tool list and a pending approval, nothing
    (the tools are the request's, the call not made)."""
    messages: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []  # MCP calls' results: after their calls' assistant message
    approvals: dict[Any, dict[str, Any]] | None = None  # the approvals asked, by id: made when a refusal needs them
    reasoning = ""
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
            reasoning += "".join(c.get("text", "") for c in item.get("content") or () if isinstance(c, dict))
        elif kind == "message":
            role = item["role"]
            content = message_content(item["content"], "input", images) if role == "user" and images is not None \
                else content_text(item["content"], "input")
            message = {"role": "system" if role == "developer" else role, "content": content}
            if role == "assistant" and reasoning:
                message["reasoning_content"], reasoning = reasoning, ""
            messages.append(message)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        # (mcp_list_tools, mcp_approval_request, an approved mcp_approval_response: nothing the model reads)
    return messages + results


def _add_call(messages: "list[dict[str, Any]]", call_id: str, name: str, arguments: str, reasoning: str) -> str:
    """A call into the last assistant message (or a new one, with the pending reasoning); the reasoning left."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
        return reasoning
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    if reasoning:
        message["reasoning_content"], reasoning = reasoning, ""
    messages.append(message)
    return reasoning


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
    if "include" in body and INCLUDE_LOGPROBS in _include(body):  # top_logprobs alone has nothing to show
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


def _include(body: dict[str, Any]) -> frozenset[str]:
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
_RESPONSE_FIELDS: dict[str, Any] = {
    "id": None, "object": "response", "created_at": 0, "model": None, "instructions": None, "metadata": None,
    "parallel_tool_calls": True, "temperature": None, "top_p": None, "tool_choice": "auto", "tools": None,
    "max_output_tokens": None, "previous_response_id": None, "reasoning": None, "text": None, "store": True,
    "truncation": "disabled", "error": None, "incomplete_details": None, "background": False, "completed_at": None,
    "status": None, "output": None, "usage": None,
}
# The request's fields a response shows as they were sent (``tools`` and ``text`` are shown as made safe or
# defaulted, below).
_ECHOED_FIELDS = frozenset({"instructions", "parallel_tool_calls", "temperature", "top_p", "tool_choice",
                            "max_output_tokens", "reasoning"})


class ResponseShape:
    """One response object, its output items as they are decided, and its stream's events: the
    ``ChatRenderer`` of the Responses API."""

    done = b""  # the stream ends with the event of the final status, not [DONE]
    # Set only by some requests (a class default each, not a store per request):
    log: "StreamLog | None" = None  # a background stream's: every event is kept there (response_stream)
    _open: "dict[str, Any] | None" = None  # the item being streamed
    # When it is a message: its output_text.delta events without logprobs, a bytes format of the sequence number
    # and the encoded delta (_open_message); None otherwise.
    _delta_format: "bytes | None" = None
    final: "dict[str, Any] | None" = None  # a stream's final response, once final_events made it
    # A tool loop's (responses_tools.py): the tools the node runs, by name.
    hosted: "HostedTools | None" = None

    def __init__(self, response_id: str, model: str, body: dict[str, Any], metadata: dict[str, str],
                 previous_response_id: str | None, store: bool, conversation_id: str | None = None,
                 background: bool = False, logprobs: LogprobShape | None = None) -> None:
        self.id = response_id
        self.created_at = int(time.time())
        base = self.base = _RESPONSE_FIELDS.copy()
        base["id"] = response_id
        base["created_at"] = self.created_at
        base["model"] = model
        base["metadata"] = metadata
        base["previous_response_id"] = previous_response_id
        base["store"] = store
        base["background"] = background
        for key, value in body.items():  # a request's few fields, rather than a lookup of every echoed one
            if key in _ECHOED_FIELDS:
                base[key] = value
        tools, text = body.get("tools"), body.get("text")
        base["tools"] = (without_secrets(tools) or []) if tools else []
        base["text"] = text or {"format": {"type": "text"}}
        if conversation_id is not None:
            base["conversation"] = {"id": conversation_id}
        self.output: list[dict[str, Any]] = []
        self._sequence = 0
        # The open item's text so far, in pieces: joined once when it closes. A string grown a token at a time is
        # copied whole each time: a 64,000-token stream took 244 ms of CPU here, 59 ms in pieces.
        self._text_parts: list[str] = []
        # include message.output_text.logprobs: the shape of the tokens' entries; the entries not yet sent (they
        # go with the next output text delta), and the open message's so far.
        self.logprobs = logprobs
        self._pending_logprobs: list[dict[str, Any]] = []
        self._text_logprobs: list[dict[str, Any]] = []
        self.pending: list[tuple[dict[str, Any], Call]] = []  # a tool loop's hosted calls of the step just made

    def response(self, status: str, result: GenerationResult | None = None, reasoning_tokens: int = 0
                 ) -> dict[str, Any]:
        body = self.base.copy()
        body["status"] = status
        body["output"] = self.output
        if result is not None:
            body["usage"] = {"input_tokens": result.prompt_tokens,
                             "input_tokens_details": {"cached_tokens": result.cached_tokens},
                             "output_tokens": result.completion_tokens,
                             "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                             "total_tokens": result.prompt_tokens + result.completion_tokens}
            if result.finish_reason == "length":
                body["status"] = status = "incomplete"
                body["incomplete_details"] = {"reason": "max_output_tokens"}
        if status == "completed":  # OpenAI's: set when (and only when) the response completed
            body["completed_at"] = int(time.time())
        return body

    def failed(self, error: ApiError) -> dict[str, Any]:
        failed = self.response("failed")
        failed["error"] = {"code": error.code or "server_error", "message": error.message}
        return failed

    def _token_logprobs(self, whole: bool) -> list[dict[str, Any]]:
        if self.logprobs is None:
            return []
        entries = self.logprobs.whole() if whole else self.logprobs.unsent()
        return (entries or {}).get("content") or []

    # -- whole --

    def whole(self, answer: ChatAnswer) -> dict[str, Any]:
        self.add_answer(answer)
        return self.response("completed", answer.result, answer.reasoning_tokens)

    def add_answer(self, answer: ChatAnswer) -> None:
        """A whole answer's items (a tool loop's step: its hosted calls wait in ``pending``)."""
        if answer.reasoning:
            self.output.append({"type": "reasoning", "id": new_id("rs"), "summary": [],
                                "content": [{"type": "reasoning_text", "text": answer.reasoning}]})
        if answer.content:
            self.output.append(_message_item(new_id("msg"), answer.content, "completed",
                                             self._token_logprobs(True) if self.logprobs is not None else None))
        for call in answer.calls:
            item = self._call_item(call)
            if item["type"] == "function_call":
                item["status"] = "completed"
            self.output.append(item)

    def _call_item(self, call: Call) -> dict[str, Any]:
        """A call's item: a function_call for the client, or for a tool the node runs an mcp_call (to run) or an
        mcp_approval_request (the user's to answer)."""
        server = self.hosted.server_of(call.name) if self.hosted is not None else None
        if server is None:
            return {"type": "function_call", "id": new_id("fc"), "call_id": call.id, "name": call.name,
                    "arguments": call.arguments, "status": "in_progress"}
        if server.needs_approval(self.hosted.tools[call.name][1]):
            item = {"type": "mcp_approval_request", "id": new_id("mcpr"), "server_label": server.label,
                    "name": call.name, "arguments": call.arguments}
        else:
            item = {"type": "mcp_call", "id": new_id("mcp"), "server_label": server.label, "name": call.name,
                    "arguments": call.arguments, "output": None, "error": None, "status": "in_progress"}
        self.pending.append((item, call))
        return item

    # -- a tool loop's own items (responses_tools.py) --

    def listing_started(self, label: str) -> bytes:
        item = {"type": "mcp_list_tools", "id": new_id("mcpl"), "server_label": label, "tools": []}
        self.output.append(item)
        return self.event("response.output_item.added", output_index=len(self.output) - 1, item=item) + \
            self.event("response.mcp_list_tools.in_progress", item_id=item["id"], output_index=len(self.output) - 1)

    def listing_done(self, label: str, tools: "list[dict[str, Any]] | None", error: str | None) -> bytes:
        index, item = next((i, item) for i, item in enumerate(self.output)
                           if item["type"] == "mcp_list_tools" and item["server_label"] == label and not item["tools"]
                           and "error" not in item)
        if tools is not None:
            item["tools"] = tools
        else:
            item["error"] = error
        kind = "completed" if tools is not None else "failed"
        return self.event(f"response.mcp_list_tools.{kind}", item_id=item["id"], output_index=index) + \
            self.event("response.output_item.done", output_index=index, item=item)

    def call_added(self, item: dict[str, Any]) -> bytes:
        """An mcp_call the loop makes itself (an approved one): its item and arguments, as a streamed call's."""
        self.output.append(item)
        index = len(self.output) - 1
        return self.event("response.output_item.added", output_index=index, item={**item, "output": None}) + \
            self.event("response.mcp_call_arguments.delta", item_id=item["id"], output_index=index,
                       delta=item["arguments"]) + \
            self.event("response.mcp_call_arguments.done", item_id=item["id"], output_index=index,
                       arguments=item["arguments"])

    def call_running(self, item: dict[str, Any]) -> bytes:
        return self.event("response.mcp_call.in_progress", item_id=item["id"], output_index=self.output.index(item))

    def call_done(self, item: dict[str, Any], output: str | None, error: "dict[str, Any] | None") -> bytes:
        index = self.output.index(item)
        item.update(output=output, error=error, status="failed" if error is not None else "completed")
        kind = "failed" if error is not None else "completed"
        return self.event(f"response.mcp_call.{kind}", item_id=item["id"], output_index=index) + \
            self.event("response.output_item.done", output_index=index, item=item)

    # -- streamed --

    def event(self, kind: str, **fields: Any) -> bytes:
        """The SSE event ``kind`` with its sequence number and ``fields`` (every event of the API has some): the
        bytes of ``{"type": kind, "sequence_number": n, **fields}`` encoded, the fields encoded alone and spliced
        after a head made once per kind (no merged dict, no second encode of the kind)."""
        sequence = self._sequence
        self._sequence = sequence + 1
        frame = b"%s%d,%s\n\n" % (_EVENT_HEADS.get(kind) or _event_head(kind), sequence, orjson.dumps(fields)[1:])
        if self.log is not None:
            self.log.append(sequence, kind, frame)
        return frame

    def _response_event(self, kind: str, response_json: bytes) -> bytes:
        """An event carrying the whole response, already encoded: response.created and response.in_progress
        share one encoding, the terminal event reuses the one stored."""
        sequence = self._sequence
        self._sequence = sequence + 1
        frame = b'%s%d,"response":%s}\n\n' % (_EVENT_HEADS.get(kind) or _event_head(kind), sequence, response_json)
        if self.log is not None:
            self.log.append(sequence, kind, frame)
        return frame

    def opening(self) -> bytes:
        response = orjson.dumps(self.response("in_progress"))
        return self._response_event("response.created", response) + \
            self._response_event("response.in_progress", response)

    def text_event(self, text: str, first: bool) -> bytes:
        if not first and self._delta_format is not None and self.logprobs is None:
            # Most tokens: the open message's next text, from the template made when it opened (the bytes event()
            # would make). Here rather than in a method of its own: a call per token is ~0.4 % of a stream.
            if not text:
                return b""
            self._text_parts.append(text)
            sequence = self._sequence
            self._sequence = sequence + 1
            frame = self._delta_format % (sequence, orjson.dumps(text))
            if self.log is not None:
                self.log.append(sequence, "response.output_text.delta", frame)
            return frame
        if self.logprobs is not None:
            self._pending_logprobs += self._token_logprobs(False)
        out = self.opening() if first else b""
        if text:
            out += self._ensure("message") + self._text_delta("response.output_text.delta", text)
        return out

    def delta_events(self, deltas: "list[Delta]", first: bool) -> bytes:
        if self.logprobs is not None:
            self._pending_logprobs += self._token_logprobs(False)
        out = self.opening() if first else b""
        for delta in deltas:
            kind = type(delta)
            if kind is Content:
                out += self._ensure("message") + self._text_delta("response.output_text.delta", delta.text)
            elif kind is Reasoning:
                out += self._ensure("reasoning") + self._text_delta("response.reasoning_text.delta", delta.text)
            elif kind is Call:
                item = self._call_item(delta)
                out += self._close() + self._open_item(item)
                if delta.arguments and item["type"] != "mcp_approval_request":
                    out += self.event(f"response.{_ARGUMENTS[item['type']]}.delta", item_id=item["id"],
                                      output_index=len(self.output) - 1, delta=delta.arguments)
        return out

    def final_events(self, deltas: "list[Delta]", answer: ChatAnswer) -> bytes:
        out = self.delta_events(deltas, False) if deltas or self.logprobs is not None else b""
        self.final = self.response("completed", answer.result, answer.reasoning_tokens)
        return out + self._close()

    def terminal_event(self, final_json: bytes | None = None) -> bytes:
        """OpenAI's stream ends with the event of the response's status: response.completed, or
        response.incomplete when max_output_tokens cut it (response.failed comes from error_event).
        ``final_json``: ``final`` as the store encoded it, when it was stored."""
        return self._response_event(f"response.{self.final['status']}",
                                    final_json if final_json is not None else orjson.dumps(self.final))

    def error_event(self, error: ApiError) -> bytes:
        return self._close() + self._response_event("response.failed", orjson.dumps(self.failed(error)))

    def close(self) -> bytes:
        return self._close()

    def _ensure(self, kind: str) -> bytes:
        if self._open is not None and self._open["type"] == kind:
            return b""
        out = self._close()
        self._text_parts = []
        self._text_logprobs = []
        if kind == "message":
            return out + self._open_message()
        item = {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []}
        out += self._open_item(item)
        return out + self.event("response.content_part.added", item_id=item["id"], output_index=len(self.output) - 1,
                                content_index=0, part={"type": "reasoning_text", "text": ""})

    def _open_message(self) -> bytes:
        """A message item opens: output_item.added and content_part.added, the events every answer with text
        has, from templates (the bytes event() makes: tests/unit/test_response_shape.py)."""
        item_id = new_id("msg")
        self._open = item = _message_item(item_id, None, "in_progress")
        self.output.append(item)
        index = len(self.output) - 1
        sequence = self._sequence
        self._sequence = sequence + 2
        quoted = item_id.encode()  # a prefix and hex: nothing JSON or a bytes format would escape
        added = _MESSAGE_ADDED % (sequence, index, quoted)
        part = _TEXT_PART_ADDED % (sequence + 1, quoted, index)
        self._delta_format = _TEXT_DELTA_HEAD + b"%d" + \
            b',"item_id":"%s","output_index":%d,"content_index":0,"delta":' % (quoted, index) + b"%s" + _TEXT_DELTA_END
        if self.log is not None:
            self.log.append(sequence, "response.output_item.added", added)
            self.log.append(sequence + 1, "response.content_part.added", part)
        return added + part

    def _close_message(self, item: dict[str, Any], index: int) -> bytes:
        """The open message's output_text.done, content_part.done and output_item.done, from templates: its text
        and logprobs encoded once for the three."""
        text = "".join(self._text_parts)
        logprobs = self._text_logprobs
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
        item["status"] = "completed"
        item["content"] = [part]
        text_json, logprobs_json, quoted = orjson.dumps(text), orjson.dumps(logprobs), item["id"].encode()
        part_json = _TEXT_PART % (text_json, logprobs_json)
        sequence = self._sequence
        self._sequence = sequence + 3
        text_done = _TEXT_DONE % (sequence, quoted, index, text_json, logprobs_json)
        part_done = _TEXT_PART_DONE % (sequence + 1, quoted, index, part_json)
        item_done = _MESSAGE_DONE % (sequence + 2, index, quoted, part_json)
        if self.log is not None:
            self.log.append(sequence, "response.output_text.done", text_done)
            self.log.append(sequence + 1, "response.content_part.done", part_done)
            self.log.append(sequence + 2, "response.output_item.done", item_done)
        return text_done + part_done + item_done

    def _open_item(self, item: dict[str, Any]) -> bytes:
        self.output.append(item)
        self._open = item
        return self.event("response.output_item.added", output_index=len(self.output) - 1, item=item)

    def _text_delta(self, kind: str, text: str) -> bytes:
        if kind == "response.output_text.delta" and self.logprobs is None and text and self._delta_format is not None:
            return self.text_event(text, False)  # the template (with logprobs asked for, event() below)
        self._text_parts.append(text)
        if kind != "response.output_text.delta":
            return self.event(kind, item_id=self._open["id"], output_index=len(self.output) - 1, content_index=0,
                              delta=text)
        logprobs, self._pending_logprobs = self._pending_logprobs, []
        self._text_logprobs += logprobs
        return self.event(kind, item_id=self._open["id"], output_index=len(self.output) - 1, content_index=0,
                          delta=text, logprobs=logprobs)

    def _close(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        self._open = self._delta_format = None
        index = len(self.output) - 1
        out = b""
        if item["type"] == "function_call":
            item["status"] = "completed"
            out += self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              name=item["name"], arguments=item["arguments"])
        elif item["type"] == "mcp_call":  # done once it ran (call_done)
            return self.event("response.mcp_call_arguments.done", item_id=item["id"], output_index=index,
                              arguments=item["arguments"])
        elif item["type"] == "mcp_approval_request":
            pass
        elif item["type"] == "message":
            return self._close_message(item, index)
        else:
            text = "".join(self._text_parts)
            part = {"type": "reasoning_text", "text": text}
            out += self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=text)
            item["content"] = [part]
            out += self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                              part=part)
        return out + self.event("response.output_item.done", output_index=index, item=item)


_ARGUMENTS = {"function_call": "function_call_arguments", "mcp_call": "mcp_call_arguments"}
# An event's bytes up to its sequence number, by kind (ResponseShape.event): made once per kind, and every kind is
# the code's own (none comes from a request), so this stays as small as the API's list of events.
_EVENT_HEADS: dict[str, bytes] = {}


def _event_head(kind: str) -> bytes:
    encoded = orjson.dumps(kind)
    head = _EVENT_HEADS[kind] = b"event: " + kind.encode() + b'\ndata: {"type":' + encoded + b',"sequence_number":'
    return head


# An output_text.delta event without logprobs around its sequence number, item and delta (ResponseShape._ensure's
# template).
_TEXT_DELTA_HEAD = _event_head("response.output_text.delta")
_TEXT_DELTA_END = b',"logprobs":[]}\n\n'
# A message's other events (ResponseShape._open_message, _close_message), the field order event() gives them.
_MESSAGE_ADDED = _event_head("response.output_item.added") + \
    b'%d,"output_index":%d,"item":{"type":"message","id":"%s","status":"in_progress","role":"assistant",' \
    b'"content":[]}}\n\n'
_TEXT_PART_ADDED = _event_head("response.content_part.added") + \
    b'%d,"item_id":"%s","output_index":%d,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}' \
    b'\n\n'
_TEXT_PART = b'{"type":"output_text","text":%s,"annotations":[],"logprobs":%s}'
_TEXT_DONE = _event_head("response.output_text.done") + \
    b'%d,"item_id":"%s","output_index":%d,"content_index":0,"text":%s,"logprobs":%s}\n\n'
_TEXT_PART_DONE = _event_head("response.content_part.done") + \
    b'%d,"item_id":"%s","output_index":%d,"content_index":0,"part":%s}\n\n'
_MESSAGE_DONE = _event_head("response.output_item.done") + \
    b'%d,"output_index":%d,"item":{"type":"message","id":"%s","status":"completed","role":"assistant",' \
    b'"content":[%s]}}\n\n'


def _message_item(item_id: str, text: str | None, status: str,
                  logprobs: "list[dict[str, Any]] | None" = None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [],
                                        "logprobs": logprobs or []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


# -- what is stored, and what came before --------------------------------------------------------------------

def _history_store(state: GatewayState, param: str) -> HistoryStore:
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
        raise BadRequest(f"'conversation' must be a conversation id or {{\"id\": ...}}, got {shown(raw)}",
                         param="conversation", code="invalid_type")
    if body.get("previous_response_id") is not None:
        raise BadRequest("'conversation' and 'previous_response_id' cannot be used together",
                         param="conversation", code="invalid_value")
    return conversation_id


@dataclasses.dataclass(slots=True)  # not frozen: made for every request (see gateway/serving/generation.py)
class Context:
    """What the model sees before this request's input, and what the new response stores to give it on."""

    items: "Sequence[dict[str, Any]]"
    chain: tuple[str, ...] = ()  # the new response's ancestors (previous_response_id's chain and itself)


_NO_CONTEXT = Context(())  # a request that continues nothing (most): immutable, so one serves them all


# Ancestors of a chain read at once: a long chain is read in a few round trips, not one per turn.
CHAIN_READS_AT_ONCE = 16


async def _context(state: GatewayState, body: dict[str, Any], owner: str, conversation_id: str | None) -> Context:
    """The previous response's chain as its model saw it, plus its last turn; or the conversation's items."""
    previous_id = body.get("previous_response_id")
    if previous_id is not None:
        store = _history_store(state, "previous_response_id")
        previous = await store.get_response(previous_id, owner) if isinstance(previous_id, str) and \
            len(previous_id) <= ID_CHARS_MAX else None
        if previous is None:  # OpenAI's answer: a bad parameter (400), not a missing resource (404)
            raise BadRequest(f"Previous response with id {shown(previous_id)} not found.",
                             param="previous_response_id", code="previous_response_not_found")
        chain = (*(previous.chain or ()), previous.id)
        if len(chain) > CHAIN_LENGTH_MAX:
            raise BadRequest(f"the chain of previous responses is {CHAIN_LENGTH_MAX} long already: start a new "
                             "one, or use a conversation", param="previous_response_id", code="chain_too_long")
        return Context(await _chain_items(store, previous, owner), chain)
    if conversation_id is not None:
        store = _history_store(state, "conversation")
        items = await store.all_items(conversation_id, owner) if len(conversation_id) <= ID_CHARS_MAX else None
        if items is None:
            raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation",
                           code="conversation_not_found")
        return Context(items)
    return _NO_CONTEXT


async def _chain_items(store: HistoryStore, last: StoredResponse, owner: str) -> list[dict[str, Any]]:
    """Every turn of ``last``'s chain, oldest first, each response read once. An ancestor that is gone (deleted,
    expired) cuts the chain there: the context starts after it, as coherent turns. The chain's first response,
    when made in a conversation, brings the conversation's items that came before it."""
    ancestors: list[StoredResponse | None] = [None] * len(last.chain or ())
    limiter = trio.CapacityLimiter(CHAIN_READS_AT_ONCE)

    async def read(index: int, response_id: str) -> None:
        async with limiter:
            ancestors[index] = await store.get_response(response_id, owner)

    async with trio.open_nursery() as nursery:
        for index, response_id in enumerate(last.chain or ()):
            nursery.start_soon(read, index, response_id)
    present: list[StoredResponse] = [last]
    for record in reversed(ancestors):
        if record is None:
            break
        present.append(record)
    present.reverse()
    root = present[0]
    items = await _conversation_before(store, root, owner) if len(present) > len(ancestors) else []
    for record in present:
        items += record.turn()
    return items


async def _conversation_before(store: HistoryStore, root: StoredResponse, owner: str) -> list[dict[str, Any]]:
    """The items a response made in a conversation saw before its input: the conversation's, up to its first
    input item (they were added together). Read now: items deleted from the conversation since are gone."""
    conversation = root.response.get("conversation")
    if root.chain is None or not isinstance(conversation, dict) or not root.input_items:
        return []
    items = await store.all_items(conversation.get("id", ""), owner)
    first = root.input_items[0].get("id")
    ids = [item.get("id") for item in items or ()]
    return items[:ids.index(first)] if first in ids else []


async def create(state: GatewayState, request: Request) -> None:
    body = parse_json_body(await request.body())
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise BadRequest(f"'store' must be a boolean, got {shown(store)}", param="store", code="invalid_type")
    background = body.get("background", False)
    if not isinstance(background, bool):
        raise BadRequest(f"'background' must be a boolean, got {shown(background)}", param="background",
                         code="invalid_type")
    if background:
        _history_store(state, "background")
        if not store:
            raise BadRequest("a background response is stored: 'store' cannot be false", param="store",
                             code="invalid_value")
    # Most requests set neither, and continue nothing: no store to read, no coroutine to make.
    metadata = metadata_of(body) if "metadata" in body else {}
    conversation_id = _conversation_id(body) if "conversation" in body else None
    context = await _context(state, body, request.owner, conversation_id) if conversation_id is not None or \
        body.get("previous_response_id") is not None else _NO_CONTEXT
    # The conversation's items get ids of their own (no clash with older ones).
    inputs = input_items(body.get("input"))
    items = with_ids(inputs, fresh=conversation_id is not None)
    if has_hosted_tools(body, inputs):  # tools the node runs: the tool loop (responses_tools.py)
        await _create_with_tools(state, request, body, context, items, metadata, conversation_id, store, background)
        return
    chat = to_chat_request(body, context.items, inputs=inputs)
    prompt = await chat_prompt(state, request, chat, "Responses API")
    entry, tokenizer = prompt.entry, prompt.tokenizer
    plan = plan_generation(state, request, entry, prompt.ids, chat.sampling, chat.stream, "input", prompt.media,
                           prompt.routing_ids)
    plan.answer_bytes_max = state.config.answer_bytes_max  # streamed too: the whole response is kept to be stored
    output = ChatOutput.for_request(entry, chat)
    if output is not None:
        plan.kept_special = output.kept_special
    shape = ResponseShape(new_id("resp"), entry.name, body, metadata, body.get("previous_response_id"), store,
                          conversation_id, background, logprob_shape(plan, tokenizer, chat=True))
    # A background response must be over by then (queue wait, then the generation's own timeout); a
    # minute more for the last write. Past it, readers know the node running it stopped.
    admission = state.config.admission
    keep = _keeper(state, request, shape, items, context, conversation_id, store, time.time() + admission.queue_timeout_s
                   + (admission.request_timeout_s or 86_400.0) + 60.0 if background else None)
    if background:
        limits = contextlib.AsyncExitStack()
        await limits.enter_async_context(rate_limited_generation(state, request, plan))
        await _start_in_background(state, request, shape, keep, chat.stream, limits, lambda run: _background_answer(
            state, request, plan, tokenizer, shape, output, keep, run))
        return

    async def finish() -> bytes:
        return shape.terminal_event(await keep(shape.final))

    await answer_chat(state, request, plan, tokenizer, output, shape, keep=keep, finish=finish)


def _keeper(state: GatewayState, request: Request, shape: ResponseShape, items: "list[dict[str, Any]]",
            context: Context, conversation_id: str | None, store: bool, unfinished_until_s: float | None
            ) -> Callable[..., Awaitable[None]]:
    owner = request.owner

    async def keep(response: dict[str, Any], final: bool = True) -> bytes | None:
        """Stored before the client hears of it: a follow-up sent at once, to any node, finds it. A final
        answer's items join its conversation; a background response's earlier states are stored alone.
        ``store: false`` keeps nothing, not even in the conversation (OpenAI's rule): the model saw the
        conversation, the conversation does not see this turn. Returns the response as the JSON stored, for
        a caller sending it (encoded once), or None when nothing was stored."""
        if state.history is None or not store:
            return None
        # This turn and the chain's ids: what came before is stored once, in the ancestors.
        response_json = orjson.dumps(response)
        record = StoredResponse(shape.id, owner, response, tuple(items), (), unfinished_until_s, context.chain,
                                shape.log.stored_events() if shape.log is not None else None, response_json)
        joins_conversation = final and conversation_id is not None
        if not joins_conversation and state.history.put_response_at_once(record):
            return response_json
        with trio.CancelScope(shield=True):  # bounded by the store's own timeouts; a half-kept turn helps nobody
            if joins_conversation and not await state.history.add_items(conversation_id, owner,
                                                                         [*items, *shape.output]):
                raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation",
                               code="conversation_not_found")
            await state.history.put_response(record)
        return response_json

    return keep


async def _create_with_tools(state: GatewayState, request: Request, body: dict[str, Any], context: Context,
                             items: "list[dict[str, Any]]", metadata: dict[str, str], conversation_id: str | None,
                             store: bool, background: bool) -> None:
    """A response whose tools the node runs (MCP): the request checked before anything is answered (its model, its
    servers: a 4xx), then the loop, streamed, whole or in the background."""
    stream = field(body, "stream", bool, False)
    if INCLUDE_LOGPROBS in _include(body):
        raise BadRequest("logprobs are not given with MCP tools", param="include", code="unsupported_parameter")
    entry = await ready_model_entry(state, field(body, "model", str), request.principal)
    servers = await responses_servers(state, request, body.get("tools") or [])
    shape = ResponseShape(new_id("resp"), entry.name, body, metadata, body.get("previous_response_id"), store,
                          conversation_id, background)
    loop = ToolLoop(state, request, body, context.items, shape, to_chat_request, stream, servers)
    mcp = state.mcp.config
    keep = _keeper(state, request, shape, items, context, conversation_id, store,
                   time.time() + mcp.response_time_max_s + 60.0 if background else None)
    if background:
        async def answer(run: BackgroundRun) -> dict[str, Any]:
            return await _background_loop(state, loop, shape, keep, run)
        await _start_in_background(state, request, shape, keep, stream, contextlib.AsyncExitStack(), answer)
        return
    async with request.cancel_on_disconnect():
        if not stream:
            final = await loop.run(no_emit)
            await keep(final)
            await request.send_json(200, final)
            return
        await request.start_stream(200, SSE_HEADERS)
        await request.send_chunk(shape.opening())
        try:
            final = await loop.run(request.send_chunk)  # shape.final
            end = shape.terminal_event(await keep(final))
        except Exception as e:
            error = to_api_error(e)
            if error is None:
                raise
            end = shape.error_event(error)
        await request.end_stream(end)


async def _background_loop(state: GatewayState, loop: ToolLoop, shape: ResponseShape, keep: Any,
                           run: BackgroundRun) -> dict[str, Any]:
    """A background response's tool loop (each step admitted by itself): the final response, failed on an error."""
    streamed = shape.log is not None
    try:
        in_progress = shape.response("in_progress")
        if streamed:
            shape.event("response.in_progress", response=in_progress)
        if not run.cancelled:
            await keep(in_progress, final=False)
        final = await loop.run(no_emit)
        if streamed:
            shape.terminal_event()
        return final
    except Exception as e:
        error = to_api_error(e)
        if error is None:
            log.exception("background response %s failed", shape.id)
            error = ApiError("internal error", code="internal_error")
        if streamed:
            shape.error_event(error)
        return shape.failed(error)


# -- background responses ------------------------------------------------------------------------------------

async def _start_in_background(state: GatewayState, request: Request, shape: ResponseShape, keep: Any, stream: bool,
                               limits: contextlib.AsyncExitStack,
                               answer: Callable[[BackgroundRun], Awaitable[dict[str, Any]]]) -> None:
    """Store the response queued and answer it (or follow its stream); the run goes on in ``state.background``.
    Counted like any request before anything is stored: the caller's rate limits (``limits``, taken by the
    caller, settled when the generation ends; a tool loop takes them step by step), its share of the node's slots
    when it runs, and at most that many in progress. ``answer(run)`` is the final response."""
    owner, runs = request.owner, state.background
    in_progress = runs.in_progress(owner)
    if in_progress >= state.admission.config.tenant_running_max() > 0:
        await limits.aclose()
        raise TooManyRequests(f"{in_progress} background responses of yours are in progress on this node, as "
                              "many as may be: wait for one to finish", code="too_many_background_responses",
                              retry_after_s=1)
    if stream:  # OpenAI's opening of a background stream: created (queued), then queued
        shape.log = StreamLog(stored_events_bytes_max(state.config.history.record_bytes_max))
    run = runs.reserve(shape.id, owner, shape.log)  # a cancel finds it from now on, on any node
    try:
        queued = shape.response("queued")
        if stream:
            shape.event("response.created", response=queued)
            shape.event("response.queued", response=queued)
        await keep(queued, final=False)  # stored first: GET, cancel and a resume work at once, on any node
    except BaseException:
        runs.release(run)
        await limits.aclose()
        raise
    runs.start(run, lambda run: _run_in_background(state, run, shape, keep, limits, answer))
    if shape.log is None:
        await request.send_json(200, queued)
    else:  # the client follows the stream; if it goes, the response goes on and a resume picks it up
        await follow_log(request, shape.log, -1)


async def _run_in_background(state: GatewayState, run: BackgroundRun, shape: ResponseShape, keep: Any,
                             limits: contextlib.AsyncExitStack,
                             answer: Callable[[BackgroundRun], Awaitable[dict[str, Any]]]) -> None:
    """A background response: admitted, generated and stored as it goes (queued -> in_progress -> completed
    or failed), stopped by a cancel (on any node: ``BackgroundRuns.cancel``). ``limits`` holds its rate
    limits' reservation, settled with the tokens used when it ends."""
    history = state.history
    async with limits:
        try:
            with run.scope:
                async with trio.open_nursery() as nursery:
                    if shape.log is not None:
                        nursery.start_soon(_store_events, shape, keep)
                    if state.background.poll_store:
                        nursery.start_soon(_poll_store_for_cancel, state, run)
                    final = await answer(run)
                    nursery.cancel_scope.cancel()
                stored = await history.get_response(shape.id, run.owner)
                if stored is not None and stored.response.get("status") != "cancelled":
                    await keep(final)
            if run.cancelled:  # whatever this run stored before the cancel reached it, the response is cancelled
                stored = await history.get_response(shape.id, run.owner)
                if stored is not None and stored.response.get("status") != "cancelled":
                    await keep({**stored.response, "status": "cancelled"}, final=False)
        except (GatewayError, ApiError) as e:  # the store failed, or the conversation went: nobody to tell
            log.warning("background response %s could not be stored: %s", shape.id, e)


async def _background_answer(state: GatewayState, request: Request, plan: GenerationPlan,
                             tokenizer: TokenizerService, shape: ResponseShape, output: ChatOutput | None,
                             keep: Any, run: BackgroundRun) -> dict[str, Any]:
    """The final response (completed, incomplete or failed). Streamed (``shape.log``), every event went
    into the log, the terminal one last."""
    streamed = shape.log is not None
    try:
        async with state.admission.slot(request.tenant_key):  # its rate limits were taken when it was created
            in_progress = shape.response("in_progress")
            if streamed:
                shape.event("response.in_progress", response=in_progress)
            if not run.cancelled:
                await keep(in_progress, final=False)
            sink = _EventSink(shape, output) if streamed else None
            with trio.move_on_after(plan.timeout_s or math.inf) as deadline:
                result = await state.generator.run(plan, tokenizer, sink)
        if deadline.cancelled_caught:
            raise UpstreamTimeout("the response took longer than the gateway's request timeout",
                                  code="request_timeout")
        state.count_tokens(plan.model, result)
        if streamed:
            shape.final_events(output.finish() if output is not None else [],
                               output.streamed_answer(result) if output is not None else plain_answer(result))
            shape.terminal_event()
            return shape.final
        return shape.whole(output.whole(result) if output is not None else plain_answer(result))
    except Exception as e:  # the answer is a failed response, as a stream's would be
        engine_error = e.error if isinstance(e, MidStreamError) else e if isinstance(e, EngineCallError) else None
        error = from_engine_error(engine_error, plan.model) if engine_error is not None else to_api_error(e)
        if error is None:
            log.exception("background response %s failed", shape.id)
            error = ApiError("internal error", code="internal_error")
        if streamed:
            shape.error_event(error)
        return shape.failed(error)


class _EventSink:
    """``generation.TextSink`` of a background stream: the decided text becomes the response's events, in
    its log (``shape.log``), awaited in the generation's task; no HTTP write is involved."""

    __slots__ = ("_shape", "_output")

    def __init__(self, shape: ResponseShape, output: ChatOutput | None) -> None:
        self._shape, self._output = shape, output

    async def __call__(self, text: str) -> None:
        if self._output is None:
            self._shape.text_event(text, False)
        else:
            self._shape.delta_events(self._output.feed(text), False)

    def ready_now(self) -> bool:
        return False  # always through __call__

    def send_now(self, text: str) -> bool:
        raise AssertionError("ready_now is never true")

    async def flush(self) -> None:
        pass


async def _store_events(shape: ResponseShape, keep: Any) -> None:
    """While a background response streams: its new events reach the store FLUSH_INTERVAL_S apart at most (for
    a resume on another node), woken by the events themselves: nothing runs while none comes."""
    log_ = shape.log
    while True:
        if not log_.dirty:
            await log_.changed().wait()
        await trio.sleep(FLUSH_INTERVAL_S)  # what comes meanwhile goes in the same write
        if log_.dirty:
            try:
                await keep(shape.response("in_progress"), final=False)
            except GatewayError:
                continue  # the store is away for now: the next events try again


async def _poll_store_for_cancel(state: GatewayState, run: BackgroundRun) -> None:
    """Without a mesh, a cancel made on another node of a shared store reaches this run only through the store."""
    while True:
        await trio.sleep(STORE_POLL_S)
        try:
            stored = await state.history.get_response(run.id, run.owner)
        except GatewayError:
            continue  # the store is away for now; look again
        if stored is None or stored.response.get("status") == "cancelled":  # cancelled, or deleted
            state.background.cancelled_in_store(run)
            return


async def cancel(state: GatewayState, request: Request) -> None:
    entry = await _stored(state, request)
    response = entry.response
    if not response.get("background"):
        raise BadRequest("only a background response can be cancelled", param="response_id", code="invalid_value")
    if response["status"] in ("queued", "in_progress"):
        response = {**response, "status": "cancelled"}
        async with counted_write(state, request):
            await state.history.put_response(dataclasses.replace(entry, response=response))
        await state.background.cancel(entry.id, request.owner)  # stopped where it runs, on any node
    elif response["status"] != "cancelled":
        raise BadRequest(f"the response is {response['status']}: it cannot be cancelled", param="response_id",
                         code="invalid_value")
    await request.send_json(200, response)


async def _stored(state: GatewayState, request: Request) -> StoredResponse:
    response_id = request.path_params["response_id"]
    store = state.history
    entry = await store.get_response(response_id, request.owner) if store is not None else None
    if entry is None:
        raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="not_found")
    return _abandoned(entry)


def _abandoned(entry: StoredResponse) -> StoredResponse:
    """The record as readers see it: a background response unfinished past its bound (the node generating
    it stopped) is shown failed; anything else as it is."""
    response = entry.response
    if entry.unfinished_until_s is None or response.get("status") not in ("queued", "in_progress") \
            or time.time() <= entry.unfinished_until_s:
        return entry
    failed = {**response, "status": "failed", "error": {
        "code": "server_error", "message": "the node generating this background response stopped before it finished"}}
    return dataclasses.replace(entry, response=failed)


async def retrieve(state: GatewayState, request: Request) -> None:
    query = request.query()
    stream = query.get("stream", "false").lower()
    if stream not in ("true", "false"):
        raise BadRequest(f"Invalid value for 'stream': {shown(query['stream'])}; expected true or false",
                         param="stream", code="invalid_value")
    entry = await _stored(state, request)
    if stream == "false":
        await request.send_json(200, entry.response)
        return
    after = starting_after(query)
    if entry.events is None:
        raise BadRequest("only a response created with background and stream set can be streamed again",
                         param="stream", code="invalid_value")
    live = state.background.live_log(entry.id)
    if live is not None:  # generating here: its events as they come
        await follow_log(request, live, after)
        return
    owner, store = request.owner, state.history

    async def read() -> StoredResponse | None:
        record = await store.get_response(entry.id, owner)
        return _abandoned(record) if record is not None else record

    await follow_store(request, read, entry, after)


async def delete(state: GatewayState, request: Request) -> None:
    response_id = request.path_params["response_id"]
    store = state.history
    async with counted_write(state, request):
        deleted = store is not None and await store.delete_response(response_id, request.owner)
    if not deleted:
        raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="not_found")
    await state.background.cancel(response_id, request.owner)  # a deleted response generates no more
    await request.send_json(200, {"id": response_id, "object": "response", "deleted": True})


async def list_input_items(state: GatewayState, request: Request) -> None:
    after, limit, descending = list_query(request)
    items = list((await _stored(state, request)).input_items)
    if descending:
        items.reverse()
    ids = [item.get("id") for item in items]
    start = ids.index(after) + 1 if after in ids else 0
    await request.send_json(200, list_page(items[start:start + limit], start + limit < len(items)))

"""How a response looks: the response object, its output items as they are decided, and its stream's events
(``ResponseShape``, the Responses API's ``ChatRenderer``). Every event goes through ``events.EventStream.emit``:
numbered, logged, in the stream's order.

Whole: ``whole(answer)`` (or ``add_answer`` per tool-loop step) gives the items ``reasoning`` (reasoning_text
content), ``message`` (output_text), ``function_call``, ``mcp_call`` / ``mcp_approval_request`` (tools the node
runs); status completed, or incomplete (max_output_tokens). Streamed: response.created, response.in_progress, then
per item output_item.added / content_part.added / *.delta / *.done / output_item.done, and the event of the final
status (response.completed, response.incomplete or response.failed). A message's events, made for nearly every
token, come from templates (``_TEXT_DELTA_END``...): one encode of the delta, spliced.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from ...base.ids import new_id
from ...serving.generation import GenerationResult
from ...serving.chat import (REDACTED_REASONING_PREFIX, Call, ChatAnswer, Content, Delta, Reasoning, ReasoningSignature,
                             RedactedReasoning)
from ..errors import ApiError
from ..logprobs import LogprobShape
from ..mcp_tools import HostedTools, without_secrets
from .events import (CREATED, FAILED, IN_PROGRESS, ITEM_ADDED, ITEM_DONE, PART_ADDED, PART_DONE, REASONING_DELTA,
                     TEXT_DELTA, TEXT_DONE, EventStream, silent)

if TYPE_CHECKING:
    from .stream_log import StreamLog

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
    api = "responses"
    # Set only by some requests (a class default each, not a store per request):
    _open: "dict[str, Any] | None" = None  # the item being streamed
    # When it is a message: its output_text.delta events' tail without logprobs, a bytes format of the encoded
    # delta (_open_message); None otherwise.
    _delta_tail: "bytes | None" = None
    final: "dict[str, Any] | None" = None  # a stream's final response, once final_events made it
    in_progress_told = False  # a background response's in_progress was stored and logged (background.py)
    # A tool loop's (tools.py): the tools the node runs, by name.
    hosted: "HostedTools | None" = None

    def __init__(self, response_id: str, model: str, body: dict[str, Any], metadata: dict[str, str],
                 previous_response_id: str | None, store: bool, conversation_id: str | None = None,
                 background: bool = False, logprobs: LogprobShape | None = None, streamed: bool = True,
                 log: "StreamLog | None" = None) -> None:
        """``streamed``: the response has a stream (else its events are made by nobody: ``events.silent``);
        ``log``: a background stream's, where every event is kept for a resume."""
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
        self.events = EventStream(log) if streamed else silent()
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
        if answer.thinking_blocks is not None:  # a provider's, an item a block (each with its own signature)
            for block in answer.thinking_blocks:
                self.output.append(_reasoning_item(block))
        elif answer.reasoning:
            item = {"type": "reasoning", "id": new_id("rs"), "summary": [],
                    "content": [{"type": "reasoning_text", "text": answer.reasoning}]}
            if answer.reasoning_signature is not None:  # a provider's: what goes back with the reasoning
                item["encrypted_content"] = answer.reasoning_signature
            self.output.append(item)
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

    # -- a tool loop's own items (tools.py) --

    def listing_started(self, label: str) -> bytes:
        item = {"type": "mcp_list_tools", "id": new_id("mcpl"), "server_label": label, "tools": []}
        self.output.append(item)
        return self.event(ITEM_ADDED, output_index=len(self.output) - 1, item=item) + \
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
            self.event(ITEM_DONE, output_index=index, item=item)

    def call_added(self, item: dict[str, Any]) -> bytes:
        """An mcp_call the loop makes itself (an approved one): its item and arguments, as a streamed call's."""
        self.output.append(item)
        index = len(self.output) - 1
        return self.event(ITEM_ADDED, output_index=index, item={**item, "output": None}) + \
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
            self.event(ITEM_DONE, output_index=index, item=item)

    # -- streamed --

    @property
    def log(self) -> "StreamLog | None":
        """A background stream's log (``stream_log``), where every event is kept; None otherwise."""
        return self.events.log

    def event(self, kind: str, **fields: Any) -> bytes:
        """The event ``kind`` with ``fields`` (every event of the API has some): the bytes of ``{"type": kind,
        "sequence_number": n, **fields}``, the fields encoded alone and spliced after the kind's head (no merged
        dict, no second encode of the kind)."""
        return self.events.emit(kind, b",%s\n\n" % orjson.dumps(fields)[1:])

    def response_event(self, kind: str, response: "dict[str, Any] | bytes") -> bytes:
        """An event carrying the whole response (``bytes``: already encoded: response.created and
        response.in_progress share one encoding, the terminal event reuses the one stored)."""
        encoded = response if isinstance(response, bytes) else orjson.dumps(response)
        return self.events.emit(kind, b',"response":%s}\n\n' % encoded)

    def opening(self) -> bytes:
        response = orjson.dumps(self.response("in_progress"))
        return self.response_event(CREATED, response) + self.response_event(IN_PROGRESS, response)

    def text_event(self, text: str, first: bool) -> bytes:
        if not first and self._delta_tail is not None and self.logprobs is None:
            # Most tokens: the open message's next text, its tail from the template made when it opened (the bytes
            # event() would make), numbered and logged by emit() as every event is.
            if not text:
                return b""
            self._text_parts.append(text)
            return self.events.emit(TEXT_DELTA, self._delta_tail % orjson.dumps(text))
        if self.logprobs is not None:
            self._pending_logprobs += self._token_logprobs(False)
        out = self.opening() if first else b""
        if text:
            out += self._ensure("message") + self._text_delta(TEXT_DELTA, text)
        return out

    def delta_events(self, deltas: "list[Delta]", first: bool) -> bytes:
        if self.logprobs is not None:
            self._pending_logprobs += self._token_logprobs(False)
        out = self.opening() if first else b""
        for delta in deltas:
            kind = type(delta)
            if kind is Content:
                out += self._ensure("message") + self._text_delta(TEXT_DELTA, delta.text)
            elif kind is Reasoning:
                out += self._ensure("reasoning") + self._text_delta(REASONING_DELTA, delta.text)
            elif kind is ReasoningSignature:  # a provider's, at the end of its reasoning: on the item once done
                out += self._ensure("reasoning")
                self._open["encrypted_content"] = delta.signature
                out += self._close()
            elif kind is RedactedReasoning:  # an item of its own, whole
                item = _reasoning_item({"type": "redacted_thinking", "data": delta.data})
                out += self._close() + self._open_item(item)
                self._open = None
                out += self.event(ITEM_DONE, output_index=len(self.output) - 1, item=item)
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
        return self.response_event(f"response.{self.final['status']}",
                                   final_json if final_json is not None else self.final)

    def error_event(self, error: ApiError) -> bytes:
        return self._close() + self.response_event(FAILED, self.failed(error))

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
        return out + self.event(PART_ADDED, item_id=item["id"], output_index=len(self.output) - 1,
                                content_index=0, part={"type": "reasoning_text", "text": ""})

    def _open_message(self) -> bytes:
        """A message item opens: output_item.added and content_part.added, the events every answer with text
        has, from templates (the bytes event() makes: tests/unit/test_response_shape.py)."""
        item_id = new_id("msg")
        self._open = item = _message_item(item_id, None, "in_progress")
        self.output.append(item)
        index = len(self.output) - 1
        quoted = item_id.encode()  # a prefix and hex: nothing JSON or a bytes format would escape
        self._delta_tail = b',"item_id":"%s","output_index":%d,"content_index":0,"delta":' % (quoted, index) + \
            b"%s" + _TEXT_DELTA_END
        return self.events.emit(ITEM_ADDED, _MESSAGE_ADDED % (index, quoted)) + \
            self.events.emit(PART_ADDED, _TEXT_PART_ADDED % (quoted, index))

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
        events = self.events
        return events.emit(TEXT_DONE, _TEXT_DONE % (quoted, index, text_json, logprobs_json)) + \
            events.emit(PART_DONE, _TEXT_PART_DONE % (quoted, index, part_json)) + \
            events.emit(ITEM_DONE, _MESSAGE_DONE % (index, quoted, part_json))

    def _open_item(self, item: dict[str, Any]) -> bytes:
        self.output.append(item)
        self._open = item
        return self.event(ITEM_ADDED, output_index=len(self.output) - 1, item=item)

    def _text_delta(self, kind: str, text: str) -> bytes:
        if kind == TEXT_DELTA and self.logprobs is None and text and self._delta_tail is not None:
            return self.text_event(text, False)  # the template (with logprobs asked for, event() below)
        self._text_parts.append(text)
        if kind != TEXT_DELTA:
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
        self._open = self._delta_tail = None
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
            out += self.event(PART_DONE, item_id=item["id"], output_index=index, content_index=0,
                              part=part)
        return out + self.event(ITEM_DONE, output_index=index, item=item)


def _reasoning_item(block: "dict[str, Any]") -> "dict[str, Any]":
    """A provider's reasoning block (serving.chat.ThinkingBlock) as a reasoning item: a signed block's text and its
    signature as ``encrypted_content``; a redacted block, no text, its data marked in ``encrypted_content``."""
    if block["type"] == "redacted_thinking":
        return {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": [],
                "encrypted_content": REDACTED_REASONING_PREFIX + block["data"]}
    item = {"type": "reasoning", "id": new_id("rs"), "summary": [],
            "content": [{"type": "reasoning_text", "text": block["thinking"]}]}
    if block["signature"]:  # (a model that does not sign its reasoning: Bedrock's others)
        item["encrypted_content"] = block["signature"]
    return item


_ARGUMENTS = {"function_call": "function_call_arguments", "mcp_call": "mcp_call_arguments"}
# A message's events' tails (ResponseShape._open_message, _close_message, text_event): the bytes event() makes
# after the sequence number, in the field order it gives them (tests/unit/test_response_shape.py holds them to it).
_TEXT_DELTA_END = b',"logprobs":[]}\n\n'
_MESSAGE_ADDED = b',"output_index":%d,"item":{"type":"message","id":"%s","status":"in_progress","role":"assistant",' \
    b'"content":[]}}\n\n'
_TEXT_PART_ADDED = b',"item_id":"%s","output_index":%d,"content_index":0,"part":{"type":"output_text","text":"",' \
    b'"annotations":[]}}\n\n'
_TEXT_PART = b'{"type":"output_text","text":%s,"annotations":[],"logprobs":%s}'
_TEXT_DONE = b',"item_id":"%s","output_index":%d,"content_index":0,"text":%s,"logprobs":%s}\n\n'
_TEXT_PART_DONE = b',"item_id":"%s","output_index":%d,"content_index":0,"part":%s}\n\n'
_MESSAGE_DONE = b',"output_index":%d,"item":{"type":"message","id":"%s","status":"completed","role":"assistant",' \
    b'"content":[%s]}}\n\n'


def _message_item(item_id: str, text: str | None, status: str,
                  logprobs: "list[dict[str, Any]] | None" = None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [],
                                        "logprobs": logprobs or []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}



"""Anthropic's Messages wire: ``POST {base_url}/v1/messages`` with ``x-api-key`` and ``anthropic-version``.

From the typed chat request (OpenAI-shaped messages, ``gateway/serving/chat.py``):

* system messages become ``system``; the rest alternate user and assistant, as Anthropic requires: consecutive
  messages of one role are merged into one, a tool message becomes a ``tool_result`` block of a user message;
* an assistant's ``tool_calls`` become ``tool_use`` blocks (their arguments parsed back into ``input``), its
  reasoning a ``thinking`` block when the turn carries the signature Anthropic gave it (``reasoning_signature``),
  else left out (Anthropic refuses unsigned thinking); a Messages client's thinking blocks go back as it sent them
  (``thinking_blocks``: each signed block, and the redacted ones);
* images become ``image`` blocks: a data URI as base64 with its media type, a URL as a URL source;
* tools and ``tool_choice`` map to Anthropic's (``required`` is ``any``; ``parallel_tool_calls: false`` is
  ``disable_parallel_tool_use``); a JSON schema constraint is ``output_config.format``; thinking is
  ``{"type": "enabled", "budget_tokens"}`` from the client's budget (Anthropic's own Messages API in front) or
  its reasoning effort (``output_config.effort``);
* ``max_tokens`` is required by Anthropic: the request's, else the target's ``max_tokens`` option, else 4096.

Back: text, thinking (with its signature, which a client sends back with it; several signed blocks and redacted
ones block by block: ``thinking_blocks``, a stream's ``RedactedReasoning``) and tool_use blocks; ``stop_reason``
as OpenAI's finish reason (end_turn and stop_sequence stop, max_tokens length, tool_use tool_calls, refusal
content_filter), usage with the cache's reads counted as cached prompt tokens (and in the prompt, as OpenAI counts
them). A stream's ``input_json_delta`` pieces are assembled into one call, handed on when its block stops.

A Messages client is given Anthropic's own answer (``relays``): the body as Anthropic wrote it, the stream's events
as they came, each checked (``_MessagesPassed``), so every block reaches it (several signed thinking blocks,
redacted thinking, citations, Anthropic's tool ids), as it would calling Anthropic itself.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..serving.chat import Call, ChatRequest, Content, Delta, Reasoning, ReasoningSignature, RedactedReasoning
from .base import (CONTEXT_LENGTH, OVERLOADED, PROVIDERS, SERVER, HttpCall, Provider, ProviderAnswer, ProviderError,
                   StreamEnd, StreamReader, Target, Unsupported, Usage, call_arguments, fold_turn, kind_of_status,
                   put_sampling, refuse, retry_after_s, thinking_blocks_of)
from .passing import EARLY, EARLY_DROP, PASS, PassingReader, data_lines
from .sse import json_object
from .text_events import ShapeMemory, TextEvents

VERSION = "2023-06-01"
MAX_TOKENS = 4096  # Anthropic requires max_tokens: what a request that names none gets
MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
           "refusal": "content_filter", "pause_turn": "stop", "model_context_window_exceeded": "length"}
# An effort, when the client gave one and no budget: Anthropic's own levels.
_EFFORTS = {"low": "low", "medium": "medium", "high": "high"}


def _image_block(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media_type = head[5:].split(";")[0]
        if media_type not in MEDIA_TYPES or ";base64" not in head:
            raise Unsupported(f"images of type {media_type or 'unknown'} (it takes {', '.join(MEDIA_TYPES)})",
                              "messages")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _content_blocks(content: Any, images: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks = []
    for part in content:
        if part.get("type") == "image":
            blocks.append(_image_block(next(images).url))
        elif part.get("text"):
            blocks.append({"type": "text", "text": part["text"]})
    return blocks


def messages_out(chat: ChatRequest) -> "tuple[list[dict[str, Any]], str | None]":
    """(Anthropic's messages, its system prompt) for the request's messages."""
    images = iter(chat.images)
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        fold_turn(out, role, blocks, "content")

    for message in chat.messages:
        role = message.get("role")
        if role == "system":
            text = message.get("content")
            system.append(text if isinstance(text, str) else "".join(p.get("text", "") for p in text or ()))
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": message.get("tool_call_id", ""),
                          "content": message.get("content") if isinstance(message.get("content"), str) else
                          "".join(p.get("text", "") for p in message.get("content") or ())}])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.get("thinking_blocks"):  # as Anthropic gave them (signed, redacted), checked
                blocks += thinking_blocks_of(message["thinking_blocks"])
            elif message.get("reasoning_content") and message.get("reasoning_signature"):
                blocks.append({"type": "thinking", "thinking": message["reasoning_content"],
                               "signature": message["reasoning_signature"]})
            blocks += _content_blocks(message.get("content"), images)
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                blocks.append({"type": "tool_use", "id": call.get("id", ""), "name": function.get("name", ""),
                               "input": call_arguments(function.get("arguments", "{}"))})
            add("assistant", blocks)
        else:
            add("user", _content_blocks(message.get("content"), images))
    return out, "\n\n".join(system) if system else None


def usage_of(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    read = int(raw.get("cache_read_input_tokens") or 0)
    written = int(raw.get("cache_creation_input_tokens") or 0)
    return Usage(prompt_tokens=int(raw.get("input_tokens") or 0) + read + written,
                 completion_tokens=int(raw.get("output_tokens") or 0), cached_tokens=read,
                 cache_write_tokens=written)


def error_of(status: int, headers: "list[tuple[bytes, bytes]]", body: bytes) -> ProviderError:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""
    message, kind_name = f"the provider answered {status}", None
    try:
        error = orjson.loads(body).get("error") or {}
        message = str(error.get("message") or message)
        kind_name = error.get("type")
    except (orjson.JSONDecodeError, AttributeError):
        message = body[:512].decode("utf-8", "replace").strip() or message
    kind = kind_of_status(status)
    if kind_name == "overloaded_error":
        kind = OVERLOADED
    if status == 400 and ("prompt is too long" in message or "context window" in message):
        kind = CONTEXT_LENGTH
    return ProviderError(kind, status, message, retry_after_s(headers), kind_name)


class AnthropicMessages(Provider):
    name = "anthropic"

    def check(self, chat: ChatRequest, target: Target) -> None:
        refuse(chat, target, "n", "logprobs", "seed", "frequency_penalty", "presence_penalty", "logit_bias",
               "json_object")

    def call(self, chat: ChatRequest, target: Target, stream: bool, secret: Any) -> HttpCall:
        sampling = chat.sampling
        messages, system = messages_out(chat)
        body: dict[str, Any] = {"model": target.model, "messages": messages,
                                "max_tokens": sampling.max_tokens or int(target.options.get("max_tokens", MAX_TOKENS))}
        if system is not None:
            body["system"] = system
        put_sampling(body, sampling, {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                                      "stop": "stop_sequences"})
        if chat.tools:
            body["tools"] = [_tool(tool) for tool in chat.tools]
            choice: dict[str, Any] = {"auto": {"type": "auto"}, "required": {"type": "any"},
                                      "none": {"type": "none"}}.get(chat.tool_choice) or \
                {"type": "tool", "name": chat.tool_name}
            if not chat.parallel_tool_calls and choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
            body["tool_choice"] = choice
        output_config: dict[str, Any] = {}
        constraint = sampling.constraint
        if constraint is not None and sampling.constraint_field != "tool_choice":
            output_config["format"] = {"type": "json_schema", "schema": orjson.loads(constraint.spec)}
        if chat.reasoning_budget is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": chat.reasoning_budget}
        elif chat.template_kwargs.get("enable_thinking") is False or chat.template_kwargs.get("thinking") is False:
            body["thinking"] = {"type": "disabled"}
        effort = chat.template_kwargs.get("reasoning_effort")
        if effort in _EFFORTS:
            output_config["effort"] = _EFFORTS[effort]
        if output_config:
            body["output_config"] = output_config
        if stream:
            body["stream"] = True
        headers = [(b"content-type", b"application/json"),
                   (b"anthropic-version", str(target.options.get("anthropic_version", VERSION)).encode())]
        if secret:
            headers.append((b"x-api-key", secret.encode()))
        headers += [(name.lower().encode(), value.encode()) for name, value in target.headers]
        return HttpCall(b"POST", target.base_url.rstrip("/") + "/v1/messages", headers, orjson.dumps(body))

    def answer(self, body: bytes) -> ProviderAnswer:
        try:
            data = orjson.loads(body)
            blocks = data["content"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ProviderError(SERVER, 502, "the provider's answer is not a message") from None
        texts, thinking, calls = [], [], []
        signature = None
        reasoning_blocks: list[dict[str, Any]] = []  # (thinking_blocks)
        for block in blocks:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(block.get("text", ""))
            elif kind == "thinking":
                text = block.get("thinking", "")
                thinking.append(text)
                block_signature = block.get("signature") if isinstance(block.get("signature"), str) else ""
                if block_signature:
                    signature = block_signature
                if isinstance(text, str):
                    reasoning_blocks.append({"type": "thinking", "thinking": text, "signature": block_signature})
            elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
                reasoning_blocks.append({"type": "redacted_thinking", "data": block["data"]})
            elif kind == "tool_use":
                calls.append(Call(len(calls), str(block.get("id")), str(block.get("name")),
                                  orjson.dumps(block.get("input") or {}).decode()))
        return ProviderAnswer("".join(texts) if texts or not calls else None,
                              "".join(thinking) if thinking else None, calls,
                              _FINISH.get(data.get("stop_reason"), "stop"), usage_of(data.get("usage")),
                              data.get("stop_sequence"), signature, tuple(reasoning_blocks) or None, data)

    def stream(self) -> StreamReader:
        return _MessagesStream()

    relays = "messages"

    def passing_stream(self, chat: ChatRequest) -> StreamReader:
        return _MessagesPassed()

    def error(self, status: int, headers: "list[tuple[bytes, bytes]]", body: bytes) -> ProviderError:
        return error_of(status, headers, body)


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    out = {"name": function.get("name", ""), "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        out["description"] = function["description"]
    return out


class _MessageEnd:
    """What a Messages stream says of its end, read from its events as they come: the usage (message_start's, then
    message_delta's counts over them), the stop reason and sequence, whether message_stop came; an error event is
    the ProviderError it names."""

    __slots__ = ("usage", "finish", "stop_sequence", "stopped")

    def __init__(self) -> None:
        self.usage: dict[str, Any] = {}
        self.finish: str | None = None
        self.stop_sequence: str | None = None
        self.stopped = False

    def read(self, kind: Any, event: "dict[str, Any]") -> None:
        if kind == "message_start":
            self.usage.update((event.get("message") or {}).get("usage") or {})
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            if delta.get("stop_reason"):
                self.finish = _FINISH.get(delta["stop_reason"], "stop")
                self.stop_sequence = delta.get("stop_sequence")
            self.usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            error = event.get("error") or {}
            raise error_of(529 if error.get("type") == "overloaded_error" else 500, [],
                           orjson.dumps({"error": error}))

    def result(self) -> StreamEnd:
        if not self.stopped or self.finish is None:
            raise ProviderError(SERVER, 502, "the provider's stream ended before its message did")
        return StreamEnd(self.finish, usage_of(self.usage), self.stop_sequence)


# The text deltas' events in the body: an event line, then the data the shape is learned from.
_TEXT_FRAME = b"event: content_block_delta\ndata: "
# A text delta names only its block's index besides its text: its shape is the same in every stream (most streams'
# text block is the first), so each stream starts with the last one learned.
_TEXT_SHAPES = ShapeMemory()


def _learns(events: TextEvents, event: "dict[str, Any]", payload: bytes) -> "str | None":
    """A text delta's text (``events`` learns its shape from the first it parses); None for any other event."""
    delta = event.get("delta") or {}
    text = delta.get("text")
    if delta.get("type") != "text_delta" or type(text) is not str:
        return None
    if text and not events.learned:
        events.learn(payload, text)
    return text


class _MessagesStream(StreamReader):
    def __init__(self, shapes: ShapeMemory = _TEXT_SHAPES) -> None:
        # Text deltas read by their shape (their events framed by their event line).
        self._events = TextEvents(b"text", _TEXT_FRAME, shapes)
        self._blocks: dict[int, dict[str, Any]] = {}  # open tool_use blocks by index: id, name, input pieces
        self._calls = 0
        self._end = _MessageEnd()
        self._thinking: list[str] = []  # the thinking block's text so far (its signature carries it whole)

    def feed(self, data: bytes) -> "list[Delta]":
        deltas: list[Delta] = []
        texts: list[str] = []  # consecutive text deltas: one Content
        events = self._events
        for item in events.items(data):
            if type(item) is str:  # text deltas of the shape learned
                texts.append(item)
                continue
            event = json_object(item)
            if event is None:
                continue
            kind = event.get("type")
            if kind == "content_block_delta":
                text = _learns(events, event, item)
                if text is not None:
                    if text:
                        texts.append(text)
                    continue
            if texts:
                deltas.append(Content("".join(texts)))
                texts.clear()
            if kind == "content_block_delta":
                delta = event.get("delta") or {}
                dtype = delta.get("type")
                if dtype == "thinking_delta" and delta.get("thinking"):
                    deltas.append(Reasoning(delta["thinking"]))
                    self._thinking.append(delta["thinking"])
                elif dtype == "signature_delta" and isinstance(delta.get("signature"), str) and delta["signature"]:
                    deltas.append(ReasoningSignature(delta["signature"], "".join(self._thinking)))
                    self._thinking.clear()
                elif dtype == "input_json_delta":
                    block = self._blocks.get(event.get("index"))
                    if block is not None:
                        block["input"].append(delta.get("partial_json", ""))
            elif kind == "content_block_start":
                block = event.get("content_block") or {}
                if block.get("type") == "tool_use":
                    self._blocks[event.get("index")] = {"id": str(block.get("id")), "name": str(block.get("name")),
                                                        "input": []}
                elif block.get("type") == "redacted_thinking" and isinstance(block.get("data"), str):
                    deltas.append(RedactedReasoning(block["data"]))  # (whole in its start: no deltas follow)
            elif kind == "content_block_stop":
                block = self._blocks.pop(event.get("index"), None)
                if block is not None:
                    deltas.append(Call(self._calls, block["id"], block["name"], "".join(block["input"]) or "{}"))
                    self._calls += 1
            else:
                self._end.read(kind, event)
        if texts:
            deltas.append(Content("".join(texts)))
        return deltas

    def finish(self) -> StreamEnd:
        return self._end.result()


# Events whose only news is their kind (a text block's start, a block's stop, a ping, the message's stop) are the
# same bytes in most streams: one checked once is known by its bytes after, not parsed again (any other bytes are
# parsed). Bounded: a provider that varies them (another index, spacing) fills it once and is parsed as before.
_PLAIN_KINDS = frozenset({"content_block_start", "content_block_stop", "ping", "message_stop"})
_KNOWN_EVENTS: "dict[bytes, str]" = {}
KNOWN_EVENTS_MAX = 256
KNOWN_EVENT_BYTES_MAX = 128  # (a text block's start is ~80 bytes)
_NOTHING: "dict[str, Any]" = {}


class _MessagesPassed(PassingReader):
    """Anthropic's events for a Messages client, passed on as Anthropic wrote them (``passing.py``): each a JSON
    object with a type (text deltas by their shape); message_start waits for the answer to begin, pings before it
    are dropped; the end (stop reason, usage) is read as ``_MessagesStream`` reads it."""

    frame = b"event: "

    def __init__(self, shapes: ShapeMemory = _TEXT_SHAPES) -> None:
        super().__init__(TextEvents(b"text", _TEXT_FRAME, shapes))
        self._end = _MessageEnd()
        self._kind = ""

    def check(self, payload: bytes) -> str:
        # (a large event is never one of them: not hashed to look it up)
        kind = _KNOWN_EVENTS.get(payload) if len(payload) <= KNOWN_EVENT_BYTES_MAX else None
        if kind is not None:  # the same bytes as an event checked before, which says nothing but its kind
            self._kind = kind
            self._end.read(kind, _NOTHING)  # (message_stop's)
            return EARLY_DROP if kind == "ping" else PASS
        event = json_object(payload)
        kind = event.get("type") if event is not None else None
        if type(kind) is not str or not kind.isprintable():  # (it names the event when written again: one line)
            raise ProviderError(SERVER, 502, "the provider streamed an event that is not a Messages event")
        self._kind = kind
        if kind == "content_block_delta":
            _learns(self._events, event, payload)
            return PASS
        self._end.read(kind, event)
        if kind in _PLAIN_KINDS and len(_KNOWN_EVENTS) < KNOWN_EVENTS_MAX and len(payload) <= KNOWN_EVENT_BYTES_MAX \
                and (kind != "content_block_start" or (event.get("content_block") or {}).get("type") == "text"):
            _KNOWN_EVENTS[payload] = kind
        return EARLY if kind == "message_start" else EARLY_DROP if kind == "ping" else PASS

    def framed(self, payload: bytes) -> bytes:
        return b"event: " + self._kind.encode() + b"\n" + data_lines(payload)  # (named by what it is)

    def finish(self) -> StreamEnd:
        return self._end.result()


PROVIDERS.add("anthropic", AnthropicMessages(), "Anthropic's Messages API: x-api-key, anthropic-version, thinking and "
              "tool use, prompt caching's usage")

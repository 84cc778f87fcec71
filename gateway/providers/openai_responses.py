"""OpenAI's Responses API as a target's wire (``api = "responses"`` on an openai, azure or openai_compatible target):
for the models OpenAI serves best there (its reasoning models' summaries), and servers that speak it (vLLM).

The request is the typed chat request every front API makes, so a Responses client, a chat client and a Messages
client all reach it; the provider is told not to store anything (``store: false``): the conversation is ours,
kept in our history like any other.

    the messages        ``input`` items: system, user and assistant messages (text, ``input_text`` and
                        ``input_image`` parts), each tool call a ``function_call`` item and each tool result a
                        ``function_call_output``; earlier turns' reasoning left out (OpenAI takes back only the
                        reasoning items it made, by id or encrypted, and the conversation is not stored there)
    sampling            ``max_output_tokens``, ``temperature``, ``top_p``; there are no stop sequences, seed,
                        penalties or logit bias on this API: each is a 400 naming it
    tools               flat function tools (``strict`` false unless asked: chat's default, not this API's),
                        ``tool_choice`` (a named one as ``{"type": "function", "name"}``), ``parallel_tool_calls``
    structured output   ``text.format``: a JSON schema (its name and strictness) or a JSON object
    reasoning           ``reasoning.effort``; the summary of it when the target asks (``reasoning_summary``:
                        OpenAI gives summaries only to verified organizations, so it is not asked by default)
    where               ``{base_url}/responses``; Azure ``{base_url}/openai/responses?api-version=V`` (or
                        ``/openai/v1/responses``), the deployment named as the model

Answers: ``output`` items (``message`` text, ``function_call``, ``reasoning`` summary or text), ``status`` and
``incomplete_details`` as the finish reason, usage with cached and reasoning tokens. A stream is read by its
events: text and reasoning deltas as they come, each call whole at its ``output_item.done``, the finish and usage
from ``response.completed`` (or ``.incomplete``); ``response.failed`` and ``error`` are the provider's errors.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..serving.chat import Call, ChatRequest, Content, Delta, Reasoning, new_call_id
from .base import (CONTEXT_LENGTH, RATE_LIMITED, SERVER, HttpCall, ProviderAnswer, ProviderError, StreamEnd,
                   StreamReader, Target, Unsupported, Usage, put_sampling, refuse)
from .openai import RESPONSES_WIRES, OpenAIChat, json_schema_of
from .sse import SseDecoder

_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


class OpenAIResponses(OpenAIChat):
    """The Responses API of one flavor (openai, azure, openai_compatible): where and how it authenticates, its
    embeddings and its errors are the chat wire's."""

    def wire(self, target: Target) -> "OpenAIResponses":
        return self

    # Its answers are the Responses API's, not chat's: every client is given them translated (a Responses client
    # too: the gateway's own response object is what it stores and continues).
    relays = None

    def check(self, chat: ChatRequest, target: Target) -> None:
        refuse(chat, target, "n", "logprobs", "seed", "frequency_penalty", "presence_penalty", "logit_bias")
        sampling = chat.sampling
        for value, feature, param in ((sampling.stop, "stop sequences", "stop"), (sampling.top_k, "top_k", "top_k"),
                                      (sampling.min_p, "min_p", "min_p"),
                                      (sampling.repetition_penalty, "repetition_penalty", "repetition_penalty")):
            if value is not None and value != () and value != []:
                raise Unsupported(f"{feature} (OpenAI's Responses API has none)", param)

    def _url(self, target: Target, path: str) -> str:
        if self.name == "azure" and path == "responses":  # not under the deployment: the model names it
            base = target.base_url.rstrip("/")
            version = target.options.get("api_version")
            return f"{base}/openai/responses?api-version={version}" if version else f"{base}/openai/v1/responses"
        return super()._url(target, path)

    def call(self, chat: ChatRequest, target: Target, stream: bool, secret: Any) -> HttpCall:
        sampling = chat.sampling
        body: dict[str, Any] = {"model": target.model, "input": input_items(chat), "store": False}
        put_sampling(body, sampling, {"max_tokens": "max_output_tokens", "temperature": "temperature", "top_p": "top_p"})
        if chat.tools:
            body["tools"] = [_tool(tool) for tool in chat.tools if isinstance(tool.get("function"), dict)]
            body["tool_choice"] = ({"type": "function", "name": chat.tool_name} if chat.tool_choice == "named"
                                   else chat.tool_choice)
            if not chat.parallel_tool_calls:
                body["parallel_tool_calls"] = False
        constraint = sampling.constraint
        if constraint is not None and sampling.constraint_field != "tool_choice":
            if constraint.kind == "json_object":
                body["text"] = {"format": {"type": "json_object"}}
            else:
                body["text"] = {"format": {"type": "json_schema", **json_schema_of(constraint)}}
        reasoning: dict[str, Any] = {}
        effort = chat.template_kwargs.get("reasoning_effort")
        if isinstance(effort, str):
            reasoning["effort"] = effort
        summary = target.options.get("reasoning_summary")
        if summary and chat.thinking:
            reasoning["summary"] = summary
        if reasoning:
            body["reasoning"] = reasoning
        if stream:
            body["stream"] = True
        url, headers = self._where(target, "responses", secret, stream)
        return HttpCall(b"POST", url, headers, orjson.dumps(body))

    def answer(self, body: bytes) -> ProviderAnswer:
        try:
            data = orjson.loads(body)
            output = data["output"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ProviderError(SERVER, 502, "the provider's answer is not a response") from None
        if data.get("status") == "failed":
            raise _failed(data.get("error"))
        texts: list[str] = []
        reasonings: list[str] = []
        calls: list[Call] = []
        for item in output if isinstance(output, list) else ():
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "message":
                texts += [part.get("text") or part.get("refusal") or "" for part in item.get("content") or ()
                          if isinstance(part, dict)]
            elif kind == "reasoning":
                reasonings.append(_reasoning_text(item))
            elif kind == "function_call" and isinstance(item.get("name"), str):
                calls.append(Call(len(calls), _call_id(item), item["name"], item.get("arguments") or "{}"))
        reasoning = "\n\n".join(text for text in reasonings if text)
        return ProviderAnswer("".join(texts) if texts else None, reasoning or None, calls,
                              _finish(data, bool(calls)), _usage(data.get("usage")))

    def stream(self) -> StreamReader:
        return _ResponsesStream()


def input_items(chat: ChatRequest) -> "list[dict[str, Any]]":
    """The request's messages as the Responses API's ``input`` (the module's docstring)."""
    images = iter(chat.images)
    items: list[dict[str, Any]] = []
    for message in chat.messages:
        role = message.get("role")
        content = message.get("content")
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": str(message.get("tool_call_id") or ""),
                          "output": _text_of(content)})
            continue
        if isinstance(content, list) and role == "user":
            parts: list[dict[str, Any]] = []
            for part in content:
                if part.get("type") == "image":
                    image = next(images)
                    parts.append({"type": "input_image", "image_url": image.url, "detail": image.detail or "auto"})
                else:
                    parts.append({"type": "input_text", "text": part.get("text", "")})
            items.append({"role": "user", "content": parts})
        elif content or role != "assistant":
            items.append({"role": role if role in ("system", "developer", "assistant") else "user",
                          "content": _text_of(content)})
        for call in message.get("tool_calls") or () if role == "assistant" else ():
            function = call.get("function") or {}
            items.append({"type": "function_call", "call_id": call.get("id") or new_call_id(),
                          "name": function.get("name", ""), "arguments": function.get("arguments") or "{}"})
    return items


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _tool(tool: "dict[str, Any]") -> "dict[str, Any]":
    """A chat tool (``{"type": "function", "function": {...}}``) as the Responses API's flat one."""
    function = tool["function"]
    out = {"type": "function", "name": function.get("name", ""),
           "parameters": function.get("parameters") or {"type": "object", "properties": {}},
           "strict": bool(function.get("strict"))}
    if function.get("description"):
        out["description"] = function["description"]
    return out


def _call_id(item: "dict[str, Any]") -> str:
    value = item.get("call_id")
    return value if isinstance(value, str) and value else new_call_id()


def _reasoning_text(item: "dict[str, Any]") -> str:
    """A reasoning item's words: its summary (OpenAI's), else its full text (vLLM's, gpt-oss's)."""
    for key in ("summary", "content"):
        texts = [part.get("text") or "" for part in item.get(key) or () if isinstance(part, dict)]
        if any(texts):
            return "\n\n".join(text for text in texts if text)
    return ""


def _finish(response: "dict[str, Any]", called: bool) -> str:
    if response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return _INCOMPLETE.get(reason, "length")
    return "tool_calls" if called else "stop"


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    prompt_details = raw.get("input_tokens_details") or {}
    return Usage(prompt_tokens=int(raw.get("input_tokens") or 0),
                 completion_tokens=int(raw.get("output_tokens") or 0),
                 cached_tokens=int(prompt_details.get("cached_tokens") or 0),
                 reasoning_tokens=int((raw.get("output_tokens_details") or {}).get("reasoning_tokens") or 0),
                 cache_write_tokens=int(prompt_details.get("cache_write_tokens") or 0))


def _failed(error: Any) -> ProviderError:
    """A response that failed (or an ``error`` event): its code and message; a context window's is kinded so."""
    error = error if isinstance(error, dict) else {}
    message = str(error.get("message") or "the provider's response failed")
    code = error.get("code") if isinstance(error.get("code"), str) else None
    if code == "rate_limit_exceeded":
        return ProviderError(RATE_LIMITED, 429, message, code=code)
    return ProviderError(CONTEXT_LENGTH if code == "context_length_exceeded" else SERVER, 502, message, code=code)


class _ResponsesStream(StreamReader):
    def __init__(self) -> None:
        self._events = SseDecoder()
        self._calls = 0
        self._end: StreamEnd | None = None
        self._summaries: set[tuple[Any, Any]] = set()  # the reasoning summary parts begun (a second is a new line)

    def feed(self, data: bytes) -> "list[Delta]":
        deltas: list[Delta] = []
        for event in self._events.objects(data):
            kind = event.get("type")
            if kind == "response.output_text.delta":
                text = event.get("delta")
                if type(text) is str and text:
                    deltas.append(Content(text))
            elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
                text = event.get("delta")
                if type(text) is str and text:
                    deltas.append(Reasoning(text))
            elif kind == "response.reasoning_summary_part.added":
                part = (event.get("item_id"), event.get("summary_index"))
                if self._summaries and part not in self._summaries:
                    deltas.append(Reasoning("\n\n"))
                self._summaries.add(part)
            elif kind == "response.output_item.done":
                item = event.get("item")
                if isinstance(item, dict) and item.get("type") == "function_call" \
                        and isinstance(item.get("name"), str):
                    deltas.append(Call(self._calls, _call_id(item), item["name"], item.get("arguments") or "{}"))
                    self._calls += 1
            elif kind in ("response.completed", "response.incomplete"):
                response = event.get("response") if isinstance(event.get("response"), dict) else {}
                self._end = StreamEnd(_finish(response, self._calls > 0), _usage(response.get("usage")))
            elif kind == "response.failed":
                response = event.get("response") if isinstance(event.get("response"), dict) else {}
                raise _failed(response.get("error"))
            elif kind == "error":
                raise _failed(event)
        return deltas

    def finish(self) -> StreamEnd:
        if self._end is None:
            raise ProviderError(SERVER, 502, "the provider's stream ended before its response did")
        return self._end


for _flavor in ("openai", "azure", "openai_compatible"):
    RESPONSES_WIRES[_flavor] = OpenAIResponses(_flavor)

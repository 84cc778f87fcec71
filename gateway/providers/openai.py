"""OpenAI's chat completions wire: OpenAI itself, Azure OpenAI, and any OpenAI-compatible service (xAI, Mistral,
Together, vLLM's or SGLang's own HTTP servers).

The request's messages are already OpenAI's (``gateway/serving/chat.py``): they go out as they are but for the
images, whose placeholders become ``image_url`` parts again, and the reasoning of earlier turns, which OpenAI does
not take back. The three differ only in where the call goes and how it is authenticated:

    openai              {base_url}/chat/completions, ``Authorization: Bearer KEY`` (and the target's organization
                        and project headers); ``max_completion_tokens``
    azure               {base_url}/openai/deployments/{model}/chat/completions?api-version=V with the ``api-key``
                        header (a key) or ``Authorization: Bearer`` (an Entra token: ``auth = "bearer"``); without
                        ``api_version``, Azure's v1 API, {base_url}/openai/v1/chat/completions with the model named
    openai_compatible   {base_url}/chat/completions, a bearer key if the target has one; ``max_tokens`` (what every
                        compatible server reads), and vLLM's ``min_p`` and ``repetition_penalty`` passed on

Answers: ``content``, ``tool_calls``, and the reasoning of servers that send it (``reasoning_content``, vLLM's
newer ``reasoning``); usage with ``prompt_tokens_details.cached_tokens`` and
``completion_tokens_details.reasoning_tokens``. A stream's tool call arrives in pieces by ``index`` and is handed
on whole when the next begins or the stream ends (the engines' calls come whole too).
"""

from __future__ import annotations

from typing import Any

import orjson

from ..serving.chat import Call, ChatRequest, Content, Delta, Reasoning, new_call_id
from .base import (CONTEXT_LENGTH, PROVIDERS, SERVER, HttpCall, Provider, ProviderAnswer, ProviderError, StreamEnd,
                   StreamReader, Target, Unsupported, Usage, kind_of_status, put_sampling, refuse,
                   retry_after_s)
from .passing import DROP, EARLY, PASS, PassingReader, data_lines
from .sse import json_object
from .text_events import TextEvents

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
           "content_filter": "content_filter"}
_TEXT_KEYS = {"content", "role"}  # a delta with only these is plain text (the stream's fast path)
# A turn's reasoning as other APIs carry it back (its text, a provider's signature, a Messages client's blocks):
# OpenAI's chat messages have no such members.
_REASONING_KEYS = ("reasoning_content", "reasoning_signature", "thinking_blocks")
# Each flavor on OpenAI's Responses API (openai_responses.py fills it): a target's ``api = "responses"``.
RESPONSES_WIRES: "dict[str, Provider]" = {}


def messages_out(chat: ChatRequest) -> list[dict[str, Any]]:
    """The request's messages as OpenAI takes them: image placeholders as ``image_url`` parts, in order; earlier
    turns' reasoning left out."""
    images = iter(chat.images)
    out = []
    for message in chat.messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.get("type") == "image":
                    image = next(images)
                    parts.append({"type": "image_url", "image_url": {"url": image.url, "detail": image.detail}})
                else:
                    parts.append({"type": "text", "text": part.get("text", "")})
            message = {**message, "content": parts}
        if "reasoning_content" in message or "reasoning_signature" in message or "thinking_blocks" in message:
            message = {k: v for k, v in message.items() if k not in _REASONING_KEYS}
        if message.get("role") == "assistant" and not message.get("content") and message.get("tool_calls"):
            message = {**message, "content": None}
        out.append(message)
    return out


def json_schema_of(constraint: Any) -> "dict[str, Any]":
    """A JSON-schema constraint as OpenAI names it: its name (``response`` when the client gave none), the schema,
    and its strictness when the client said."""
    schema: dict[str, Any] = {"name": constraint.name or "response", "schema": orjson.loads(constraint.spec)}
    if constraint.strict is not None:
        schema["strict"] = constraint.strict
    return schema


def usage_of(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    return Usage(prompt_tokens=int(raw.get("prompt_tokens") or 0),
                 completion_tokens=int(raw.get("completion_tokens") or 0),
                 cached_tokens=int(prompt_details.get("cached_tokens") or 0),
                 reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0))


def error_of(status: int, headers: "list[tuple[bytes, bytes]]", body: bytes) -> ProviderError:
    """OpenAI's error body (``{"error": {"message", "type", "code", "param"}}``; Azure's is the same)."""
    message, code = f"the provider answered {status}", None
    try:
        error = orjson.loads(body).get("error")
        if isinstance(error, dict):
            message = str(error.get("message") or message)
            code = error.get("code") if isinstance(error.get("code"), str) else None
        elif isinstance(error, str):  # some compatible servers
            message = error
    except (orjson.JSONDecodeError, AttributeError):
        text = body[:512].decode("utf-8", "replace").strip()
        message = text or message
    kind = kind_of_status(status)
    if code == "context_length_exceeded" or (status == 400 and "maximum context length" in message):
        kind = CONTEXT_LENGTH
    return ProviderError(kind, status, message, retry_after_s(headers), code)


class OpenAIChat(Provider):
    """The chat completions wire; ``flavor`` is openai, azure or openai_compatible (the module's docstring)."""

    def __init__(self, flavor: str) -> None:
        self.name = flavor

    def check(self, chat: ChatRequest, target: Target) -> None:
        refuse(chat, target, "n", "logprobs")

    relays = "chat"

    def check_relayed(self, chat: ChatRequest, target: Target) -> None:
        refuse(chat, target)  # n and logprobs come in the provider's own chunks

    def passing_stream(self, chat: ChatRequest) -> StreamReader:
        return _ChatPassed(chat.include_usage)

    def call(self, chat: ChatRequest, target: Target, stream: bool, secret: Any) -> HttpCall:
        sampling = chat.sampling
        body: dict[str, Any] = {"messages": messages_out(chat)}
        if not (self.name == "azure" and target.options.get("api_version")):
            body["model"] = target.model
        if sampling.max_tokens is not None:
            body["max_tokens" if self.name == "openai_compatible" else "max_completion_tokens"] = sampling.max_tokens
        put_sampling(body, sampling, {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop",
                                      "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty"})
        if sampling.n != 1:  # (a chat client's, given the provider's own answer: check_relayed)
            body["n"] = sampling.n
        if sampling.logprobs is not None:
            body["logprobs"] = True
            if sampling.logprobs:
                body["top_logprobs"] = sampling.logprobs
        if sampling.logit_bias:
            body["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias}
        if self.name == "openai_compatible":
            if sampling.top_k is not None:
                body["top_k"] = sampling.top_k
            if sampling.min_p is not None:
                body["min_p"] = sampling.min_p
            if sampling.repetition_penalty is not None:
                body["repetition_penalty"] = sampling.repetition_penalty
        elif sampling.top_k is not None:
            raise Unsupported("top_k", "top_k")
        if chat.tools:
            body["tools"] = chat.tools
            if chat.tool_choice == "named":
                body["tool_choice"] = {"type": "function", "function": {"name": chat.tool_name}}
            else:
                body["tool_choice"] = chat.tool_choice
            if not chat.parallel_tool_calls:
                body["parallel_tool_calls"] = False
        constraint = sampling.constraint
        if constraint is not None and sampling.constraint_field != "tool_choice":
            if constraint.kind == "json_object":
                body["response_format"] = {"type": "json_object"}
            else:
                body["response_format"] = {"type": "json_schema", "json_schema": json_schema_of(constraint)}
        effort = chat.template_kwargs.get("reasoning_effort")
        if isinstance(effort, str) and self.name != "openai_compatible":
            body["reasoning_effort"] = effort
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        url, headers = self._where(target, "chat/completions", secret, stream)
        return HttpCall(b"POST", url, headers, orjson.dumps(body))

    def answer(self, body: bytes) -> ProviderAnswer:
        try:
            data = orjson.loads(body)
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            raise ProviderError(SERVER, 502, "the provider's answer is not a chat completion") from None
        calls = [Call(i, _call_id(call), call["function"]["name"], call["function"].get("arguments") or "{}")
                 for i, call in enumerate(message.get("tool_calls") or ()) if isinstance(call, dict)
                 and isinstance(call.get("function"), dict) and isinstance(call["function"].get("name"), str)]
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        content = message.get("content")
        return ProviderAnswer(content if isinstance(content, str) else None,
                              reasoning if isinstance(reasoning, str) else None, calls,
                              _FINISH.get(choice.get("finish_reason"), "stop"), usage_of(data.get("usage")),
                              passed=data)

    def stream(self) -> StreamReader:
        return _ChatStream()

    embeds = True

    def embeddings_call(self, body: "dict[str, Any]", target: Target, secret: Any) -> HttpCall:
        """OpenAI's embeddings, at the same place as its chat completions (Azure: the deployment's)."""
        url, headers = self._where(target, "embeddings", secret, False)
        if self.name == "azure" and target.options.get("api_version"):
            body = {k: v for k, v in body.items() if k != "model"}
        return HttpCall(b"POST", url, headers, orjson.dumps(body))

    def wire(self, target: Target) -> Provider:
        return RESPONSES_WIRES[self.name] if target.options.get("api") == "responses" else self

    def _url(self, target: Target, path: str) -> str:
        """Where ``path`` (chat/completions, embeddings) is for the target (Azure: its deployment's)."""
        base = target.base_url.rstrip("/")
        if self.name != "azure":
            return base + "/" + path
        version = target.options.get("api_version")
        return (f"{base}/openai/deployments/{target.model}/{path}?api-version={version}" if version
                else f"{base}/openai/v1/{path}")

    def _where(self, target: Target, path: str, secret: Any, stream: bool) -> "tuple[str, list[tuple[bytes, bytes]]]":
        """The URL of ``path`` for the target, and the headers with its credential."""
        headers = [(b"content-type", b"application/json"), (b"accept", b"text/event-stream" if stream else
                                                            b"application/json")]
        url = self._url(target, path)
        if secret:
            if self.name != "azure" or target.options.get("auth") == "bearer":
                headers.append((b"authorization", b"Bearer " + secret.encode()))
            else:
                headers.append((b"api-key", secret.encode()))
        headers += [(name.lower().encode(), value.encode()) for name, value in target.headers]
        return url, headers

    def error(self, status: int, headers: "list[tuple[bytes, bytes]]", body: bytes) -> ProviderError:
        return error_of(status, headers, body)


def _call_id(call: dict[str, Any]) -> str:
    return call["id"] if isinstance(call.get("id"), str) and call["id"] else new_call_id()


def _plain_delta(chunk: "dict[str, Any]") -> "dict[str, Any] | None":
    """The delta of a plain text chunk (most chunks: one choice whose delta is text, with the role once; no usage,
    no finish, no error), None for any other chunk: where a text shape is learned from."""
    choices = chunk.get("choices")
    choice = choices[0] if type(choices) is list and len(choices) == 1 else None
    if type(choice) is dict and choice.get("finish_reason") is None and not choice.get("index") \
            and chunk.get("usage") is None and "error" not in chunk:
        delta = choice.get("delta")
        if type(delta) is dict and delta.keys() <= _TEXT_KEYS:
            return delta
    return None


class _ChatStream(StreamReader):
    def __init__(self) -> None:
        self._events = TextEvents(b"content")  # text chunks read by their shape, learned from the first
        self._call: dict[str, Any] | None = None  # the call being assembled: index, id, name, arguments pieces
        self._calls = 0
        self._finish: str | None = None
        self._usage = Usage()

    def feed(self, data: bytes) -> "list[Delta]":
        deltas: list[Delta] = []
        texts: list[str] = []  # the plain texts of consecutive chunks: one Content (one event for the client)
        events = self._events
        for item in events.items(data):
            if type(item) is str:  # text chunks of the shape learned
                texts.append(item)
                continue
            chunk = json_object(item)
            if chunk is None:
                continue
            delta = _plain_delta(chunk)
            if delta is not None:
                content = delta.get("content")
                if type(content) is str and content:
                    texts.append(content)
                    if events.shape is None and "role" not in delta:  # the first: its shape, for the next
                        events.learn(item, content)
                continue
            if texts:
                deltas.append(Content("".join(texts)))
                texts.clear()
            self._chunk(chunk, deltas)
        if texts:
            deltas.append(Content("".join(texts)))
        return deltas

    def _chunk(self, chunk: "dict[str, Any]", deltas: "list[Delta]") -> None:
        """Any chunk but plain text: an error, usage, reasoning, tool calls, the finish."""
        if isinstance(chunk.get("error"), dict):  # an error mid-stream (OpenAI sends it as an event)
            raise error_of(500, [], orjson.dumps(chunk))
        if chunk.get("usage"):
            self._usage = usage_of(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                deltas.append(Reasoning(reasoning))
            content = delta.get("content")
            if isinstance(content, str) and content:
                deltas.append(Content(content))
            for piece in delta.get("tool_calls") or ():
                self._call_piece(piece, deltas)
            if choice.get("finish_reason"):
                self._finish = _FINISH.get(choice["finish_reason"], "stop")

    def _call_piece(self, piece: Any, deltas: "list[Delta]") -> None:
        if not isinstance(piece, dict):
            return
        function = piece.get("function") or {}
        index = piece.get("index", 0)
        if self._call is None or index != self._call["index"]:
            self._flush(deltas)
            self._call = {"index": index, "id": piece.get("id") or new_call_id(), "name": "", "arguments": []}
        if isinstance(function.get("name"), str):
            self._call["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            self._call["arguments"].append(function["arguments"])

    def _flush(self, deltas: "list[Delta]") -> None:
        if self._call is not None and self._call["name"]:
            deltas.append(Call(self._calls, self._call["id"], self._call["name"],
                               "".join(self._call["arguments"]) or "{}"))
            self._calls += 1
        self._call = None

    def finish(self) -> StreamEnd:
        if self._finish is None:
            raise ProviderError(SERVER, 502, "the provider's stream ended before its answer did")
        deltas: list[Delta] = []
        self._flush(deltas)  # the call still being assembled
        return StreamEnd(self._finish, self._usage, deltas=deltas)


class _ChatPassed(PassingReader):
    """OpenAI's chunks for a chat client, passed on as the provider wrote them (``passing.py``): each a JSON object
    (text chunks by their shape, learned as ``_ChatStream`` learns it); chunks before the answer begins (the role's)
    wait for it; the usage chunk goes only to a client that asked for usage (the node always asks, for its own
    accounting); its ``[DONE]`` is the node's to write. The finish and usage are read for the node."""

    frame = b"data: "

    def __init__(self, usage_wanted: bool) -> None:
        super().__init__(TextEvents(b"content"))
        self._usage_wanted = usage_wanted
        self._finish: str | None = None
        self._usage = Usage()

    def check(self, payload: bytes) -> str:
        chunk = json_object(payload)
        if chunk is None:
            raise ProviderError(SERVER, 502, "the provider streamed an event that is not a chat chunk")
        if isinstance(chunk.get("error"), dict):  # an error mid-stream (OpenAI sends it as an event)
            raise error_of(500, [], orjson.dumps(chunk))
        if self.answer_id is None and type(chunk.get("id")) is str:
            self.answer_id = orjson.dumps(chunk["id"])
        usage = chunk.get("usage")
        if usage:
            self._usage = usage_of(usage)
        choices = chunk.get("choices")
        if not choices:
            return DROP if usage and not self._usage_wanted else PASS if usage else EARLY
        began = False
        for choice in choices if type(choices) is list else ():
            if type(choice) is not dict:
                continue
            if choice.get("finish_reason"):
                began = True
                if not choice.get("index"):
                    self._finish = _FINISH.get(choice["finish_reason"], "stop")
            delta = choice.get("delta")
            if type(delta) is dict and any(value for key, value in delta.items() if key != "role"):
                began = True
            if choice.get("logprobs"):
                began = True
        if began and self._events.shape is None:  # the first text, as _ChatStream learns it: its shape
            plain = _plain_delta(chunk)
            content = plain.get("content") if plain is not None else None
            if type(content) is str and content and "role" not in plain:
                self._events.learn(payload, content)
        return PASS if began else EARLY

    def framed(self, payload: bytes) -> bytes:
        return data_lines(payload)

    def finish(self) -> StreamEnd:
        if self._finish is None:
            raise ProviderError(SERVER, 502, "the provider's stream ended before its answer did")
        return StreamEnd(self._finish, self._usage)


PROVIDERS.add("openai", OpenAIChat("openai"), "OpenAI's API: chat completions (or the Responses API), embeddings, a "
              "bearer key")
PROVIDERS.add("azure", OpenAIChat("azure"), "Azure OpenAI: deployments and api-version, an api-key or a bearer token")
PROVIDERS.add("openai_compatible", OpenAIChat("openai_compatible"),
              "any OpenAI-compatible server (xAI, Mistral, Together, vLLM, SGLang): a base URL and a key")

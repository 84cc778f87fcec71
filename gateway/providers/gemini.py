"""Google Gemini's ``generateContent`` wire: ``POST {base_url}/v1beta/models/{model}:generateContent`` (streamed:
``:streamGenerateContent?alt=sse``), the API key in ``x-goog-api-key``.

From the typed chat request: system messages become ``systemInstruction``; the rest ``contents`` of role ``user``
or ``model`` (consecutive ones of a role merged, as Gemini expects turns to alternate), each message's text and
images as ``parts`` (a data URI as ``inlineData``, a URL as ``fileData``); an assistant's tool calls as
``functionCall`` parts, a tool message as a ``functionResponse`` part named by the call it answers (Gemini names
functions, not call ids: the name is found from the call) with its text as ``{"result": ...}`` (or the JSON
object it is); tools as ``functionDeclarations`` and ``tool_choice`` as ``functionCallingConfig`` (required is
``ANY``, a named function ``ANY`` with that one allowed); sampling, stops, seed and penalties in
``generationConfig``, a JSON schema as ``responseJsonSchema`` with ``responseMimeType: application/json``, and
thinking in ``thinkingConfig`` (a client's budget, or its effort as Gemini's ``thinkingLevel``), with
``includeThoughts`` so that reasoning comes back.

Back: a candidate's parts (``thought: true`` ones are reasoning), ``functionCall`` parts as calls, the finish
reason (STOP stop, MAX_TOKENS length, SAFETY and its kin content_filter; calls made: tool_calls), and
``usageMetadata`` (prompt, candidates, cached content and thoughts tokens; thoughts count in the completion, as
OpenAI counts reasoning). A stream is a series of such answers, each with the parts since the last.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

from ..serving.chat import Call, ChatRequest, Content, Delta, Reasoning, new_call_id
from .base import (CONTEXT_LENGTH, PROVIDERS, SERVER, HttpCall, Provider, ProviderAnswer, ProviderError, StreamEnd,
                   StreamReader, Target, Unsupported, Usage, call_arguments, fold_turn, kind_of_status, put_sampling,
                   refuse, retry_after_s)
from .sse import SseDecoder

_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter",
           "BLOCKLIST": "content_filter", "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
           "IMAGE_SAFETY": "content_filter", "LANGUAGE": "content_filter"}
_LEVELS = {"minimal": "MINIMAL", "low": "LOW", "medium": "MEDIUM", "high": "HIGH"}
# Gemini signs the thinking behind a function call (``thoughtSignature``) and, for its thinking models, wants the
# signature back with the call in the next turn. A call's id carries it through the client (which returns the id
# with the call, as it must): id, this separator, signature.
SIGNATURE_SEP = "__thought__"


def _parts(content: Any, images: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"text": content}]
    parts = []
    for part in content:
        if part.get("type") == "image":
            url = next(images).url
            if url.startswith("data:"):
                head, _, data = url.partition(",")
                if ";base64" not in head:
                    raise Unsupported("images in data URIs that are not base64", "messages")
                parts.append({"inlineData": {"mimeType": head[5:].split(";")[0], "data": data}})
            else:
                parts.append({"fileData": {"mimeType": "image/*", "fileUri": url}})
        elif part.get("text"):
            parts.append({"text": part["text"]})
    return parts


def contents_out(chat: ChatRequest) -> "tuple[list[dict[str, Any]], dict[str, Any] | None]":
    """(Gemini's contents, its systemInstruction) for the request's messages."""
    images = iter(chat.images)
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        fold_turn(contents, role, parts, "parts")

    for message in chat.messages:
        role = message.get("role")
        if role == "system":
            system += _parts(message.get("content"), images)
        elif role == "assistant":
            parts = _parts(message.get("content"), images)
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                call_id = call.get("id", "")
                call_names[call_id] = function.get("name", "")
                part: dict[str, Any] = {"functionCall": {"name": function.get("name", ""),
                                                         "args": call_arguments(function.get("arguments", "{}"))}}
                if SIGNATURE_SEP in call_id:
                    part["thoughtSignature"] = call_id.split(SIGNATURE_SEP, 1)[1]
                parts.append(part)
            add("model", parts)
        elif role == "tool":
            text = message.get("content")
            text = text if isinstance(text, str) else "".join(p.get("text", "") for p in text or ())
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError:
                value = None
            response = value if isinstance(value, dict) else {"result": text}
            name = call_names.get(message.get("tool_call_id", ""))
            if name is None:
                raise Unsupported("a tool result whose call is not in the conversation (Gemini names the function)",
                                  "messages")
            add("user", [{"functionResponse": {"name": name, "response": response}}])
        else:
            add("user", _parts(message.get("content"), images))
    return contents, {"parts": system} if system else None


def usage_of(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    thoughts = int(raw.get("thoughtsTokenCount") or 0)
    return Usage(prompt_tokens=int(raw.get("promptTokenCount") or 0),
                 completion_tokens=int(raw.get("candidatesTokenCount") or 0) + thoughts,
                 cached_tokens=int(raw.get("cachedContentTokenCount") or 0), reasoning_tokens=thoughts)


def error_of(status: int, headers: "list[tuple[bytes, bytes]]", body: bytes) -> ProviderError:
    """Google's error body: ``{"error": {"code", "message", "status", "details"}}``; a 429's wait is its
    RetryInfo detail's ``retryDelay`` ("30s") when no header says it."""
    message, code, retry = f"the provider answered {status}", None, retry_after_s(headers)
    try:
        error = orjson.loads(body).get("error") or {}
        message = str(error.get("message") or message)
        code = error.get("status")
        for detail in error.get("details") or ():
            delay = detail.get("retryDelay") if isinstance(detail, dict) else None
            if retry is None and isinstance(delay, str) and delay.endswith("s"):
                try:
                    retry = float(delay[:-1])
                except ValueError:
                    pass
    except (orjson.JSONDecodeError, AttributeError):
        message = body[:512].decode("utf-8", "replace").strip() or message
    kind = kind_of_status(status)
    if status == 400 and ("token count" in message and "exceeds" in message or "too long" in message):
        kind = CONTEXT_LENGTH
    return ProviderError(kind, status, message, retry, code)


class _Candidate:
    """What one candidate's parts say: text, reasoning and calls (ids made here when Gemini gives none)."""

    @staticmethod
    def read(candidate: dict[str, Any], calls_so_far: int) -> "list[Delta]":
        deltas: list[Delta] = []
        for part in (candidate.get("content") or {}).get("parts") or ():
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("functionCall"), dict):
                call = part["functionCall"]
                call_id = call.get("id") or new_call_id()
                if isinstance(part.get("thoughtSignature"), str) and part["thoughtSignature"]:
                    call_id += SIGNATURE_SEP + part["thoughtSignature"]
                deltas.append(Call(calls_so_far, call_id, str(call.get("name")),
                                   orjson.dumps(call.get("args") or {}).decode()))
                calls_so_far += 1
            elif isinstance(part.get("text"), str) and part["text"]:
                deltas.append(Reasoning(part["text"]) if part.get("thought") else Content(part["text"]))
        return deltas


class GeminiGenerate(Provider):
    name = "gemini"

    def check(self, chat: ChatRequest, target: Target) -> None:
        refuse(chat, target, "n", "logprobs", "logit_bias")

    def call(self, chat: ChatRequest, target: Target, stream: bool, secret: Any) -> HttpCall:
        sampling = chat.sampling
        contents, system = contents_out(chat)
        body: dict[str, Any] = {"contents": contents}
        if system is not None:
            body["systemInstruction"] = system
        config: dict[str, Any] = {}
        put_sampling(config, sampling, {"temperature": "temperature", "top_p": "topP", "top_k": "topK",
                                        "max_tokens": "maxOutputTokens", "seed": "seed", "stop": "stopSequences",
                                        "frequency_penalty": "frequencyPenalty", "presence_penalty": "presencePenalty"})
        constraint = sampling.constraint
        if constraint is not None and sampling.constraint_field != "tool_choice":
            config["responseMimeType"] = "application/json"
            if constraint.kind == "json_schema":
                config["responseJsonSchema"] = orjson.loads(constraint.spec)
        thinking: dict[str, Any] = {}
        effort = chat.template_kwargs.get("reasoning_effort")
        if chat.reasoning_budget is not None:
            thinking["thinkingBudget"] = chat.reasoning_budget
        elif chat.template_kwargs.get("enable_thinking") is False and effort in (None, "none"):
            thinking["thinkingBudget"] = 0
        elif effort in _LEVELS:
            thinking["thinkingLevel"] = _LEVELS[effort]
        if chat.separate_reasoning and thinking.get("thinkingBudget") != 0:
            thinking["includeThoughts"] = True
        if thinking:
            config["thinkingConfig"] = thinking
        if config:
            body["generationConfig"] = config
        if chat.tools:
            declarations = []
            for tool in chat.tools:
                function = tool.get("function") or {}
                declaration = {"name": function.get("name", "")}
                if function.get("description"):
                    declaration["description"] = function["description"]
                if function.get("parameters"):
                    declaration["parametersJsonSchema"] = function["parameters"]
                declarations.append(declaration)
            body["tools"] = [{"functionDeclarations": declarations}]
            mode = {"auto": "AUTO", "required": "ANY", "none": "NONE", "named": "ANY"}[chat.tool_choice]
            calling: dict[str, Any] = {"mode": mode}
            if chat.tool_choice == "named":
                calling["allowedFunctionNames"] = [chat.tool_name]
            body["toolConfig"] = {"functionCallingConfig": calling}
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        url = f"{target.base_url.rstrip('/')}/v1beta/models/{quote(target.model, safe='')}:{method}"
        headers = [(b"content-type", b"application/json")]
        if secret:
            headers.append((b"x-goog-api-key", secret.encode()))
        headers += [(name.lower().encode(), value.encode()) for name, value in target.headers]
        return HttpCall(b"POST", url, headers, orjson.dumps(body))

    def answer(self, body: bytes) -> ProviderAnswer:
        try:
            data = orjson.loads(body)
            candidate = (data.get("candidates") or [{}])[0]
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            raise ProviderError(SERVER, 502, "the provider's answer is not a generateContent answer") from None
        if not candidate and (data.get("promptFeedback") or {}).get("blockReason"):
            return ProviderAnswer(None, None, [], "content_filter", usage_of(data.get("usageMetadata")))
        deltas = _Candidate.read(candidate, 0)
        texts = [d.text for d in deltas if type(d) is Content]
        thoughts = [d.text for d in deltas if type(d) is Reasoning]
        calls = [d for d in deltas if type(d) is Call]
        finish = "tool_calls" if calls else _FINISH.get(candidate.get("finishReason"), "stop")
        return ProviderAnswer("".join(texts) if texts or not calls else None, "".join(thoughts) if thoughts else None,
                              calls, finish, usage_of(data.get("usageMetadata")))

    def stream(self) -> StreamReader:
        return _GenerateStream()

    def error(self, status: int, headers: "list[tuple[bytes, bytes]]", body: bytes) -> ProviderError:
        return error_of(status, headers, body)


class _GenerateStream(StreamReader):
    def __init__(self) -> None:
        self._events = SseDecoder()
        self._calls = 0
        self._finish: str | None = None
        self._usage = Usage()

    def feed(self, data: bytes) -> "list[Delta]":
        deltas: list[Delta] = []
        for chunk in self._events.objects(data):
            if isinstance(chunk.get("error"), dict):
                raise error_of(int(chunk["error"].get("code") or 500), [], orjson.dumps(chunk))
            if chunk.get("usageMetadata"):
                self._usage = usage_of(chunk["usageMetadata"])
            candidates = chunk.get("candidates") or ()
            if not candidates and (chunk.get("promptFeedback") or {}).get("blockReason"):
                self._finish = "content_filter"
            for candidate in candidates[:1]:
                read = _Candidate.read(candidate, self._calls)
                self._calls += sum(1 for d in read if type(d) is Call)
                deltas += read
                if candidate.get("finishReason"):
                    self._finish = _FINISH.get(candidate["finishReason"], "stop")
        return deltas

    def finish(self) -> StreamEnd:
        if self._finish is None:
            raise ProviderError(SERVER, 502, "the provider's stream ended before its answer did")
        return StreamEnd("tool_calls" if self._calls else self._finish, self._usage)


PROVIDERS.add("gemini", GeminiGenerate(), "Google Gemini's generateContent: an API key, function calling, thinking, "
              "JSON schemas")

"""AWS Bedrock's Converse wire: ``POST {base_url}/model/{modelId}/converse`` (streamed: ``/converse-stream``, AWS's
binary event stream), signed with SigV4 for the ``bedrock`` service by botocore's signer, with credentials from
AWS's standard chain (``credentials.py``: the environment, the shared files, a container's or an instance's role).

From the typed chat request: system messages as ``system``; turns folded to alternate user and assistant; text;
images as ``image`` blocks with their bytes (a data URI's: Bedrock takes no URL); an assistant's tool calls as
``toolUse`` (input parsed), a tool message as a user ``toolResult``; its signed reasoning as ``reasoningContent``;
``maxTokens``, ``temperature``, ``topP`` and ``stopSequences`` in ``inferenceConfig``; tools as ``toolSpec``s and
``tool_choice`` as ``toolChoice`` (required is ``any``; Bedrock has no "none": refused by name); a JSON schema as
``outputConfig.textFormat``; ``top_k`` and a thinking budget (Anthropic's models on Bedrock read them) in
``additionalModelRequestFields``.

Back: text, toolUse and reasoningContent blocks; ``stopReason`` as OpenAI's finish reason (end_turn and
stop_sequence stop, max_tokens length, tool_use tool_calls, guardrail_intervened and content_filtered
content_filter); usage with the cache's reads counted as cached prompt tokens. A stream's events
(messageStart, contentBlockStart/Delta/Stop, messageStop, metadata) arrive as event stream messages
(``eventstream.py``); an exception message (throttlingException, ...) is the provider's error.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import orjson

from ..serving.chat import Call, ChatRequest, Content, Delta, Reasoning, ReasoningSignature, RedactedReasoning
from .base import (CONTEXT_LENGTH, PROVIDERS, RATE_LIMITED, SERVER, TIMEOUT, HttpCall, Provider, ProviderAnswer,
                   ProviderError, StreamEnd, StreamReader, Target, Unsupported, Usage, call_arguments, fold_turn,
                   kind_of_status, put_sampling, refuse, retry_after_s, thinking_blocks_of)
from .eventstream import EventStreamDecoder

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
           "guardrail_intervened": "content_filter", "content_filtered": "content_filter",
           "model_context_window_exceeded": "length"}
_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}
_REGION = re.compile(r"bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")
# Exceptions Bedrock names (x-amzn-ErrorType, or an event stream's :exception-type), by the failure they are.
_EXCEPTIONS = {"throttlingException": RATE_LIMITED, "ThrottlingException": RATE_LIMITED,
               "serviceUnavailableException": SERVER, "ServiceUnavailableException": SERVER,
               "internalServerException": SERVER, "InternalServerException": SERVER,
               "modelStreamErrorException": SERVER, "ModelErrorException": SERVER,
               "ModelTimeoutException": TIMEOUT, "ModelNotReadyException": SERVER}


def region_of(target: Target) -> str:
    region = target.options.get("region")
    if isinstance(region, str) and region:
        return region
    found = _REGION.search(target.base_url)
    if found is None:
        raise Unsupported("a Bedrock target without its region (give region in the models config)", None)
    return found.group(1)


def _content(content: Any, images: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"text": content}]
    blocks = []
    for part in content:
        if part.get("type") == "image":
            url = next(images).url
            head, _, data = url.partition(",")
            media_type = head[5:].split(";")[0] if url.startswith("data:") else ""
            if media_type not in _FORMATS or ";base64" not in head:
                raise Unsupported("images by URL or of types other than png, jpeg, gif and webp (Bedrock takes an "
                                  "image's bytes)", "messages")
            blocks.append({"image": {"format": _FORMATS[media_type], "source": {"bytes": data}}})
        elif part.get("text"):
            blocks.append({"text": part["text"]})
    return blocks


def messages_out(chat: ChatRequest) -> "tuple[list[dict[str, Any]], list[dict[str, Any]]]":
    """(Bedrock's messages, its system blocks) for the request's messages."""
    images = iter(chat.images)
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for message in chat.messages:
        role = message.get("role")
        if role == "system":
            system += _content(message.get("content"), images)
        elif role == "tool":
            text = message.get("content")
            text = text if isinstance(text, str) else "".join(p.get("text", "") for p in text or ())
            fold_turn(out, "user", [{"toolResult": {"toolUseId": message.get("tool_call_id", ""),
                                                    "content": [{"text": text}], "status": "success"}}], "content")
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.get("thinking_blocks"):  # block by block, as the answer gave them (Anthropic's form)
                blocks += _reasoning_blocks(message["thinking_blocks"])
            elif message.get("reasoning_content") and message.get("reasoning_signature"):
                blocks.append({"reasoningContent": {"reasoningText": {"text": message["reasoning_content"],
                                                                      "signature": message["reasoning_signature"]}}})
            blocks += _content(message.get("content"), images)
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                blocks.append({"toolUse": {"toolUseId": call.get("id", ""), "name": function.get("name", ""),
                                           "input": call_arguments(function.get("arguments", "{}"))}})
            fold_turn(out, "assistant", blocks, "content")
        else:
            fold_turn(out, "user", _content(message.get("content"), images), "content")
    return out, system


def usage_of(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    read = int(raw.get("cacheReadInputTokens") or 0)
    written = int(raw.get("cacheWriteInputTokens") or 0)
    return Usage(prompt_tokens=int(raw.get("inputTokens") or 0) + read + written,
                 completion_tokens=int(raw.get("outputTokens") or 0), cached_tokens=read, cache_write_tokens=written)


def error_of(status: int, headers: "list[tuple[bytes, bytes]]", body: bytes, exception: str | None = None
             ) -> ProviderError:
    """Bedrock's error: ``{"message"}`` with the exception's name in ``x-amzn-ErrorType`` (an event stream's
    ``:exception-type``)."""
    if exception is None:
        for name, value in headers:
            if name == b"x-amzn-errortype":
                exception = value.decode("latin-1").split(":")[0]
    try:
        value = orjson.loads(body)
        message = str(value.get("message") or value.get("Message") or f"the provider answered {status}")
    except (orjson.JSONDecodeError, AttributeError):
        message = body[:512].decode("utf-8", "replace").strip() or f"the provider answered {status}"
    kind = _EXCEPTIONS.get(exception or "", kind_of_status(status))
    if exception in ("ValidationException", "validationException") and re.search(r"too long|too many tokens|"
                                                                                   r"context", message, re.I):
        kind = CONTEXT_LENGTH
    return ProviderError(kind, status, message, retry_after_s(headers), exception)


def _reasoning_blocks(blocks: Any) -> "list[dict[str, Any]]":
    """A turn's ``thinking_blocks`` (base.thinking_blocks_of) as Converse's reasoningContent blocks."""
    return [{"reasoningContent": {"reasoningText": {"text": block["thinking"], "signature": block["signature"]}}}
            if block["type"] == "thinking" else {"reasoningContent": {"redactedContent": block["data"]}}
            for block in thinking_blocks_of(blocks)]


def _blocks(blocks: Any) -> "tuple[list[str], list[str], list[Call], str | None, list[dict[str, Any]]]":
    """An answer's texts, reasoning texts, calls, the reasoning's signature (the last one given) and its reasoning
    blocks in Anthropic's form (serving.chat.ThinkingBlock)."""
    texts, thinking, calls = [], [], []
    signature = None
    reasoning_blocks: list[dict[str, Any]] = []
    for block in blocks or ():
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            calls.append(Call(len(calls), str(use.get("toolUseId")), str(use.get("name")),
                              orjson.dumps(use.get("input") or {}).decode()))
        elif isinstance(block.get("reasoningContent"), dict):
            content = block["reasoningContent"]
            if isinstance(content.get("redactedContent"), str):  # (a blob: base64 in the JSON protocol)
                reasoning_blocks.append({"type": "redacted_thinking", "data": content["redactedContent"]})
                continue
            reasoning = content.get("reasoningText") or {}
            block_signature = reasoning.get("signature") if isinstance(reasoning.get("signature"), str) else ""
            if block_signature:
                signature = block_signature
            if isinstance(reasoning.get("text"), str):
                thinking.append(reasoning["text"])
                reasoning_blocks.append({"type": "thinking", "thinking": reasoning["text"],
                                         "signature": block_signature})
    return texts, thinking, calls, signature, reasoning_blocks


class BedrockConverse(Provider):
    name = "bedrock"

    def check(self, chat: ChatRequest, target: Target) -> None:
        refuse(chat, target, "n", "logprobs", "seed", "frequency_penalty", "presence_penalty", "logit_bias",
               "json_object")
        if chat.tools and chat.tool_choice == "none":
            raise Unsupported("tool_choice none (Bedrock has no way to offer tools and forbid them)", "tool_choice")
        region_of(target)

    def call(self, chat: ChatRequest, target: Target, stream: bool, secret: Any) -> HttpCall:
        sampling = chat.sampling
        messages, system = messages_out(chat)
        body: dict[str, Any] = {"messages": messages}
        if system:
            body["system"] = system
        inference: dict[str, Any] = {}
        put_sampling(inference, sampling, {"max_tokens": "maxTokens", "temperature": "temperature", "top_p": "topP",
                                           "stop": "stopSequences"})
        if inference:
            body["inferenceConfig"] = inference
        extra: dict[str, Any] = {}
        if sampling.top_k is not None:
            extra["top_k"] = sampling.top_k
        if chat.reasoning_budget is not None:
            extra["thinking"] = {"type": "enabled", "budget_tokens": chat.reasoning_budget}
        if extra:
            body["additionalModelRequestFields"] = extra
        if chat.tools:
            specs = []
            for tool in chat.tools:
                function = tool.get("function") or {}
                spec: dict[str, Any] = {"name": function.get("name", ""),
                                        "inputSchema": {"json": function.get("parameters") or {"type": "object"}}}
                if function.get("description"):
                    spec["description"] = function["description"]
                specs.append({"toolSpec": spec})
            choice = {"auto": {"auto": {}}, "required": {"any": {}}}.get(chat.tool_choice) or \
                {"tool": {"name": chat.tool_name}}
            body["toolConfig"] = {"tools": specs, "toolChoice": choice}
        constraint = sampling.constraint
        if constraint is not None and sampling.constraint_field != "tool_choice":
            body["outputConfig"] = {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
                "schema": constraint.spec, "name": constraint.name or "response"}}}}
        url = f"{target.base_url.rstrip('/')}/model/{quote(target.model, safe='')}/" + \
            ("converse-stream" if stream else "converse")
        data = orjson.dumps(body)
        headers = {"content-type": "application/json",
                   "accept": "application/vnd.amazon.eventstream" if stream else "application/json"}
        headers.update((name.lower(), value) for name, value in target.headers)
        return HttpCall(b"POST", url, sign(url, data, headers, secret, region_of(target)), data)

    def answer(self, body: bytes) -> ProviderAnswer:
        try:
            data = orjson.loads(body)
            message = data["output"]["message"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ProviderError(SERVER, 502, "the provider's answer is not a Converse answer") from None
        texts, thinking, calls, signature, reasoning_blocks = _blocks(message.get("content"))
        return ProviderAnswer("".join(texts) if texts or not calls else None, "".join(thinking) if thinking else None,
                              calls, _FINISH.get(data.get("stopReason"), "stop"), usage_of(data.get("usage")),
                              reasoning_signature=signature, thinking_blocks=tuple(reasoning_blocks) or None)

    def stream(self) -> StreamReader:
        return _ConverseStream()

    def error(self, status: int, headers: "list[tuple[bytes, bytes]]", body: bytes) -> ProviderError:
        return error_of(status, headers, body)


def sign(url: str, body: bytes, headers: "dict[str, str]", credentials: Any, region: str
         ) -> "list[tuple[bytes, bytes]]":
    """``headers`` with SigV4's (Authorization, X-Amz-Date, X-Amz-Security-Token for temporary credentials), signed
    by botocore for the ``bedrock`` service in ``region``."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method="POST", url=url, data=body, headers=headers)
    SigV4Auth(credentials, "bedrock", region).add_auth(request)
    return [(name.lower().encode("latin-1"), str(value).encode("latin-1")) for name, value in request.headers.items()]


class _ConverseStream(StreamReader):
    def __init__(self) -> None:
        self._messages = EventStreamDecoder()
        self._tools: dict[int, dict[str, Any]] = {}  # open toolUse blocks by index: id, name, input pieces
        self._calls = 0
        self._finish: str | None = None
        self._usage = Usage()
        self._thinking: list[str] = []  # the reasoning block's text so far (its signature carries it whole)

    def feed(self, data: bytes) -> "list[Delta]":
        deltas: list[Delta] = []
        for headers, payload in self._messages.feed(data):
            if headers.get(":message-type") == "exception":
                exception = str(headers.get(":exception-type") or "")
                raise error_of(429 if exception == "throttlingException" else 500, [], payload, exception)
            try:
                event = orjson.loads(payload) if payload else {}
            except orjson.JSONDecodeError:
                raise ProviderError(SERVER, 502, "the provider streamed an event that is not JSON") from None
            kind = headers.get(":event-type")
            if kind == "contentBlockDelta":
                delta = event.get("delta") or {}
                if isinstance(delta.get("text"), str) and delta["text"]:
                    deltas.append(Content(delta["text"]))
                elif isinstance(delta.get("toolUse"), dict):
                    block = self._tools.get(event.get("contentBlockIndex"))
                    if block is not None:
                        block["input"].append(delta["toolUse"].get("input", ""))
                elif isinstance(delta.get("reasoningContent"), dict):
                    reasoning = delta["reasoningContent"]
                    if isinstance(reasoning.get("text"), str) and reasoning["text"]:
                        deltas.append(Reasoning(reasoning["text"]))
                        self._thinking.append(reasoning["text"])
                    if isinstance(reasoning.get("signature"), str) and reasoning["signature"]:
                        deltas.append(ReasoningSignature(reasoning["signature"], "".join(self._thinking)))
                        self._thinking.clear()
                    if isinstance(reasoning.get("redactedContent"), str) and reasoning["redactedContent"]:
                        deltas.append(RedactedReasoning(reasoning["redactedContent"]))
            elif kind == "contentBlockStart":
                use = (event.get("start") or {}).get("toolUse")
                if isinstance(use, dict):
                    self._tools[event.get("contentBlockIndex")] = {"id": str(use.get("toolUseId")),
                                                                   "name": str(use.get("name")), "input": []}
            elif kind == "contentBlockStop":
                block = self._tools.pop(event.get("contentBlockIndex"), None)
                if block is not None:
                    deltas.append(Call(self._calls, block["id"], block["name"], "".join(block["input"]) or "{}"))
                    self._calls += 1
            elif kind == "messageStop":
                self._finish = _FINISH.get(event.get("stopReason"), "stop")
            elif kind == "metadata":
                self._usage = usage_of(event.get("usage"))
        return deltas

    def finish(self) -> StreamEnd:
        if self._finish is None or self._messages.pending:
            raise ProviderError(SERVER, 502, "the provider's stream ended before its answer did")
        return StreamEnd(self._finish, self._usage)


PROVIDERS.add("bedrock", BedrockConverse(), "AWS Bedrock's Converse API: SigV4 with AWS's credential chain, tool use, "
              "reasoning, its binary event stream")

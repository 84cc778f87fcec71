"""POST /v1/chat/completions and POST /v1/completions: OpenAI's bodies in, OpenAI's shapes out.

The body is read by ``protocol.parse_chat`` / ``parse_completion``; the rest is the pipeline's
(``pipeline.py``: model, template and tokens, plan, admission, run). What is this module's own is
the shape of the answer (``OpenAIShape``): ``chat.completion`` / ``text_completion`` bodies and
their chunks, n answers by index, usage, logprobs. Models served only by OpenAI-compatible HTTP
workers are proxied untouched.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import orjson

from ..serving.generation import GenerationPlan, GenerationResult
from ..routing.policies import RoutingRequest
from ..tokenizer.service import TokenizerService
from .chat_output import ChatOutput
from ..serving.chat import (Call, ChatAnswer, Content, Delta, Reasoning, ReasoningSignature, RedactedReasoning,
                            plain_answer)
from .errors import ApiError, BadRequest
from .http import SSE_DONE, Request, sse_event
from .logprobs import LogprobShape
from .pipeline import (admitted, answer_chat, check_media_kwargs_trusted, check_prompt_ids, encode_chat, encode_text,
                       logprob_shape, logprob_shapes, openai_error_event, plan_generation, ready_model_entry,
                       run_streamed_choices, run_unary_choices, with_media)
from .protocol import parse_chat, parse_completion, parse_json_body
from .routed import answer_provider, answer_routed, route_of
from .state import GatewayState


def usage_body(result: GenerationResult, reasoning_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; a chat answer's carries ``completion_tokens_details`` (its reasoning tokens, 0 without a
    reasoning parser), whatever n and whatever parsers: clients read it without checking it is there."""
    usage = {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage


def summed_usage(answers: "list[ChatAnswer]", chat: bool) -> dict[str, Any]:
    """The usage of n answers: the prompt once, every answer's completion and reasoning tokens."""
    results = [answer.result for answer in answers]
    total = dataclasses.replace(results[0], completion_tokens=sum(r.completion_tokens for r in results))
    return usage_body(total, sum(answer.reasoning_tokens for answer in answers) if chat else None)


class OpenAIShape:
    """One answer (one index of n) as OpenAI's chat or text completion: the ``ChatRenderer`` of both APIs
    (completions never parse, so only chat's answers come as deltas)."""

    done = SSE_DONE

    def __init__(self, chat: bool, response_id: str, model: str, include_usage: bool = False, index: int = 0,
                 logprobs: LogprobShape | None = None, prefix_text: str = "", echo: bool = False,
                 created: int | None = None) -> None:
        self.chat = chat
        self.api = "chat" if chat else "completions"  # (a provider of chat's wire relays its own answer to chat)
        self.id = response_id
        self.model = model
        self.created = int(time.time()) if created is None else created
        self.include_usage = include_usage
        self.index = index
        self.logprobs = logprobs
        self.prefix_text = prefix_text  # completions with echo: the prompt, before the first text
        self.echo = echo  # completions: the prompt's logprobs come first
        self.object = "chat.completion.chunk" if chat else "text_completion"
        # Every content chunk after the first is the same JSON but for its text: rendered once (at the
        # second chunk: an answer not streamed never needs it), the text is spliced in (orjson of one string
        # instead of a five-level dict per chunk).
        self._chunk_head: bytes | None = None
        self._chunk_tail = b""

    # -- a chat provider's own answer (providers.Passed, ProviderAnswer.passed) --

    def passed(self, delta: Any) -> bytes:
        """A chat provider's own chunks (``providers.Passed``, for this chat answer) with this answer's id in place of
        the provider's: ``"id":`` followed by that string can only be a member's name and value (inside a JSON
        string its quotes would be escaped), so the replacement touches nothing else."""
        theirs = delta.answer_id
        if theirs is None:
            return delta.events
        ours = orjson.dumps(self.id)
        return delta.events.replace(b'"id":' + theirs, b'"id":' + ours).replace(b'"id": ' + theirs, b'"id": ' + ours)

    def passed_whole(self, body: "dict[str, Any]") -> "dict[str, Any]":
        """A chat provider's own answer, with this answer's id."""
        body["id"] = self.id
        return body

    # -- whole --

    def whole(self, answer: ChatAnswer) -> dict[str, Any]:
        return self.body([self.choice(answer)], usage_body(answer.result, answer.reasoning_tokens if self.chat
                                                             else None))

    def body(self, choices: "list[dict[str, Any]]", usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": usage}

    def choice(self, answer: ChatAnswer) -> dict[str, Any]:
        logprobs = self.logprobs.whole(self.echo) if self.logprobs is not None else None
        if not self.chat:
            return {"index": self.index, "text": self.prefix_text + (answer.content or ""), "logprobs": logprobs,
                    "finish_reason": answer.finish_reason}
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.separates_reasoning:
            message["reasoning_content"] = answer.reasoning
        if answer.reasoning_signature is not None:  # a provider's (Anthropic's, Bedrock's): sent back with it
            message["reasoning_signature"] = answer.reasoning_signature
        if answer.thinking_blocks is not None:  # the same block by block, redacted ones too (LiteLLM's field)
            message["thinking_blocks"] = list(answer.thinking_blocks)
        if answer.calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in answer.calls]
        return {"index": self.index, "message": message, "logprobs": logprobs, "finish_reason": answer.finish_reason}

    # -- streamed --

    def text_event(self, text: str, first: bool) -> bytes:
        if self.logprobs is None:
            if not first:
                head = self._chunk_head
                if head is None:
                    marker = "\x00text\x00"
                    head, self._chunk_tail = sse_event(self.chunk(marker, None)).split(orjson.dumps(marker))
                    self._chunk_head = head
                return head + orjson.dumps(text) + self._chunk_tail
            return sse_event(self.chunk(self.prefix_text + text, None, first=True))
        # A stream whose chunks carry the logprobs of the tokens since the last one: not spliced.
        chunk = self.chunk(self.prefix_text + text if first else text, None, first=first)
        chunk["choices"][0]["logprobs"] = self.logprobs.unsent(self.echo and first)
        return sse_event(chunk)

    def delta_events(self, deltas: "list[Delta]", first: bool) -> bytes:
        chat_deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}] if first else []
        for delta in deltas:
            kind = type(delta)
            if kind is Content:
                chat_deltas.append({"content": delta.text})
            elif kind is Reasoning:
                chat_deltas.append({"reasoning_content": delta.text})
            elif kind is ReasoningSignature:  # its block ends: the block whole, as a whole answer lists it
                chat_deltas.append({"reasoning_signature": delta.signature})
                chat_deltas.append({"thinking_blocks": [{"type": "thinking", "thinking": delta.thinking,
                                                         "signature": delta.signature}]})
            elif kind is RedactedReasoning:
                chat_deltas.append({"thinking_blocks": [{"type": "redacted_thinking", "data": delta.data}]})
            elif kind is Call:  # sent once whole, as two deltas: index, id, type and name first, then arguments
                chat_deltas.append({"tool_calls": [{"index": delta.index, "id": delta.id, "type": "function",
                                                    "function": {"name": delta.name, "arguments": ""}}]})
                chat_deltas.append({"tool_calls": [{"index": delta.index,
                                                    "function": {"arguments": delta.arguments}}]})
        chunks = [self.delta_chunk(delta) for delta in chat_deltas]
        if chunks and self.logprobs is not None:  # the tokens since the last chunk, with the last of these
            chunks[-1]["choices"][0]["logprobs"] = self.logprobs.unsent()
        return b"".join([sse_event(chunk) for chunk in chunks])

    def final_events(self, deltas: "list[Delta]", answer: ChatAnswer) -> bytes:
        out = self.delta_events(deltas, False) if deltas else b""
        finish = self.chunk(None, answer.finish_reason)
        if self.logprobs is not None:
            finish["choices"][0]["logprobs"] = self.logprobs.unsent()
        out += sse_event(finish)
        if not self.include_usage:
            return out
        return out + sse_event(self.usage_chunk(usage_body(answer.result, answer.reasoning_tokens if self.chat
                                                           else None)))

    def error_event(self, error: ApiError) -> bytes:
        return openai_error_event(error)

    def chunk(self, text: str | None, finish_reason: str | None, first: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if first else (
                {"content": text} if text is not None else {})
            choice = {"index": self.index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": self.index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice]}

    def delta_chunk(self, delta: dict[str, Any]) -> dict[str, Any]:
        """A chat chunk carrying ``delta`` as it is (reasoning, tool calls)."""
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": self.index, "delta": delta, "logprobs": None, "finish_reason": None}]}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model, "choices": [],
                "usage": usage}


async def _respond_choices(state: GatewayState, request: Request, plan: GenerationPlan, tokenizer: TokenizerService,
                           shapes: "list[OpenAIShape]", outputs: "list[ChatOutput | None]",
                           include_usage: bool) -> None:
    """n > 1 answers of the engine's n: ``choices`` by index, usage summed; each answer through its own parsers
    (``outputs``), logprobs and shape."""
    chat = shapes[0].chat
    async with admitted(state, request, plan):
        if not plan.stream:
            results = await run_unary_choices(state, request, plan, tokenizer)
            if results is None:
                return
            answers = [output.whole(result) if output is not None else plain_answer(result)
                       for result, output in zip(results, outputs)]
            await request.send_json(200, shapes[0].body([shape.choice(answer) for shape, answer in zip(shapes, answers)],
                                                        summed_usage(answers, chat)))
            return

        def text_event(index: int, text: str, first: bool) -> bytes:
            output = outputs[index]
            if output is None:
                return shapes[index].text_event(text, first)
            return shapes[index].delta_events(output.feed(text), first)

        def final_events(results: "list[GenerationResult]") -> bytes:
            out, answers = b"", []
            for shape, result, output in zip(shapes, results, outputs):
                if output is None:
                    answer = plain_answer(result)
                    out += shape.final_events([], answer)
                else:
                    deltas = output.finish()
                    answer = output.streamed_answer(result)
                    out += shape.final_events(deltas, answer)
                answers.append(answer)
            if not include_usage:
                return out
            return out + sse_event(shapes[0].usage_chunk(summed_usage(answers, chat)))

        await run_streamed_choices(state, request, plan, tokenizer, text_event, final_events)


async def chat_completions(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    body = parse_json_body(raw)
    chat = parse_chat(body)
    route = route_of(state, chat.model, request)
    if route is None:
        await _chat_on_pool(state, request, raw, chat)
        return
    response_id = "chatcmpl-" + request.request_id

    async def on_pool(model: str) -> None:
        same = model == chat.model
        await _chat_on_pool(state, request, raw if same else orjson.dumps({**body, "model": model}),
                            chat if same else dataclasses.replace(chat, model=model))

    await answer_routed(state, request, route, on_pool, lambda target: answer_provider(
        state, request, chat, target, route.name, OpenAIShape(True, response_id, target.model, chat.include_usage)),
        len(raw))


async def _chat_on_pool(state: GatewayState, request: Request, raw: bytes, chat: Any) -> None:
    """A chat request answered by the fleet's workers serving ``chat.model`` (an HTTP worker's, relayed)."""
    entry = await ready_model_entry(state, chat.model, request.principal)
    if entry.tokenizer is None:
        await state.proxy.forward(request, raw, entry.name, "/v1/chat/completions", chat.stream,
                                  RoutingRequest(text=_routing_text(chat.messages),
                                                 routing_key=request.header(state.config.routing_key_header)))
        return
    tokenizer = entry.tokenizer
    if tokenizer.chat_template is None:
        raise BadRequest(f"the model '{entry.name}' has no chat template; use /v1/completions or pass "
                         f"--chat-template", code="no_chat_template")
    loading = check_media_kwargs_trusted(state, chat) if chat.media_kwargs or chat.media_io_kwargs else None
    input_ids = await encode_chat(state, request, entry, tokenizer, chat, True, raw)
    media = routing_ids = None
    if chat.images or chat.videos:
        input_ids, media, routing_ids = await with_media(state, entry, chat, input_ids, request.tenant_key, loading)
    plan = plan_generation(state, request, entry, input_ids, chat.sampling, chat.stream, "messages", media,
                           routing_ids)
    response_id = "chatcmpl-" + request.request_id
    output = ChatOutput.for_request(entry, chat)
    if output is not None:
        plan.kept_special = output.kept_special
    n = chat.sampling.n
    if n > 1:
        logprobs = logprob_shapes(plan, tokenizer, True)
        created = int(time.time())
        shapes = [OpenAIShape(True, response_id, entry.name, index=i, created=created,
                              logprobs=logprobs[i] if logprobs is not None else None) for i in range(n)]
        outputs = [output] + [ChatOutput.for_request(entry, chat) for _ in range(n - 1)]
        await _respond_choices(state, request, plan, tokenizer, shapes, outputs, chat.include_usage)
        return
    shape = OpenAIShape(True, response_id, entry.name, chat.include_usage,
                        logprobs=logprob_shape(plan, tokenizer, True))
    await answer_chat(state, request, plan, tokenizer, output, shape)


async def completions(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    comp = parse_completion(parse_json_body(raw))
    entry = await ready_model_entry(state, comp.model, request.principal)
    if entry.tokenizer is None:
        await state.proxy.forward(request, raw, entry.name, "/v1/completions", comp.stream,
                                  RoutingRequest(text=comp.prompt_text or "",
                                                 routing_key=request.header(state.config.routing_key_header)))
        return
    tokenizer = entry.tokenizer
    if comp.prompt_ids is not None:
        check_prompt_ids(comp.prompt_ids, entry)
        input_ids = list(comp.prompt_ids)
        prompt_text = tokenizer.decode(input_ids, skip_special_tokens=False) if comp.echo else ""
    else:
        input_ids = await encode_text(entry, tokenizer, comp.prompt_text, "prompt")
        prompt_text = comp.prompt_text
    plan = plan_generation(state, request, entry, input_ids, comp.sampling, comp.stream, "prompt")
    response_id = "cmpl-" + request.request_id
    prefix_text = prompt_text if comp.echo else ""
    n = comp.sampling.n
    if n > 1:
        logprobs = logprob_shapes(plan, tokenizer, False)
        created = int(time.time())
        shapes = [OpenAIShape(False, response_id, entry.name, index=i, created=created, prefix_text=prefix_text,
                              echo=comp.echo, logprobs=logprobs[i] if logprobs is not None else None)
                  for i in range(n)]
        await _respond_choices(state, request, plan, tokenizer, shapes, [None] * n, comp.include_usage)
        return
    shape = OpenAIShape(False, response_id, entry.name, comp.include_usage, prefix_text=prefix_text, echo=comp.echo,
                        logprobs=logprob_shape(plan, tokenizer, False))
    await answer_chat(state, request, plan, tokenizer, None, shape)


def _routing_text(messages: "list[dict[str, Any]]") -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)

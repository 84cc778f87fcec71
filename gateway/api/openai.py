"""POST /v1/chat/completions and POST /v1/completions.

Chat: render the template, tokenize (through the caches), check the context,
generate on a gRPC engine, answer in OpenAI's shape, streamed or not. Models
served only by OpenAI-compatible HTTP workers are proxied untouched.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import orjson
import trio

from ..auth import Authenticator, Principal
from ..generation import (AnswerTooLarge, GenerationPlan, GenerationResult, LogprobRecord, UsageTally,
                          answer_bytes_estimate)
from ..models import ModelEntry
from ..routing.policies import RoutingRequest
from ..tokenizer.chat_template import TemplateError
from ..tokenizer.service import TokenizerService
from .chat_output import ChatOutput
from .errors import BadRequest, ContextLengthExceeded, Forbidden, NotFound, Unavailable
from .http import Request, sse_event
from .logprobs import LogprobShape
from .protocol import ChatRequest, SamplingRequest, parse_chat, parse_completion, parse_json_body
from .respond import admitted, run_streamed, run_streamed_choices, run_unary, run_unary_choices
from .state import GatewayState


def model_entry(state: GatewayState, model: str | None, principal: Principal) -> ModelEntry:
    if model is None:
        names = state.catalog.names()
        if len(names) == 1:
            model = names[0]
        else:
            raise BadRequest("'model' is required when the node serves several models", param="model")
    entry = state.catalog.get(model)
    if entry is None:
        if state.unreachable_engines:
            # An engine configured at start has not answered yet: the model may be its own. 503 says when to
            # come back (a 404 told a new user the model does not exist while the engine was starting).
            engines = ", ".join(sorted(state.unreachable_engines))
            raise Unavailable(f"The model '{model}' is not served yet: the configured engine(s) {engines} do not "
                              "answer; retry when they do", code="engine_unreachable", retry_after_s=5)
        raise NotFound(f"The model '{model}' does not exist", param="model", code="model_not_found")
    if principal.models is not None:
        Authenticator.check_model(principal, entry.name)
    return entry


# How long a request waits for its model's tokenizer when a gRPC engine just registered.
TOKENIZER_WAIT_S = 30.0


async def ready_model_entry(state: GatewayState, model: str | None, principal: Principal) -> ModelEntry:
    """The model's entry (if the caller may use it), once the tokenizer it needs (if any) is loaded."""
    entry = model_entry(state, model, principal)
    if entry.tokenizer is None and entry.tokenizer_wanted:
        with trio.move_on_after(TOKENIZER_WAIT_S):
            await entry.tokenizer_loaded.wait()
        if entry.tokenizer is None:
            raise Unavailable(f"the tokenizer of model '{entry.name}' is still loading", code="tokenizer_loading",
                              retry_after_s=1)
    return entry


def plan_generation(state: GatewayState, request: Request, entry: ModelEntry, input_ids: list[int],
                    sampling: SamplingRequest, stream: bool, prompt_param: str) -> GenerationPlan:
    """Check the prompt against the context and turn request fields into engine options."""
    n = len(input_ids)
    context = entry.max_context_tokens
    max_tokens = sampling.max_tokens
    if context:
        if n >= context:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {context} tokens. However, your prompt has {n} tokens. "
                f"Please reduce the length of the prompt.", param=prompt_param)
        if max_tokens is not None and n + max_tokens > context:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{n + max_tokens} tokens ({n} in the prompt, {max_tokens} for the completion). Please reduce the "
                f"length of the prompt or the completion.", param="max_tokens")
        if max_tokens is None:
            max_tokens = context - n
    if max_tokens is None:
        max_tokens = state.config.default_max_tokens
    if sampling.min_tokens > max_tokens:
        raise BadRequest("'min_tokens' must not exceed the maximum number of tokens", param="min_tokens")
    if sampling.logit_bias and entry.tokenizer is not None:
        check_vocab([token_id for token_id, _ in sampling.logit_bias], entry.tokenizer, "logit_bias")
    if sampling.stop_token_ids and entry.tokenizer is not None:
        check_vocab(sampling.stop_token_ids, entry.tokenizer, "stop_token_ids")
    answer_bytes_max = 0 if stream else state.config.answer_bytes_max
    # Asked for outright (n, max_tokens and top_logprobs all given), an answer that cannot fit is refused now;
    # one bounded only by the context is stopped if it really grows past the bound (AnswerTooLarge).
    if answer_bytes_max and sampling.max_tokens is not None and \
            answer_bytes_estimate(sampling.n, max_tokens, sampling.logprobs) > answer_bytes_max:
        raise AnswerTooLarge(answer_bytes_max)
    return GenerationPlan(
        request_id=state.new_engine_request_id(),
        model=entry.name,
        input_ids=input_ids,
        sampling=state.engine_sampling(sampling, max_tokens),
        stop=sampling.stop,
        include_stop_str=sampling.include_stop_str_in_output,
        skip_special_tokens=sampling.skip_special_tokens,
        stream=stream,
        routing=RoutingRequest(input_ids=input_ids, routing_key=request.header(state.config.routing_key_header)),
        timeout_s=state.config.admission.request_timeout_s,
        usage=UsageTally(prompt_tokens=n),
        answer_bytes_max=answer_bytes_max,
    )


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


def choices_usage(results: "list[GenerationResult]", outputs: "list[ChatOutput | None]", chat: bool
                  ) -> dict[str, Any]:
    """The usage of n answers: the prompt once, every answer's completion and reasoning tokens."""
    reasoning = sum(o.reasoning_tokens(r) for r, o in zip(results, outputs) if o is not None) if chat else None
    return usage_body(summed_usage(results), reasoning)


class _OpenAIShape:
    """The differences between chat and text completions, in one place."""

    def __init__(self, chat: bool, response_id: str, model: str) -> None:
        self.chat = chat
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        # Every content chunk after the first is the same JSON but for its text: rendered once, the text
        # is spliced in (orjson of one string instead of a five-level dict per chunk).
        marker = "\x00text\x00"
        head, tail = sse_event(self.chunk(marker, None)).split(orjson.dumps(marker))
        self._chunk_head, self._chunk_tail = head, tail

    def text_chunk_event(self, text: str) -> bytes:
        """The SSE event of a content chunk after the first: identical to sse_event(self.chunk(text, None))."""
        return self._chunk_head + orjson.dumps(text) + self._chunk_tail

    def full(self, text: str, result: GenerationResult) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": result.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": result.finish_reason}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice],
                "usage": usage_body(result, 0 if self.chat else None)}

    def chunk(self, text: str | None, finish_reason: str | None, first: bool = False, index: int = 0
              ) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if first else (
                {"content": text} if text is not None else {})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}

    def delta_chunk(self, delta: dict[str, Any], index: int = 0) -> dict[str, Any]:
        """A chat chunk carrying ``delta`` as it is (reasoning, tool calls: ``chat_output.py``)."""
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]}

    def usage_chunk(self, result: GenerationResult) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [],
                "usage": usage_body(result, 0 if self.chat else None)}


def logprob_shape(plan: GenerationPlan, tokenizer: TokenizerService, chat: bool) -> LogprobShape | None:
    """When the request asks for logprobs: the record the generation fills, and its OpenAI shape."""
    if plan.sampling.logprobs is None:
        return None
    plan.logprobs = LogprobRecord(keep=not plan.stream)
    return LogprobShape(plan.logprobs, tokenizer, chat, plan.sampling.logprobs, plan.skip_special_tokens)


def logprob_shapes(plan: GenerationPlan, tokenizer: TokenizerService, chat: bool) -> "list[LogprobShape] | None":
    """``logprob_shape`` for each of n > 1 answers."""
    if plan.sampling.logprobs is None:
        return None
    plan.choice_logprobs = [LogprobRecord(keep=not plan.stream) for _ in range(plan.sampling.n)]
    return [LogprobShape(record, tokenizer, chat, plan.sampling.logprobs, plan.skip_special_tokens)
            for record in plan.choice_logprobs]


def summed_usage(results: "list[GenerationResult]") -> GenerationResult:
    """One result whose usage is the answers': the prompt once, every answer's completion tokens."""
    return dataclasses.replace(results[0], completion_tokens=sum(r.completion_tokens for r in results))


async def _respond_choices(state: GatewayState, request: Request, plan: GenerationPlan, tokenizer: TokenizerService,
                           shape: _OpenAIShape, include_usage: bool, outputs: "list[ChatOutput | None]",
                           prefix_text: str = "", echo: bool = False) -> None:
    """``_respond`` for n > 1 answers of the engine's n: ``choices`` by index, usage summed; each answer
    through its own parsers (``outputs``) and logprobs."""
    logprobs = logprob_shapes(plan, tokenizer, shape.chat)
    async with admitted(state, request, plan):
        if not plan.stream:
            results = await run_unary_choices(state, request, plan, tokenizer)
            if results is None:
                return
            choices = []
            for i, (result, output) in enumerate(zip(results, outputs)):
                body = output.full(result.text, result) if output is not None else \
                    shape.full(prefix_text + result.text, result)
                choice = body["choices"][0]
                choice["index"] = i
                if logprobs is not None:
                    choice["logprobs"] = logprobs[i].whole(echo)
                choices.append(choice)
            body["choices"] = choices
            body["usage"] = choices_usage(results, outputs, shape.chat)
            await request.send_json(200, body)
            return
        for i, output in enumerate(outputs):
            if output is not None:
                output.index = i
                output.logprobs = logprobs[i] if logprobs is not None else None

        def text_event(index: int, text: str, first: bool) -> bytes:
            output = outputs[index]
            if output is not None:
                return output.text_event(text, first)
            chunk = shape.chunk(prefix_text + text if first else text, None, first=first, index=index)
            if logprobs is not None:
                chunk["choices"][0]["logprobs"] = logprobs[index].unsent(echo and first)
            return sse_event(chunk)

        def final_events(results: "list[GenerationResult]") -> bytes:
            out = b""
            for i, (result, output) in enumerate(zip(results, outputs)):
                if output is not None:
                    out += output.final_events(result, include_usage=False)
                    continue
                chunk = shape.chunk(None, result.finish_reason, index=i)
                if logprobs is not None:
                    chunk["choices"][0]["logprobs"] = logprobs[i].unsent()
                out += sse_event(chunk)
            if not include_usage:
                return out
            chunk = shape.usage_chunk(summed_usage(results))
            chunk["usage"] = choices_usage(results, outputs, shape.chat)
            return out + sse_event(chunk)

        await run_streamed_choices(state, request, plan, tokenizer, text_event, final_events)


async def _respond(state: GatewayState, request: Request, plan: GenerationPlan, tokenizer: TokenizerService,
                   shape: _OpenAIShape, include_usage: bool, prefix_text: str = "",
                   output: ChatOutput | None = None, logprobs: LogprobShape | None = None,
                   echo: bool = False) -> None:
    """Run the generation and answer: one JSON body, or SSE events as text is decided; through the
    model's parsers when ``output`` is given; with each token's log probabilities when ``logprobs`` is."""
    async with admitted(state, request, plan):
        if not plan.stream:
            result = await run_unary(state, request, plan, tokenizer)
            if result is not None:
                body = output.full(result.text, result) if output is not None else \
                    shape.full(prefix_text + result.text, result)
                if logprobs is not None:
                    body["choices"][0]["logprobs"] = logprobs.whole(echo)
                await request.send_json(200, body)
            return
        if logprobs is not None:
            await _respond_streamed_with_logprobs(state, request, plan, tokenizer, shape, include_usage,
                                                  prefix_text, output, logprobs, echo)
            return
        if output is not None:
            await run_streamed(state, request, plan, tokenizer, output.text_event,
                               lambda result: output.final_events(result, include_usage))
            return

        def text_event(text: str, first: bool) -> bytes:
            if not first:
                return shape.text_chunk_event(text)
            return sse_event(shape.chunk(prefix_text + text, None, first=True))

        def final_events(result: GenerationResult) -> bytes:
            out = sse_event(shape.chunk(None, result.finish_reason))
            return out + sse_event(shape.usage_chunk(result)) if include_usage else out

        await run_streamed(state, request, plan, tokenizer, text_event, final_events)


async def _respond_streamed_with_logprobs(state: GatewayState, request: Request, plan: GenerationPlan,
                                          tokenizer: TokenizerService, shape: _OpenAIShape, include_usage: bool,
                                          prefix_text: str, output: ChatOutput | None, logprobs: LogprobShape,
                                          echo: bool) -> None:
    """A stream whose chunks carry the logprobs of the tokens since the last one (apart from the plain
    stream, whose chunks are spliced from one rendering)."""
    if output is not None:
        output.logprobs = logprobs
        await run_streamed(state, request, plan, tokenizer, output.text_event,
                           lambda result: output.final_events(result, include_usage))
        return

    def text_event(text: str, first: bool) -> bytes:
        chunk = shape.chunk(prefix_text + text if first else text, None, first=first)
        chunk["choices"][0]["logprobs"] = logprobs.unsent(echo and first)
        return sse_event(chunk)

    def final_events(result: GenerationResult) -> bytes:
        chunk = shape.chunk(None, result.finish_reason)
        chunk["choices"][0]["logprobs"] = logprobs.unsent()
        out = sse_event(chunk)
        return out + sse_event(shape.usage_chunk(result)) if include_usage else out

    await run_streamed(state, request, plan, tokenizer, text_event, final_events)


async def chat_completions(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    chat = parse_chat(parse_json_body(raw))
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
    input_ids = await encode_chat(state, request, entry, tokenizer, chat, True, raw)
    plan = plan_generation(state, request, entry, input_ids, chat.sampling, chat.stream, "messages")
    shape = _OpenAIShape(True, "chatcmpl-" + request.request_id, entry.name)
    output = ChatOutput.for_request(shape, entry, chat)
    if output is not None:
        plan.kept_special = output.kept_special
    if chat.sampling.n > 1:
        outputs = [output] + [ChatOutput.for_request(shape, entry, chat) for _ in range(chat.sampling.n - 1)]
        await _respond_choices(state, request, plan, tokenizer, shape, chat.include_usage, outputs)
        return
    await _respond(state, request, plan, tokenizer, shape, chat.include_usage, output=output,
                   logprobs=logprob_shape(plan, tokenizer, True))


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
        check_vocab(comp.prompt_ids, tokenizer)
        input_ids = list(comp.prompt_ids)
        prompt_text = tokenizer.decode(input_ids, skip_special_tokens=False) if comp.echo else ""
    else:
        if len(comp.prompt_text) > PROMPT_CHARS_PRECHECK_MIN:
            check_prompt_chars(entry, tokenizer, comp.prompt_text, "prompt")
        input_ids = await tokenizer.encode(comp.prompt_text, add_special_tokens=True)
        prompt_text = comp.prompt_text
    plan = plan_generation(state, request, entry, input_ids, comp.sampling, comp.stream, "prompt")
    shape = _OpenAIShape(False, "cmpl-" + request.request_id, entry.name)
    if comp.sampling.n > 1:
        await _respond_choices(state, request, plan, tokenizer, shape, comp.include_usage, [None] * comp.sampling.n,
                               prefix_text=prompt_text if comp.echo else "", echo=comp.echo)
        return
    await _respond(state, request, plan, tokenizer, shape, comp.include_usage,
                   prefix_text=prompt_text if comp.echo else "", logprobs=logprob_shape(plan, tokenizer, False),
                   echo=comp.echo)


async def encode_chat(state: GatewayState, request: Request, entry: ModelEntry, tokenizer: TokenizerService,
                      chat: ChatRequest, add_generation_prompt: bool, raw: bytes | None = None) -> list[int]:
    """The chat's prompt ids. Client text that spells a special token is encoded as plain text
    (gateway/tokenizer/literal_spans.py) unless the node trusts it (--allow-special-tokens-in-content)
    or an admin key asks for it (``"special_tokens_in_content": true``)."""
    tracing = state.tracing
    if tracing is None or not tracing.active():
        return await _encode_chat(state, request, entry, tokenizer, chat, add_generation_prompt, raw)
    with tracing.span("tokenize", attributes={"gen_ai.request.model": entry.name}):  # the template and the ids
        ids = await _encode_chat(state, request, entry, tokenizer, chat, add_generation_prompt, raw)
        tracing.annotate({"gen_ai.usage.input_tokens": len(ids)})
        return ids


async def _encode_chat(state: GatewayState, request: Request, entry: ModelEntry, tokenizer: TokenizerService,
                       chat: ChatRequest, add_generation_prompt: bool, raw: bytes | None) -> list[int]:
    messages, tools, spans = chat.messages, chat.tools, []
    if chat.special_tokens_in_content and not request.principal.is_admin:
        raise Forbidden("'special_tokens_in_content' needs an admin key", code="insufficient_role")
    literal_spans = tokenizer.literal_spans
    if not (state.config.allow_special_tokens_in_content or chat.special_tokens_in_content) and (
            raw is None or literal_spans.may_occur_in(raw)):  # ``raw``: the request body, a cheap first look
        messages, tools, spans = literal_spans.protect(messages, tools)
    prompt = render_prompt(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                           **chat.template_kwargs)
    if len(prompt) > PROMPT_CHARS_PRECHECK_MIN:
        check_prompt_chars(entry, tokenizer, prompt, "messages")
    if spans:
        return await tokenizer.encode_with_literals(literal_spans.split(prompt, spans))
    return await tokenizer.encode(prompt, add_special_tokens=False)


async def chat_prompt(state: GatewayState, request: Request, chat: ChatRequest, api: str
                      ) -> tuple[ModelEntry, TokenizerService, list[int]]:
    """The model, its tokenizer and the chat's prompt ids, for an API translated into a chat request
    (Anthropic's Messages, the Responses API): only a gRPC engine's model with a chat template serves it."""
    entry = await ready_model_entry(state, chat.model, request.principal)
    tokenizer = entry.tokenizer
    if tokenizer is None or tokenizer.chat_template is None:
        raise BadRequest(f"the model '{entry.name}' has no chat template on this node (the {api} needs a gRPC "
                         f"engine's model)", param="model", code="unsupported_model")
    return entry, tokenizer, await encode_chat(state, request, entry, tokenizer, chat, True)


def render_prompt(tokenizer: TokenizerService, messages: "list[dict[str, Any]]", **options: Any) -> str:
    """The chat template on these messages; a template that fails on them is the request's 400."""
    try:
        return tokenizer.chat_template.render(messages, **options)
    except TemplateError as e:
        raise BadRequest(str(e), param="messages", code="chat_template_error") from None


# Shorter texts skip the check (a call saved per request): encoding one costs little, and one that does
# not fit is refused after it by plan_generation's count.
PROMPT_CHARS_PRECHECK_MIN = 64 * 1024


def check_prompt_chars(entry: ModelEntry, tokenizer: TokenizerService, text: str, param: str) -> None:
    """Refuse, before encoding it, a text that cannot fit the context whatever its tokens: encoding
    a 30 MB prompt to find out took 1.4 GiB and seconds of a core."""
    context = entry.max_context_tokens
    if context and len(text) > context * tokenizer.token_chars_max:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens, and your prompt has {len(text)} characters: "
            f"more than that many tokens can hold. Please reduce the length of the prompt.", param=param)


def check_vocab(ids: "tuple[int, ...] | list[int]", tokenizer: TokenizerService, param: str = "prompt") -> None:
    bad = next((t for t in ids if t >= tokenizer.vocab_size), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside the vocabulary (size {tokenizer.vocab_size})", param=param,
                         code="invalid_token_id")


def _routing_text(messages: "list[dict[str, Any]]") -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)

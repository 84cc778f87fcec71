"""SGLang-style POST /generate, and POST /v1/tokenize and /v1/detokenize (vLLM's shapes)."""

from __future__ import annotations

from typing import Any

from ..serving.generation import GenerationResult, UsageTally
from ..serving.models import ModelEntry
from .errors import BadRequest
from .http import Request, sse_event
from .pipeline import (admitted, check_prompt_ids, check_vocab, encode_chat, encode_text, plan_generation,
                       ready_model_entry, run_streamed, run_unary, with_media)
from .protocol import parse_chat, parse_generate, parse_json_body, token_ids
from .ratelimits import counted_tokens
from .state import GatewayState

TOKENIZE_MESSAGES_MAX = 10_000


def _meta(request: Request, result: GenerationResult) -> dict[str, Any]:
    finish: dict[str, Any] = {"type": result.finish_reason}
    if result.matched_stop is not None:
        finish["matched"] = result.matched_stop
    return {"id": request.request_id, "finish_reason": finish, "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens, "cached_tokens": result.cached_tokens}


async def generate(state: GatewayState, request: Request) -> None:
    """Token-level generation. Streaming events carry the cumulative text, as SGLang's do."""
    gen = parse_generate(parse_json_body(await request.body()))
    entry = await ready_model_entry(state, gen.model, request.principal)
    tokenizer = entry.tokenizer
    if tokenizer is None:
        raise BadRequest(f"the model '{entry.name}' is served by HTTP workers only; /generate needs a gRPC engine",
                         code="unsupported_model")
    if gen.input_ids is not None:
        check_prompt_ids(gen.input_ids, entry)
        input_ids = list(gen.input_ids)
    else:
        input_ids = await encode_text(entry, tokenizer, gen.text, "text")
    plan = plan_generation(state, request, entry, input_ids, gen.sampling, gen.stream, "text")
    async with admitted(state, request, plan):
        if not gen.stream:
            result = await run_unary(state, request, plan, tokenizer)
            if result is not None:
                await request.send_json(200, {"text": result.text, "output_ids": result.output_ids,
                                              "meta_info": _meta(request, result)})
            return
        text_so_far: list[str] = []

        def text_event(text: str, first: bool) -> bytes:
            text_so_far.append(text)
            return sse_event({"text": "".join(text_so_far)})

        def final_events(result: GenerationResult) -> bytes:
            return sse_event({"text": result.text, "output_ids": result.output_ids,
                              "meta_info": _meta(request, result)})

        await run_streamed(state, request, plan, tokenizer, text_event, final_events)


async def tokenize(state: GatewayState, request: Request) -> None:
    raw = await request.body()
    body = parse_json_body(raw)
    entry = await ready_model_entry(state, body.get("model") if isinstance(body.get("model"), str) else None,
                                    request.principal)
    usage = UsageTally()
    async with counted_tokens(state, request, len(raw), entry.name, usage):
        await _tokenize(state, request, body, entry, usage)


async def _tokenize(state: GatewayState, request: Request, body: dict[str, Any], entry: ModelEntry, usage: UsageTally) -> None:
    tokenizer = entry.tokenizer
    if tokenizer is None:
        raise BadRequest(f"the model '{entry.name}' has no tokenizer on this node", code="unsupported_model")
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise BadRequest("'add_special_tokens' must be a boolean", param="add_special_tokens")
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages or len(messages) > TOKENIZE_MESSAGES_MAX:
            raise BadRequest("'messages' must be a non-empty array", param="messages")
        chat = parse_chat({"model": entry.name, "messages": messages,
                           "special_tokens_in_content": body.get("special_tokens_in_content", False)})
        if tokenizer.chat_template is None:
            raise BadRequest("this model has no chat template", code="no_chat_template")
        add_generation_prompt = body.get("add_generation_prompt", True)
        ids = await encode_chat(state, request, entry, tokenizer, chat, bool(add_generation_prompt))
        if chat.images or chat.videos:  # counted as the engine will see them: each placeholder expanded
            ids = (await with_media(state, entry, chat, ids, request.tenant_key))[0]
    else:
        text = body.get("prompt")
        if not isinstance(text, str):
            raise BadRequest("'prompt' (a string) or 'messages' is required", param="prompt")
        ids = await encode_text(entry, tokenizer, text, "prompt", add_special)
    usage.prompt_tokens = len(ids)
    await request.send_json(200, {"tokens": ids, "count": len(ids), "max_model_len": entry.max_context_tokens})


async def detokenize(state: GatewayState, request: Request) -> None:
    body = parse_json_body(await request.body())
    entry = await ready_model_entry(state, body.get("model") if isinstance(body.get("model"), str) else None,
                                    request.principal)
    tokenizer = entry.tokenizer
    if tokenizer is None:
        raise BadRequest(f"the model '{entry.name}' has no tokenizer on this node", code="unsupported_model")
    ids = token_ids(body.get("tokens"), "tokens")
    check_vocab(ids, tokenizer)
    skip = body.get("skip_special_tokens", False)
    await request.send_json(200, {"prompt": tokenizer.decode(list(ids), skip_special_tokens=bool(skip))})

"""A chat answer through its parsers (gateway/api/chat_output.py): streamed in seeded random pieces, the
deltas assemble to the non-streamed message (content, reasoning_content, tool_calls, finish_reason)."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from gateway.api.chat_output import ChatOutput
from gateway.api.openai import _OpenAIShape
from gateway.generation import GenerationResult
from gateway.parsers import reasoning_parser, tool_call_parser

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
TEXTS = [
    CALL,
    "Sure.\n" + CALL + "\n" + CALL,
    "<think>\nhmm\n</think>\n\n" + CALL,
    "<think>\nplan\n</think>\n\nNo call after all, just text.",
    "  \n",
    "plain answer",
    CALL + "\nand a note after it",
]


def result(finish="stop") -> GenerationResult:
    return GenerationResult("", [], finish, None, 3, 4, 0, "w")


def output(tools=True, reasoning=True) -> ChatOutput:
    return ChatOutput(_OpenAIShape(True, "chatcmpl-x", "m"), tool_call_parser("qwen", TOOLS) if tools else None,
                      reasoning_parser("qwen3") if reasoning else None)


def assemble(events: bytes):
    content, reasoning, calls, finish, first_role = None, "", {}, None, None
    for line in events.split(b"\n\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = orjson.loads(line[6:])
        if not chunk["choices"]:
            continue
        choice = chunk["choices"][0]
        delta = choice["delta"]
        first_role = first_role or delta.get("role")
        if "content" in delta and delta["content"] is not None:
            content = (content or "") + delta["content"]
        reasoning += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls") or []:
            entry = calls.setdefault(call["index"], {"name": "", "arguments": ""})
            entry["name"] += call.get("function", {}).get("name") or ""
            entry["arguments"] += call.get("function", {}).get("arguments") or ""
        finish = choice["finish_reason"] or finish
    return first_role, content, reasoning, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("seed", range(6))
def test_the_stream_assembles_to_the_full_answer(text, seed):
    full = output().full(text, result())["choices"][0]
    message = full["message"]
    rng = random.Random(seed)
    streamed, out, at, first = b"", output(), 0, True
    while at < len(text):
        size = rng.choice((1, 2, 3, 7, 20))
        streamed += out.text_event(text[at:at + size], first)
        first, at = False, at + size
    if first:
        streamed += out.text_event("", True)
    streamed += out.final_events(result(), include_usage=False)
    role, content, reasoning, calls, finish = assemble(streamed)
    assert role == "assistant", f"seed={seed}"
    assert (content or "") == (message["content"] or ""), f"seed={seed}"
    assert reasoning == (message["reasoning_content"] or ""), f"seed={seed}"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    assert finish == full["finish_reason"], f"seed={seed}"


def test_finish_reason_and_null_content():
    body = output().full(CALL, result())
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert body["usage"]["completion_tokens"] == 4
    cut = output().full(CALL, result("length"))["choices"][0]
    assert cut["finish_reason"] == "length"  # a call cut short by max_tokens is still reported as cut

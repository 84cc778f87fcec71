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


def test_a_call_inside_the_reasoning_is_not_a_call():
    text = "<think>\nmaybe " + CALL + "\n</think>\n\nNo call needed."
    message = output().full(text, result())["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] == "No call needed."
    assert CALL in message["reasoning_content"]


def _events(out: ChatOutput, text: str, final_result: GenerationResult, seed: int = 0) -> bytes:
    rng, at, first, streamed = random.Random(seed), 0, True, b""
    while at < len(text):
        size = rng.choice((1, 2, 5))
        streamed += out.text_event(text[at:at + size], first)
        first, at = False, at + size
    return streamed + out.final_events(final_result, include_usage=True)


@pytest.mark.parametrize("seed", range(4))
def test_reasoning_held_until_it_ends_when_not_streamed_as_it_comes(seed):
    text = "<think>\nstep one, step two\n</think>\n\nThe answer."
    out = ChatOutput(_OpenAIShape(True, "chatcmpl-x", "m"), None, reasoning_parser("qwen3"), stream_reasoning=False)
    streamed = _events(out, text, result(), seed)
    reasoning_deltas = [orjson.loads(line[6:])["choices"][0]["delta"]["reasoning_content"]
                        for line in streamed.split(b"\n\n") if b"reasoning_content" in line]
    assert reasoning_deltas == ["\nstep one, step two\n"], f"seed={seed}"
    assert assemble(streamed)[1:3] == ("The answer.", "\nstep one, step two\n")


END = 99  # the id of </think> in these tests


@pytest.mark.parametrize("text, ids, expected", [
    ("<think>\nab\n</think>\n\nc", [5, 6, END, 7], 3),
    ("no thinking here", [5, 6, 7], 0),
    ("<think>\ncut short", [5, 6, 7, 8], 4),
])
def test_reasoning_tokens_in_usage_streamed_or_not(text, ids, expected):
    def make():
        return ChatOutput(_OpenAIShape(True, "chatcmpl-x", "m"), None, reasoning_parser("qwen3"),
                          count_tokens=len, reasoning_end_id=END)

    done = GenerationResult(text, ids, "stop", None, 3, len(ids), 0, "w")
    assert make().full(text, done)["usage"]["completion_tokens_details"] == {"reasoning_tokens": expected}
    usage = [orjson.loads(line[6:])["usage"] for line in _events(make(), text, done).split(b"\n\n")
             if b'"usage"' in line]
    assert usage[-1]["completion_tokens_details"] == {"reasoning_tokens": expected}


def test_reasoning_tokens_counted_from_the_text_when_the_end_marker_is_not_one_token():
    out = ChatOutput(_OpenAIShape(True, "chatcmpl-x", "m"), None, reasoning_parser("kimi"), count_tokens=len)
    text = "abcd◁/think▷rest"
    done = GenerationResult(text, list(range(10)), "stop", None, 3, 10, 0, "w")
    assert out.full(text, done)["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}
    streamed = _events(ChatOutput(_OpenAIShape(True, "chatcmpl-x", "m"), None, reasoning_parser("kimi"),
                                  count_tokens=len), text, done)
    assert b'"reasoning_tokens":4' in streamed

"""A chat answer through its parsers (gateway/api/chat_output.py): streamed in seeded random pieces, the typed
deltas, rendered as OpenAI's chat chunks (gateway/api/openai.py OpenAIShape), assemble to the non-streamed
message (content, reasoning_content, tool_calls, finish_reason)."""

from __future__ import annotations

import dataclasses
import json
import random

import orjson
import pytest

from gateway.api.chat_output import ChatOutput
from gateway.serving.chat import Call, Content, Reasoning
from gateway.serving.generation import GenerationResult
from gateway.parsers import reasoning_parser, tool_call_parser
from tests.support.rendering import Rendered, assemble

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


def rendered(*args, **kwargs) -> Rendered:
    return Rendered(ChatOutput(*args, **kwargs))


def output(tools=True, reasoning=True) -> Rendered:
    return rendered(tool_call_parser("qwen", TOOLS) if tools else None, reasoning_parser("qwen3") if reasoning else None)


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


@pytest.mark.parametrize("text", TEXTS)
def test_the_typed_deltas_add_up_to_the_typed_whole_answer(text):
    """No API's shape involved: Reasoning, Content and Call deltas against ChatOutput.whole's answer."""
    whole = ChatOutput(tool_call_parser("qwen", TOOLS), reasoning_parser("qwen3")).whole(
        dataclasses.replace(result(), text=text))
    out = ChatOutput(tool_call_parser("qwen", TOOLS), reasoning_parser("qwen3"))
    deltas = [d for at in range(0, len(text), 4) for d in out.feed(text[at:at + 4])] + out.finish()
    end = out.streamed_answer(result())
    assert "".join(d.text for d in deltas if type(d) is Reasoning) == (whole.reasoning or "")
    assert "".join(d.text for d in deltas if type(d) is Content) == (whole.content or "")
    calls = [d for d in deltas if type(d) is Call]
    assert [(c.index, c.name, json.loads(c.arguments)) for c in calls] == \
        [(c.index, c.name, json.loads(c.arguments)) for c in whole.calls]
    assert (end.finish_reason, end.called) == (whole.finish_reason, whole.called)
    assert end.content is None and end.reasoning is None and end.calls == ()


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


def _events(out: Rendered, text: str, final_result: GenerationResult, seed: int = 0) -> bytes:
    rng, at, first, streamed = random.Random(seed), 0, True, b""
    while at < len(text):
        size = rng.choice((1, 2, 5))
        streamed += out.text_event(text[at:at + size], first)
        first, at = False, at + size
    return streamed + out.final_events(final_result, include_usage=True)


@pytest.mark.parametrize("seed", range(4))
def test_reasoning_held_until_it_ends_when_not_streamed_as_it_comes(seed):
    text = "<think>\nstep one, step two\n</think>\n\nThe answer."
    out = rendered(None, reasoning_parser("qwen3"), stream_reasoning=False)
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
        return rendered(None, reasoning_parser("qwen3"), count_tokens=len, reasoning_end_id=END)

    done = GenerationResult(text, ids, "stop", None, 3, len(ids), 0, "w")
    assert make().full(text, done)["usage"]["completion_tokens_details"] == {"reasoning_tokens": expected}
    usage = [orjson.loads(line[6:])["usage"] for line in _events(make(), text, done).split(b"\n\n")
             if b'"usage"' in line]
    assert usage[-1]["completion_tokens_details"] == {"reasoning_tokens": expected}


def test_reasoning_tokens_counted_from_the_text_when_the_end_marker_is_not_one_token():
    out = rendered(None, reasoning_parser("kimi"), count_tokens=len)
    text = "abcd◁/think▷rest"
    done = GenerationResult(text, list(range(10)), "stop", None, 3, 10, 0, "w")
    assert out.full(text, done)["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}
    streamed = _events(rendered(None, reasoning_parser("kimi"), count_tokens=len), text, done)
    assert b'"reasoning_tokens":4' in streamed


# -- formats met in the field (issue 34) ---------------------------------------------------------------------

def _chat(tool_choice="auto", tools=TOOLS, template_kwargs=None, tool_name=None):
    from types import SimpleNamespace
    return SimpleNamespace(tool_choice=tool_choice, tools=tools, tool_name=tool_name, separate_reasoning=True,
                           thinking=True, template_kwargs=template_kwargs or {}, stream_reasoning=True)


def _entry(tool_parser, reasoning):
    from types import SimpleNamespace
    return SimpleNamespace(tool_call_parser=tool_parser, reasoning_parser=reasoning, tokenizer=None)


def for_request(entry, chat) -> Rendered:
    return Rendered(ChatOutput.for_request(entry, chat))


def _both_ways(make, text, finish="stop"):
    """The non-streamed message, and the streamed one assembled (in 3-character pieces): they must agree."""
    whole = make().full(text, result(finish))["choices"][0]
    out, streamed = make(), b""
    for at in range(0, len(text), 3):
        streamed += out.text_event(text[at:at + 3], at == 0)
    streamed += out.final_events(result(finish), include_usage=False)
    _, content, reasoning, calls, finish_reason = assemble(streamed)
    message = whole["message"]
    assert (content or None) == (message["content"] or None) and reasoning == (message.get("reasoning_content") or "")
    assert finish_reason == whole["finish_reason"]
    return message, whole["finish_reason"], calls


DS_CALL = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}"
           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")


def test_deepseek_v31_reasons_only_when_its_thinking_switch_is_on():
    entry = _entry("deepseek31", "deepseek_v31")
    off = _both_ways(lambda: for_request(entry, _chat()), "Let me check." + DS_CALL)
    assert off[0]["content"] == "Let me check." and off[0].get("reasoning_content") is None
    assert [c["name"] for c in off[2]] == ["get_weather"] and off[1] == "tool_calls"
    on = _both_ways(lambda: for_request(entry, _chat(template_kwargs={"thinking": True})),
                    "The user wants weather.</think>" + DS_CALL)
    assert on[0]["reasoning_content"] == "The user wants weather." and [c["name"] for c in on[2]] == ["get_weather"]


@pytest.mark.parametrize("name, text", [("qwen3", "<think>\nFirst I will plan the"),
                                        ("deepseek_r1", "First I will plan the"),
                                        ("deepseek_r1", "<think>\nFirst I will plan the")])
def test_an_answer_cut_inside_its_reasoning_is_reasoning(name, text):
    message, finish, _ = _both_ways(lambda: for_request(_entry("qwen", name), _chat()), text,
                                    finish="length")
    assert message["reasoning_content"] == "\nFirst I will plan the".removeprefix("\n" if "<think>" not in text
                                                                                   else "")
    assert not message["content"] and finish == "length" and "<think>" not in str(message)


def test_qwen3_coder_gets_a_reasoning_parser_that_leaves_plain_answers_alone():
    from gateway.parsers.choice import choose
    assert choose("Qwen/Qwen3-Coder-30B-A3B-Instruct") == ("qwen_coder", "qwen3")
    plain = _both_ways(lambda: for_request(_entry("qwen_coder", "qwen3"), _chat()), "def f(): pass")
    assert plain[0]["content"] == "def f(): pass" and plain[0]["reasoning_content"] is None


def test_tool_choice_required_cut_short_gives_the_calls_it_completed_never_the_array_text():
    tools = TOOLS + [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    make = lambda: for_request(_entry(None, None), _chat("required", tools))  # noqa: E731
    text = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "get_time", "parameters": {"tz": "U'
    message, finish, calls = _both_ways(make, text, finish="length")
    assert message["content"] is None and finish == "length" and [c["name"] for c in calls] == ["get_weather"]
    nothing, finish, calls = _both_ways(make, '[{"name": "get_wea', finish="length")
    assert not nothing["content"] and calls == [] and finish == "length"
    named = lambda: for_request(_entry(None, None), _chat("named", tool_name="get_weather"))  # noqa
    cut, finish, calls = _both_ways(named, '{"city": "Os', finish="length")
    assert not cut["content"] and calls == [] and finish == "length"

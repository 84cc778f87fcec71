"""Tool-call and reasoning parsers (gateway/parsers/): each vector parsed whole, and streamed in seeded
random chunkings that must give the same result (the seed is in the test id and the failure)."""

from __future__ import annotations

import json
import random

import pytest

from gateway.parsers import ToolCall, reasoning_parser, tool_call_parser
from gateway.parsers.markers import held_back

SEEDS = range(8)


def chunked(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces, at = [], 0
    while at < len(text):
        size = rng.choice((1, 1, 2, 3, 5, 8, 13))
        pieces.append(text[at:at + size])
        at += size
    return pieces


def stream_tool_calls(name, text, seed, tools=None):
    parser = tool_call_parser(name, tools)
    content, calls = "", []
    for piece in chunked(text, seed):
        result = parser.feed(piece)
        content += result.content
        calls += result.calls
    result = parser.finish()
    return content + result.content, calls + result.calls


def call(name, **arguments):
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


WEATHER = ["get_weather", "get_time"]
QWEN_VECTORS = [
    ("one call", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "", [call("get_weather", city="Paris")]),
    ("text before and after", 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\nDone.',
     "Let me check.\n\nDone.", [call("get_time")]),
    ("several in a row", '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
     '<tool_call>{"name": "get_time", "arguments": {"tz": "CET"}}</tool_call>',
     "\n", [call("get_weather", city="Oslo"), call("get_time", tz="CET")]),
    ("missing end marker at the end", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n',
     "", [call("get_weather", city="Rome")]),
    ("invalid JSON is text", '<tool_call>{"name": "get_weather", "arguments": {"city": }</tool_call>',
     '<tool_call>{"name": "get_weather", "arguments": {"city": }</tool_call>', []),
    ("an unoffered function is text", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', []),
    ("already serialized arguments", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Nice\\"}"}'
     '</tool_call>', "", [ToolCall("get_weather", '{"city": "Nice"}')]),
    ("parameters instead of arguments", '<tool_call>{"name": "get_time", "parameters": {"tz": "UTC"}}</tool_call>',
     "", [call("get_time", tz="UTC")]),
    ("unicode and nesting", '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich 東京", '
     '"opts": {"units": ["c", "f"], "deep": {"a": null}}}}</tool_call>',
     "", [call("get_weather", city="Zürich 東京", opts={"units": ["c", "f"], "deep": {"a": None}})]),
    ("no call at all", "Plain answer with a < sign and <b>tags</b>.", "Plain answer with a < sign and <b>tags</b>.",
     []),
    ("a marker cut short at the end is text", "Almost <tool_ca", "Almost <tool_ca", []),
]


@pytest.mark.parametrize("name", ["qwen", "hermes", "qwen25"])
@pytest.mark.parametrize("label, text, content, calls", QWEN_VECTORS, ids=[v[0] for v in QWEN_VECTORS])
def test_qwen_tool_calls_whole_and_streamed(name, label, text, content, calls):
    whole = tool_call_parser(name, WEATHER).parse(text)
    assert (whole.content, whole.calls) == (content, calls)
    for seed in SEEDS:
        assert stream_tool_calls(name, text, seed, WEATHER) == (content, calls), f"seed={seed}"


def test_without_a_tool_list_any_name_is_a_call():
    assert tool_call_parser("qwen").parse('<tool_call>{"name": "x", "arguments": {}}</tool_call>').calls == [
        ToolCall("x", "{}")]


def test_a_half_received_call_is_never_returned():
    parser = tool_call_parser("qwen", WEATHER)
    result = parser.feed('<tool_call>{"name": "get_weather", "argu')
    assert result.calls == [] and result.content == ""
    assert parser.feed('ments": {}}</tool_call>').calls == [ToolCall("get_weather", "{}")]


def stream_reasoning(name, text, seed):
    parser = reasoning_parser(name)
    reasoning = content = ""
    for piece in chunked(text, seed):
        result = parser.feed(piece)
        reasoning += result.reasoning
        content += result.content
    result = parser.finish()
    return reasoning + result.reasoning, content + result.content


REASONING_VECTORS = [
    ("qwen3", "<think>\nThe user greets.\n</think>\n\nHello!", "\nThe user greets.\n", "Hello!"),
    ("qwen3", "Hello without thinking.", "", "Hello without thinking."),
    ("qwen3", "<think>\n\n</think>\n\nEmpty thoughts.", "\n\n", "Empty thoughts."),
    ("qwen3", "<think>cut short", "cut short", ""),
    ("qwen3", "<thi", "", "<thi"),
    ("qwen3", "2 < 3 and </think> is just text here", "", "2 < 3 and </think> is just text here"),
    ("deepseek_r1", "Let me think.\n</think>\n\nThe answer is 4.", "Let me think.\n", "The answer is 4."),
    ("deepseek_r1", "<think>\nRepeated start.</think>Answer", "\nRepeated start.", "Answer"),
    ("deepseek_r1", "Thinking that never ends", "Thinking that never ends", ""),
    ("qwen3_thinking", "a </thi", "a </thi", ""),
    ("kimi", "◁think▷plan◁/think▷done", "plan", "done"),
    ("glm45", "<think>x</think>y", "x", "y"),
]


@pytest.mark.parametrize("name, text, reasoning, content", REASONING_VECTORS,
                         ids=[f"{v[0]}-{i}" for i, v in enumerate(REASONING_VECTORS)])
def test_reasoning_whole_and_streamed(name, text, reasoning, content):
    whole = reasoning_parser(name).parse(text)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    for seed in SEEDS:
        assert stream_reasoning(name, text, seed) == (reasoning, content), f"seed={seed}"


def test_held_back_is_the_longest_tail_that_may_become_the_marker():
    assert held_back("abc <tool_c", "<tool_call>") == 7
    assert held_back("abc", "<tool_call>") == 0
    assert held_back("<", "<tool_call>") == 1


def test_unknown_parser_names_are_key_errors():
    with pytest.raises(KeyError):
        tool_call_parser("nope")
    with pytest.raises(KeyError):
        reasoning_parser("nope")


TRAILING_VECTORS = [
    ("llama", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [call("get_weather", city="Paris")]),
    ("llama", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "A;B"}}; '
     '{"name": "get_time", "parameters": {}}', "", [call("get_weather", city="A;B"), call("get_time")]),
    ("llama", 'Sure.<|python_tag|>{"name": "get_time", "parameters": {}}', "Sure.", [call("get_time")]),
    ("llama", "Plain text, then {braces} later.", "Plain text, then {braces} later.", []),
    ("llama", '{"name": "get_weather", "parameters": {"city": ', '{"name": "get_weather", "parameters": {"city": ',
     []),
    ("llama", '{"name": "not_offered", "parameters": {}}', '{"name": "not_offered", "parameters": {}}', []),
    ("mistral", 'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Lyon"}}, '
     '{"name": "get_time", "arguments": {}}]', "Checking. ",
     [call("get_weather", city="Lyon"), call("get_time")]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Nîmes"}[TOOL_CALLS]get_time[ARGS]{}', "",
     [call("get_weather", city="Nîmes"), call("get_time")]),
    ("mistral", '[TOOL_CALLS]get_weather{"city": "Metz"}', "", [call("get_weather", city="Metz")]),
    ("mistral", "[TOOL_CALLS] not json", "[TOOL_CALLS] not json", []),
    ("mistral", "No call, and a [TOOL_CA", "No call, and a [TOOL_CA", []),
    ("pythonic", '[get_weather(city="Oslo", days=3), get_time()]', "",
     [call("get_weather", city="Oslo", days=3), call("get_time")]),
    ("pythonic", '<|python_start|>[get_time(tz=None, exact=True)]<|python_end|>', "",
     [call("get_time", tz=None, exact=True)]),
    ("pythonic", "[1, 2, 3] is a list", "[1, 2, 3] is a list", []),
    ("pythonic", '[get_weather(__import__("os"))]', '[get_weather(__import__("os"))]', []),
    ("json", '[{"name": "get_time", "arguments": {"tz": "UTC"}}]', "", [call("get_time", tz="UTC")]),
    ("json", '{"name": "get_weather", "arguments": {"city": "Bern"}}', "", [call("get_weather", city="Bern")]),
    ("json", "just words", "just words", []),
]


@pytest.mark.parametrize("name, text, content, calls", TRAILING_VECTORS,
                         ids=[f"{v[0]}-{i}" for i, v in enumerate(TRAILING_VECTORS)])
def test_trailing_call_formats_whole_and_streamed(name, text, content, calls):
    whole = tool_call_parser(name, WEATHER).parse(text)
    assert (whole.content, whole.calls) == (content, calls)
    for seed in SEEDS:
        assert stream_tool_calls(name, text, seed, WEATHER) == (content, calls), f"seed={seed}"

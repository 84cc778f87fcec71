"""Tool-call and reasoning parsers (gateway/parsers/): each vector parsed whole, and streamed in seeded
random chunkings that must give the same result (the seed is in the test id and the failure)."""

from __future__ import annotations

import json
import random

import pytest

from gateway.parsers import RequiredCallsParser, ToolCall, ToolCallResult, reasoning_parser, tool_call_parser
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


def assert_whole_and_streamed(name, text, content, calls, tools=None):
    whole = tool_call_parser(name, tools).parse(text)
    assert (whole.content, whole.calls) == (content, calls)
    for seed in SEEDS:
        assert stream_tool_calls(name, text, seed, tools) == (content, calls), f"seed={seed}"


WEATHER = ["get_weather", "get_time"]
QWEN_VECTORS = [
    ("one call", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "", [call("get_weather", city="Paris")]),
    ("text before and after", 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\nDone.',
     "Let me check.\nDone.", [call("get_time")]),  # the newline after the call was the markers' layout
    ("blank lines around a call", 'Sure.\n\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n\nMore.',
     "Sure.\n\nMore.", [call("get_time")]),  # issue 34: "\n\n\n\n" where the model wrote "\n\n"
    ("no space before a call", 'Checking<tool_call>{"name": "get_time", "arguments": {}}</tool_call> now.',
     "Checking now.", [call("get_time")]),  # the text's own space stays
    ("a call then only whitespace", 'Done.\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n\n',
     "Done.\n", [call("get_time")]),
    ("several in a row", '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
     '<tool_call>{"name": "get_time", "arguments": {"tz": "CET"}}</tool_call>',
     "", [call("get_weather", city="Oslo"), call("get_time", tz="CET")]),  # the newline between them is layout
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
    assert_whole_and_streamed(name, text, content, calls, tools=WEATHER)


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
    ("cohere_cmd", "<|START_THINKING|>Look it up.<|END_THINKING|>It is sunny.", "Look it up.", "It is sunny."),
    ("cohere_cmd", "No thinking today.", "", "No thinking today."),
    ("nano_v3", "plan it\n</think>\n\nanswer", "plan it\n", "answer"),
    ("step3", "<think>step</think>out", "step", "out"),
    ("minimax", "weighing options</think>\nChoice B.", "weighing options", "Choice B."),
    ("deepseek_v31", "brief</think>Sure.", "brief", "Sure."),
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
    # Llama 4 writes its calls between markers anywhere in the text (issue 34: text after them made the whole
    # rest content, markers included); the text around them is content, the markers never are.
    ("pythonic", "Let me check. <|python_start|>[get_weather(city='Oslo')]<|python_end|> I will report back.",
     "Let me check. I will report back.", [call("get_weather", city="Oslo")]),
    ("pythonic", "First:\n<|python_start|>[get_time()]<|python_end|>\nthen:\n<|python_start|>"
     "[get_weather(city='Rome', days=2)]<|python_end|>", "First:\nthen:\n",
     [call("get_time"), call("get_weather", city="Rome", days=2)]),
    ("pythonic", "Sure <|python_start|>[get_time(tz='UTC')]", "Sure ", [call("get_time", tz="UTC")]),  # cut short
    ("pythonic", "<|python_start|>not python<|python_end|> ok", "<|python_start|>not python<|python_end|> ok", []),
    ("pythonic", '[get_weather(__import__("os"))]', '[get_weather(__import__("os"))]', []),
    ("json", '[{"name": "get_time", "arguments": {"tz": "UTC"}}]', "", [call("get_time", tz="UTC")]),
    ("json", '{"name": "get_weather", "arguments": {"city": "Bern"}}', "", [call("get_weather", city="Bern")]),
    ("json", "just words", "just words", []),
]


@pytest.mark.parametrize("name, text, content, calls", TRAILING_VECTORS,
                         ids=[f"{v[0]}-{i}" for i, v in enumerate(TRAILING_VECTORS)])
def test_trailing_call_formats_whole_and_streamed(name, text, content, calls):
    assert_whole_and_streamed(name, text, content, calls, tools=WEATHER)


# vLLM's Llama 4 pythonic vectors (tests/entrypoints/openai/tool_parsers/test_llama4_pythonic_tool_parser.py, at
# vllm-project/vllm 0328802): model output -> the calls vLLM extracts; any function name is offered.
VLLM_LLAMA4_VECTORS = [
    ("[get_weather(city='LA', metric='C')]", [("get_weather", '{"city": "LA", "metric": "C"}')]),
    ("[register_user(name='Doe', age=9, address={'city': 'LA', 'state': 'CA'}, role=None, passed_test=True, "
     "aliases=['John', 'Johnny'])]",
     [("register_user", '{"name": "Doe", "age": 9, "address": {"city": "LA", "state": "CA"}, "role": null, '
       '"passed_test": true, "aliases": ["John", "Johnny"]}')]),
    ("[get_weather()]", [("get_weather", "{}")]),
    ("[do_something_cool(additional_data={})]", [("do_something_cool", '{"additional_data": {}}')]),
    ("[do_something_cool(steps=[])]", [("do_something_cool", '{"steps": []}')]),
    (r"[get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')]",
     [("get_weather", '{"city": "Martha\'s Vineyard", "metric": "\\"cool units\\""}')]),
    ("[get_weather(city='LA',metric='C'),register_user(name='Doe',age=9)]",
     [("get_weather", '{"city": "LA", "metric": "C"}'), ("register_user", '{"name": "Doe", "age": 9}')]),
    ("<|python_start|>[get_weather(city='LA', metric='C')]<|python_end|>", [("get_weather", '{"city": "LA", "metric": "C"}')]),
    ("<|python_start|>[get_weather(city='LA', metric='C'), register_user(name='Doe', age=9)]",
     [("get_weather", '{"city": "LA", "metric": "C"}'), ("register_user", '{"name": "Doe", "age": 9}')]),
    ("<|python_start|>[get_weather(city='LA', metric='C'), get_weather(), do_something_cool(steps=[])]<|python_end|>",
     [("get_weather", '{"city": "LA", "metric": "C"}'), ("get_weather", "{}"), ("do_something_cool", '{"steps": []}')]),
]


@pytest.mark.parametrize("text, calls", VLLM_LLAMA4_VECTORS)
def test_llama4_pythonic_as_vllm_extracts_it(text, calls):
    expected = ("", [ToolCall(name, json.dumps(json.loads(arguments), ensure_ascii=False)) for name, arguments in calls])
    assert_whole_and_streamed("pythonic", text, *expected)


# smg's pythonic vectors (crates/tool_parser/tests/tool_parser_pythonic.rs, lightseekorg/smg 9ceecd6): model
# output -> content and calls; any function name is offered. One differs on purpose: smg leaves "\n\n\n\n" where the
# model wrote "\n\n" around its call list (the layout rule of issue 34 keeps the text's own whitespace), and smg
# takes "[function(=value)]", which is not Python, as a call.
SMG_PYTHONIC_VECTORS = [
    ("I'll help you with multiple tasks. Let me search for information and perform calculations.\n\n"
     "[web_search(query=\"latest Rust features\", max_results=3, safe_search=True),\n"
     " calculate(expression=\"42 * 3.14159\", precision=2),\n"
     " get_weather(city=\"San Francisco\", units=\"fahrenheit\", include_forecast=False)]\n\n"
     "These functions will provide the information you need.",
     "I'll help you with multiple tasks. Let me search for information and perform calculations.\n\n"
     "These functions will provide the information you need.",
     [call("web_search", query="latest Rust features", max_results=3, safe_search=True),
      call("calculate", expression="42 * 3.14159", precision=2),
      call("get_weather", city="San Francisco", units="fahrenheit", include_forecast=False)]),
    ('[search_web(query="Rust programming", max_results=5), get_time(timezone="UTC")]', "",
     [call("search_web", query="Rust programming", max_results=5), call("get_time", timezone="UTC")]),
    ("[configure(enabled=True, disabled=False, optional=None)]", "",
     [call("configure", enabled=True, disabled=False, optional=None)]),
    ('[process_data(items=[1, 2, 3], config={"key": "value", "nested": {"deep": True}})]', "",
     [call("process_data", items=[1, 2, 3], config={"key": "value", "nested": {"deep": True}})]),
    ("<|python_start|>[calculate(x=10, y=20)]<|python_end|>", "", [call("calculate", x=10, y=20)]),
    ('[math_eval(expression="(2 + 3) * (4 - 1)", round_to=2)]', "",
     [call("math_eval", expression="(2 + 3) * (4 - 1)", round_to=2)]),
    (r'[echo(text="She said \"Hello\" to him")]', "", [call("echo", text='She said "Hello" to him')]),
    ("[ping()]", "", [call("ping")]),
    ('[process_matrix(data=[[1, 2], [3, 4]], labels=["row[0]", "row[1]"])]', "",
     [call("process_matrix", data=[[1, 2], [3, 4]], labels=["row[0]", "row[1]"])]),
    ('[analyze(config={"patterns": ["[a-z]+", "[0-9]+"], "nested": {"list": [1, [2, 3]]}})]', "",
     [call("analyze", config={"patterns": ["[a-z]+", "[0-9]+"], "nested": {"list": [1, [2, 3]]}})]),
    (r"""[format_text(single='Hello', double="World", mixed="It's \"quoted\"")]""", "",
     [call("format_text", single="Hello", double="World", mixed='It\'s "quoted"')]),
    ('[transform(\n        matrix=[[1, [2, 3]], [4, [5, [6, 7]]]],\n        operations=[{"type": "scale", "factor": '
     '[2, 3]}, {"type": "rotate", "angle": 90}],\n        metadata={"tags": ["nested[0]", "nested[1]"], "config": '
     '{"depth": [1, 2, 3]}}\n    )]', "",
     [call("transform", matrix=[[1, [2, 3]], [4, [5, [6, 7]]]], operations=[{"type": "scale", "factor": [2, 3]},
           {"type": "rotate", "angle": 90}], metadata={"tags": ["nested[0]", "nested[1]"], "config": {"depth": [1, 2, 3]}})]),
    ("Here's a tool call: [get_weather(location='New York', unit='celsius')]", "Here's a tool call: ",
     [call("get_weather", location="New York", unit="celsius")]),
    ("[get_weather(location='Tokyo')] Here's the forecast:", "Here's the forecast:",
     [call("get_weather", location="Tokyo")]),
    ("Let's try this: [", "Let's try this: [", []),
    ("[function(arg=value", "[function(arg=value", []),  # cut short: not a call
    ("[function(=value)]", "[function(=value)]", []),
    ("[search(query='test', config={'options': [1, 2], 'nested': {'key': 'value'}})]", "",
     [call("search", query="test", config={"options": [1, 2], "nested": {"key": "value"}})]),
    # Ours: brackets in prose stay prose; literals JSON has no word for are not calls (they raised out of the
    # parser before: a set, an unhashable key, bytes, a complex number, an infinite float).
    ("See [the docs](https://x.y/a_(b)) and [a, b], [x] or [f (x)].", "See [the docs](https://x.y/a_(b)) and [a, b], "
     "[x] or [f (x)].", []),
    ("[f(a='])}')] done", "done", [call("f", a="])}")]),
    ("[f(a={1, 2})]", "[f(a={1, 2})]", []),
    ("[f(a={[1]: 2})]", "[f(a={[1]: 2})]", []),
    ("[f(a=b'x')]", "[f(a=b'x')]", []),
    ("[f(a=1j)]", "[f(a=1j)]", []),
    ("[f(a=1e999)]", "[f(a=1e999)]", []),
]


@pytest.mark.parametrize("text, content, calls", SMG_PYTHONIC_VECTORS)
def test_pythonic_as_smg_reads_it(text, content, calls):
    assert_whole_and_streamed("pythonic", text, content, calls)


def test_pythonic_calls_of_unoffered_functions_are_text():
    text = "Sure. [rm_rf(path='/')] and [get_time()]"
    assert tool_call_parser("pythonic", WEATHER).parse(text) == ToolCallResult(
        content="Sure. [rm_rf(path='/')] and ", calls=[call("get_time")])


SCHEMA_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "zip": {"type": "string"}, "opts": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "get-time.v2", "parameters": {"type": "object", "properties": {}}}},
]
B, S, E, CB, CE = "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
K_B, K_E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def k_call(call_id, args):
    return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


SECTION_VECTORS = [
    ("qwen_coder", "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=zip>\n02134\n</parameter>\n"
     "</function>\n</tool_call>", "Let me look.\n",
     [call("get_weather", city="San Francisco", days=3, metric=True, zip="02134")]),
    ("qwen_coder", "<tool_call>\n<function=get_weather>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n"
     "</tool_call><tool_call>\n<function=get-time.v2>\n</function>\n</tool_call>", "",
     [call("get_weather", opts={"a": [1, 2]}), call("get-time.v2")]),
    ("qwen_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n",
     "", [call("get_weather", city="Rome")]),  # the end marker never came
    ("qwen_coder", "<tool_call>\nnot xml\n</tool_call>", "<tool_call>\nnot xml\n</tool_call>", []),
    ("deepseek", f"Let me help.\n{B}{CB}function{S}get_weather\n```json\n{{\"city\": \"Tokyo\"}}\n```{CE}"
     f"{CB}function{S}get-time.v2\n```json\n{{}}\n```{CE}{E}\nThe weather:",
     "Let me help.\nThe weather:", [call("get_weather", city="Tokyo"), call("get-time.v2")]),
    ("deepseek", f"{B}{CB}function{S}get_weather\n```json\n{{\"city\": }}\n```{CE}{E}",
     f"{B}{CB}function{S}get_weather\n```json\n{{\"city\": }}\n```{CE}{E}", []),
    ("deepseek31", f"{B}{CB}get_weather{S}{{\"city\": \"Paris\"}}{CE}{CB}get-time.v2{S}{{}}{CE}{E}", "",
     [call("get_weather", city="Paris"), call("get-time.v2")]),
    ("deepseek31", f"Before {B}{CB}get_weather{S}{{\"city\": \"Kyoto\"}}{CE}", "Before ",
     [call("get_weather", city="Kyoto")]),
    ("kimik2", K_B + k_call("functions.get_weather:0", '{"city": "Lima"}') + k_call("functions.get-time.v2:1", "{}")
     + K_E, "", [call("get_weather", city="Lima"), call("get-time.v2")]),
    ("kimik2", "ok " + K_B + k_call("functions.get_weather:0", "oops") + K_E,
     "ok " + K_B + k_call("functions.get_weather:0", "oops") + K_E, []),
    ("glm45_moe", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>", "", [call("get_weather", city="Beijing", days=2)]),
    ("glm47_moe", "Sure<tool_call>get_weather<arg_key>zip</arg_key><arg_value>00123</arg_value></tool_call>",
     "Sure", [call("get_weather", zip="00123")]),
    ("glm45_moe", "<tool_call>get_weather<arg_key>city</tool_call>", "<tool_call>get_weather<arg_key>city</tool_call>",
     []),
    # SGLang's Glm4MoeDetector vectors (test/srt/test_function_call_parser.py, sgl-project/sglang 278e503): the
    # GLM-4.5 form with newlines, and GLM-4.7's without, a JSON value typed by the schema.
    ("glm45_moe", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
     "<arg_key>date</arg_key>\n<arg_value>2024-06-27</arg_value>\n</tool_call>", "",
     [call("get_weather", city="Beijing", date="2024-06-27")]),
    ("glm47_moe", "我来调用工具：<tool_call>get_weather<arg_key>opts</arg_key><arg_value>{\"units\": [\"C\", \"F\"]}"
     "</arg_value><arg_key>city</arg_key><arg_value>杭州</arg_value></tool_call>", "我来调用工具：",
     [call("get_weather", opts={"units": ["C", "F"]}, city="杭州")]),
    ("glm45_moe", "Let me check both.\n\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
     "</tool_call>\n\nThen I will answer.", "Let me check both.\n\nThen I will answer.", [call("get_weather", city="Oslo")]),
    ("minimax_m2", "Checking.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Cape Town"
     "</parameter>\n<parameter name=\"days\">4</parameter>\n<parameter name=\"zip\">0800</parameter>\n</invoke>\n"
     "<invoke name=\"get-time.v2\">\n</invoke>\n</minimax:tool_call>", "Checking.\n",
     [call("get_weather", city="Cape Town", days=4, zip="0800"), call("get-time.v2")]),
    ("minimax_m2", "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"opts\">{\"a\": {\"b\": [1]}}"
     "</parameter>\n</invoke>\n", "", [call("get_weather", opts={"a": {"b": [1]}})]),  # end marker never came
    ("minimax_m2", "<minimax:tool_call>garbage</minimax:tool_call>", "<minimax:tool_call>garbage</minimax:tool_call>",
     []),
    ("step3", "Let me see.<｜tool_calls_begin｜>\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke "
     "name=\"get_weather\">\n<steptml:parameter name=\"city\">Zürich</steptml:parameter>\n<steptml:parameter "
     "name=\"metric\">false</steptml:parameter>\n</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>Done.",
     "Let me see.Done.", [call("get_weather", city="Zürich", metric=False)]),
    ("deepseek32", "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"zip\" "
     "string=\"true\">12</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
     "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get-time.v2\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", "",
     [call("get_weather", zip="12", days=3), call("get-time.v2")]),
    ("cohere", "I will look it up.<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
     "\"parameters\": {\"city\": \"Oslo\"}},\n    {\"tool_call_id\": \"1\", \"tool_name\": \"get-time.v2\", "
     "\"parameters\": {}}\n]<|END_ACTION|>", "I will look it up.",
     [call("get_weather", city="Oslo"), call("get-time.v2")]),
    ("cohere", "<|START_ACTION|>[{\"tool_name\": \"rm\", \"parameters\": {}}]<|END_ACTION|>",
     "<|START_ACTION|>[{\"tool_name\": \"rm\", \"parameters\": {}}]<|END_ACTION|>", []),  # not offered
]


@pytest.mark.parametrize("name, text, content, calls", SECTION_VECTORS,
                         ids=[f"{v[0]}-{i}" for i, v in enumerate(SECTION_VECTORS)])
def test_section_formats_whole_and_streamed(name, text, content, calls):
    assert_whole_and_streamed(name, text, content, calls, tools=SCHEMA_TOOLS)


def test_without_schemas_values_are_json_when_they_read_as_json():
    result = tool_call_parser("glm45_moe").parse(
        "<tool_call>f<arg_key>n</arg_key><arg_value>7</arg_value><arg_key>z</arg_key><arg_value>007</arg_value>"
        "<arg_key>s</arg_key><arg_value>x y</arg_value></tool_call>")
    assert json.loads(result.calls[0].arguments) == {"n": 7, "z": "007", "s": "x y"}  # 007 is not JSON: text


# smg's GLM-4.5 and DeepSeek V3.1 vectors (crates/tool_parser/tests/tool_parser_glm4_moe.rs and
# tool_parser_deepseek31.rs, lightseekorg/smg 273bd7c, 186cfc7); any function name is offered, no schemas.
# Where smg differs on purpose: it drops the text after a GLM call ("The weather will be..."), which we keep; and
# in a DeepSeek section with one malformed call it returns the others, where vLLM and SGLang keep the whole
# section as text, as we do (calls the model meant as a set are not run in part).
SMG_SECTION_VECTORS = [
    ("glm45_moe", "Let me search for that.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing"
     "</arg_value>\n<arg_key>date</arg_key>\n<arg_value>2024-12-25</arg_value>\n</tool_call>\nThe weather will be...",
     "Let me search for that.\nThe weather will be...", [call("get_weather", city="Beijing", date="2024-12-25")]),
    ("glm45_moe", "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>rust tutorials</arg_value>\n</tool_call>\n"
     "<tool_call>translate\n<arg_key>text</arg_key>\n<arg_value>Hello World</arg_value>\n<arg_key>target_lang"
     "</arg_key>\n<arg_value>zh</arg_value>\n</tool_call>", "",
     [call("search", query="rust tutorials"), call("translate", text="Hello World", target_lang="zh")]),
    ("glm45_moe", "<tool_call>process\n<arg_key>count</arg_key>\n<arg_value>42</arg_value>\n<arg_key>rate</arg_key>\n"
     "<arg_value>1.5</arg_value>\n<arg_key>enabled</arg_key>\n<arg_value>true</arg_value>\n<arg_key>data</arg_key>\n"
     "<arg_value>null</arg_value>\n<arg_key>text</arg_key>\n<arg_value>string value</arg_value>\n</tool_call>", "",
     [call("process", count=42, rate=1.5, enabled=True, data=None, text="string value")]),
    ("glm45_moe", "<tool_call>test_func\n<arg_key>bool_true</arg_key>\n<arg_value>True</arg_value>\n<arg_key>bool_false"
     "</arg_key>\n<arg_value>False</arg_value>\n<arg_key>none_val</arg_key>\n<arg_value>None</arg_value>\n</tool_call>",
     "", [call("test_func", bool_true=True, bool_false=False, none_val=None)]),
    ("glm45_moe", "<tool_call>echo\n<arg_key>text</arg_key>\n<arg_value>use </arg_value> in docs</arg_value>\n"
     "</tool_call>", "", [call("echo", text="use </arg_value> in docs")]),
    ("glm45_moe", "<tool_call>echo\n<arg_key>text</arg_key>\n<arg_value>see <arg_key> docs</arg_value>\n<arg_key>n"
     "</arg_key>\n<arg_value>2</arg_value>\n</tool_call>", "", [call("echo", text="see <arg_key> docs", n=2)]),
    ("glm45_moe", '<tool_call>process\n<arg_key>data</arg_key>\n<arg_value>{"nested": {"key": "value"}}</arg_value>\n'
     "<arg_key>list</arg_key>\n<arg_value>[1, 2, 3]</arg_value>\n</tool_call>", "",
     [call("process", data={"nested": {"key": "value"}}, list=[1, 2, 3])]),
    ("glm45_moe", "<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>NaN</arg_value>\n</tool_call>", "",
     [call("f", x="NaN")]),  # not JSON: the text
    ("deepseek31", f'Let me check that for you.{B}{CB}get_weather{S}{{"location": "Tokyo", "units": "celsius"}}{CE}{E}',
     "Let me check that for you.", [call("get_weather", location="Tokyo", units="celsius")]),
    ("deepseek31", f'{B}{CB}search{S}{{"query": "rust programming"}}{CE}{CB}translate{S}{{"text": "Hello World", '
     f'"to": "ja"}}{CE}{E}', "", [call("search", query="rust programming"), call("translate", text="Hello World",
                                                                                 to="ja")]),
    ("deepseek31", f'{B}{CB}process{S}{{"data": {{"nested": {{"deep": [1, 2, 3]}}}}}}{CE}{E}', "",
     [call("process", data={"nested": {"deep": [1, 2, 3]}})]),
    ("deepseek31", f'{B}{CB}search{S}{{invalid json}}{CE}{CB}translate{S}{{"text": "hello", "to": "ja"}}{CE}{E}',
     f'{B}{CB}search{S}{{invalid json}}{CE}{CB}translate{S}{{"text": "hello", "to": "ja"}}{CE}{E}', []),
    ("deepseek31", "Just a normal response with no tools.", "Just a normal response with no tools.", []),
]


@pytest.mark.parametrize("name, text, content, calls", SMG_SECTION_VECTORS,
                         ids=[f"{v[0]}-{i}" for i, v in enumerate(SMG_SECTION_VECTORS)])
def test_section_formats_as_smg_reads_them(name, text, content, calls):
    assert_whole_and_streamed(name, text, content, calls)


@pytest.mark.parametrize("name", ["json", "qwen", "llama", "mistral", "deepseek31", "cohere"])
def test_json_a_client_cannot_read_is_not_a_call(name):
    """NaN and Infinity (json.loads takes them, JSON.parse does not), and nesting deeper than Python recurses
    (it raised RecursionError out of the parser): text, never arguments a client cannot parse, never a crash."""
    nan = {"json": '{"name": "get_time", "arguments": {"x": NaN}}',
           "qwen": '<tool_call>{"name": "get_time", "arguments": {"x": Infinity}}</tool_call>',
           "llama": '{"name": "get_time", "parameters": {"x": -Infinity}}',
           "mistral": '[TOOL_CALLS]get_time[ARGS]{"x": NaN}',
           "deepseek31": f'{B}{CB}get_time{S}{{"x": NaN}}{CE}{E}',
           "cohere": '<|START_ACTION|>[{"tool_name": "get_time", "parameters": {"x": NaN}}]<|END_ACTION|>'}[name]
    deep = {"json": "[" * 5000, "qwen": "<tool_call>" + "[" * 5000 + "</tool_call>", "llama": "{" + '"a":{' * 3000,
            "mistral": "[TOOL_CALLS] " + "[" * 5000, "deepseek31": f"{B}{CB}get_time{S}" + '{"a":' * 3000 + f"{CE}{E}",
            "cohere": "<|START_ACTION|>" + "[" * 5000 + "<|END_ACTION|>"}[name]
    for text in (nan, deep):
        result = tool_call_parser(name, WEATHER).parse(text)
        assert (result.content, result.calls) == (text, []), name


def test_required_calls_never_crash_on_deep_nesting():
    result = RequiredCallsParser(WEATHER).parse("[" * 5000)
    assert result.calls == [] and result.content == ""  # the constraint's scaffolding is never content

"""gpt-oss's harmony format through openai-harmony (gateway/parsers/harmony.py) and a chat answer
(chat_output.py): reasoning from the analysis channel, content from final (and preambles), calls from
commentary to=functions.NAME, each vector whole and in seeded random chunkings (the seed in the
failure), on the real o200k vocabulary (tests/harmony_vocab.py)."""

from __future__ import annotations

import json
import random

import pytest

from gateway.parsers import HarmonyParser, ToolCall, harmony_encoding, reasoning_parser
from tests.support.harmony_vocab import harmony_vocabulary
from tests.support.rendering import Rendered, assemble

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module", autouse=True)
def harmony_vocab():
    with harmony_vocabulary():
        yield


def call(name, **arguments):
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather. I should call the tool.<|end|>"
VECTORS = [
    ("reasoning then answer", ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is sunny in Oslo.<|return|>",
     "The user wants the weather. I should call the tool.", "It is sunny in Oslo.", []),
    ("a call", ANALYSIS + "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
     '<|message|>{"city": "Oslo", "days": 2}<|call|>',
     "The user wants the weather. I should call the tool.", "", [call("get_weather", city="Oslo", days=2)]),
    ("recipient before the channel", "<|channel|>analysis<|message|>Time?<|end|><|start|>assistant to=functions.get_time"
     '<|channel|>commentary json<|message|>{"tz": "CET"}<|call|>', "Time?", "", [call("get_time", tz="CET")]),
    ("a preamble, then a call", ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>Checking now.<|end|>"
     '<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{"city": "Zürich 東京"}<|call|>',
     "The user wants the weather. I should call the tool.", "Checking now.",
     [call("get_weather", city="Zürich 東京")]),
    ("invalid arguments are text", ANALYSIS + "<|start|>assistant<|channel|>commentary to=functions.get_weather"
     "<|message|>{not json<|call|>", "The user wants the weather. I should call the tool.", "{not json", []),
    ("an unoffered function is text", "<|channel|>commentary to=functions.rm_rf<|message|>{}<|call|>", "", "{}", []),
    ("the answer ends inside a call", "<|channel|>commentary to=functions.get_time<|message|>{\"tz\": \"UTC\"}",
     "", "", [call("get_time", tz="UTC")]),
    ("not harmony at all", "Plain text, no channels.", "", "Plain text, no channels.", []),
]


def run(parser, text, seed):
    rng = random.Random(seed)
    reasoning = content = ""
    calls = []
    at = 0
    while at < len(text):
        size = rng.choice((1, 2, 3, 5, 8, 13))
        result = parser.feed(text[at:at + size])
        at += size
        reasoning, content, calls = reasoning + result.reasoning, content + result.content, calls + result.calls
    result = parser.finish()
    return reasoning + result.reasoning, content + result.content, calls + result.calls


@pytest.mark.parametrize("label, text, reasoning, content, calls", VECTORS, ids=[v[0] for v in VECTORS])
def test_harmony_whole_and_streamed(label, text, reasoning, content, calls):
    whole = HarmonyParser(TOOLS).parse(text)
    assert (whole.reasoning, whole.content, whole.calls) == (reasoning, content, calls)
    for seed in range(6):
        assert run(HarmonyParser(TOOLS), text, seed) == (reasoning, content, calls), f"seed={seed}"


def test_without_separation_the_analysis_is_content_and_the_reasoning_parser_alone():
    text = VECTORS[0][1]
    result = HarmonyParser(TOOLS, separate_reasoning=False).parse(text)
    assert (result.reasoning, result.content) == ("", "The user wants the weather. I should call the tool."
                                                      "It is sunny in Oslo.")
    alone = reasoning_parser("gpt_oss").parse(text)
    assert (alone.reasoning, alone.content) == (VECTORS[0][2], VECTORS[0][3])


def test_a_chat_answer_from_harmony_streamed_equals_whole():
    from gateway.api.chat_output import ChatOutput
    from gateway.serving.generation import GenerationResult

    text = VECTORS[3][1]
    done = GenerationResult("", list(range(40)), "stop", None, 3, 40, 0, "w")

    def make():
        return Rendered(ChatOutput(HarmonyParser(TOOLS), None, count_tokens=len))

    message = make().full(text, done)["choices"][0]
    assert message["finish_reason"] == "tool_calls"
    assert message["message"]["reasoning_content"] == VECTORS[3][2] and message["message"]["content"] == VECTORS[3][3]
    out, streamed, first = make(), b"", True
    for at in range(0, len(text), 7):
        streamed += out.text_event(text[at:at + 7], first)
        first = False
    streamed += out.final_events(done, include_usage=True)
    _, content, reasoning, calls, finish = assemble(streamed)
    assert (content, reasoning, finish) == (VECTORS[3][3], VECTORS[3][2], "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Zürich 東京"})]
    assert b'"reasoning_tokens":' in streamed


def test_without_the_vocabulary_the_node_refuses_the_flag_and_serves_a_chosen_model_plain(tmp_path, monkeypatch,
                                                                                             caplog):
    import dataclasses

    from gateway.node.config import ConfigError, GatewayConfig, validate
    from gateway.serving.models import usable_parsers

    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))  # an empty directory: no o200k_base
    harmony_encoding.cache_clear()
    with pytest.raises(ConfigError, match="TIKTOKEN_ENCODINGS_BASE"):
        validate(dataclasses.replace(GatewayConfig(), tool_call_parser="gpt_oss"))
    assert usable_parsers("openai/gpt-oss-20b", "gpt_oss", "gpt_oss") == (None, None)
    assert "no harmony parsing" in caplog.text
    assert usable_parsers("Qwen/Qwen3-8B", "qwen", "qwen3") == ("qwen", "qwen3")
    harmony_encoding.cache_clear()

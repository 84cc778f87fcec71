"""Anthropic's Messages API (gateway/api/anthropic.py) driven by the real anthropic SDK over a node and
scripted simulated engines: text, thinking blocks, tool use (streamed = whole, parsed by the SDK's own
types), stop reasons, tool results sent back, tool_choice, count_tokens, errors in Anthropic's shape,
x-api-key."""

from __future__ import annotations

import json

import anthropic
import pytest

from chaos.processes import EngineProcess, NodeProcess

MODEL = "qwen3-sim"
THOUGHT_CALL = ("<think>\nThe user wants Oslo's weather.\n</think>\n\n<tool_call>\n"
                '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>')
THOUGHT_TEXT = "<think>\nA greeting.\n</think>\n\nHello there, how can I help?"
TOOLS = [{"name": "get_weather", "description": "Weather for a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}]
API_KEY = "sk-anthropic-test-key-0123456789"


@pytest.fixture(scope="module")
def node(log_dir, tmp_path_factory):
    script = tmp_path_factory.mktemp("anthropic") / "answers.jsonl"
    rules = [{"match": "It is 12 degrees", "output": "It will be 12 degrees and cloudy in Oslo."},  # a tool result
             {"match": "weather", "output": THOUGHT_CALL},
             {"match": "Hello", "output": THOUGHT_TEXT},
             {"match": "count to five", "output": "one two three four five six seven"}]
    script.write_text("".join(json.dumps(r) + "\n" for r in rules))
    engine = EngineProcess(["--zero-cost", "--script", str(script)], log_dir, "anthropic-engine")
    n = NodeProcess(["--worker-urls", engine.url, "--api-key", API_KEY], log_dir, "anthropic-node")
    yield n
    n.stop()
    engine.stop()


@pytest.fixture(scope="module")
def client(node):
    return anthropic.Anthropic(base_url=node.url, api_key=API_KEY, max_retries=0)  # sent as x-api-key


def ask(client, text, **kwargs):
    return client.messages.create(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": text}],
                                  **kwargs)


def test_text_with_thinking_and_usage(client):
    message = ask(client, "Hello!")
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "\nA greeting.\n" and message.content[1].text == \
        "Hello there, how can I help?"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_tool_use_streamed_equals_whole_and_the_result_goes_back(client):
    message = ask(client, "What is the weather in Oslo?", tools=TOOLS)
    assert message.stop_reason == "tool_use"
    thinking, tool_use = message.content
    assert thinking.type == "thinking" and tool_use.type == "tool_use" and tool_use.id.startswith("toolu_")
    assert (tool_use.name, tool_use.input) == ("get_weather", {"city": "Oslo", "days": 2})
    with client.messages.stream(model=MODEL, max_tokens=256, tools=TOOLS,
                                messages=[{"role": "user", "content": "What is the weather in Oslo?"}]) as stream:
        events = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert events[0] == "message_start" and "content_block_start" in events and events[-1] == "message_stop"
    assert [b.type for b in streamed.content] == ["thinking", "tool_use"] and streamed.stop_reason == "tool_use"
    assert streamed.content[1].input == tool_use.input and streamed.content[0].thinking == thinking.thinking
    # the tool's result, sent back as Anthropic does, reaches the template as a tool message
    follow = client.messages.create(model=MODEL, max_tokens=256, tools=TOOLS, messages=[
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": thinking.thinking, "signature": ""},
                                          {"type": "tool_use", "id": tool_use.id, "name": tool_use.name,
                                           "input": tool_use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                      "content": "It is 12 degrees"}]}])
    assert follow.content[-1].text == "It will be 12 degrees and cloudy in Oslo." and follow.stop_reason == "end_turn"


def test_stop_sequences_max_tokens_and_streamed_text(client):
    cut = ask(client, "Please count to five", stop_sequences=["four"])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", "four")
    assert cut.content[0].text == "one two three "
    short = client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "count to five"}])
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2
    with client.messages.stream(model=MODEL, max_tokens=256,
                                messages=[{"role": "user", "content": "Hello!"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello there, how can I help?" and final.content[0].type == "thinking"


def test_tool_choice_any_and_tool_force_a_call(client):
    forced = ask(client, "Say anything", tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"})
    (tool_use,) = [b for b in forced.content if b.type == "tool_use"]
    assert tool_use.name == "get_weather" and set(tool_use.input) >= {"city", "days"}
    anyone = ask(client, "Say anything", tools=TOOLS, tool_choice={"type": "any"})
    assert anyone.stop_reason == "tool_use" and any(b.type == "tool_use" for b in anyone.content)


def test_thinking_switch_and_count_tokens(client):
    off = ask(client, "Hello!", thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]  # no parser: what a thinking model writes anyway is text
    on = client.messages.create(model=MODEL, max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
                                messages=[{"role": "user", "content": "Hello!"}])
    assert on.content[0].type == "thinking"
    counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hello!"}])
    usage = ask(client, "Hello!").usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_cache_reads_are_not_counted_again_as_input(client, stream):
    """Issue 34: input_tokens included cache_read_input_tokens, and Anthropic's clients add the two: a 133-token
    prompt with 128 cached was counted 261."""
    text = "Hello! " + "You are a careful assistant who answers briefly. " * 20
    counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": text}]).input_tokens
    ask(client, text)  # the engine now holds the prompt's blocks
    if stream:
        with client.messages.stream(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": text}]) as s:
            usage = s.get_final_message().usage
    else:
        usage = ask(client, text).usage
    assert usage.cache_read_input_tokens > 0
    assert usage.input_tokens + usage.cache_read_input_tokens == counted


def test_errors_in_anthropics_shape(client, node):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=256, messages=[{"role": "system", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}],
                               thinking={"type": "enabled", "budget_tokens": 1024})  # budget >= max_tokens
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    stranger = anthropic.Anthropic(base_url=node.url, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        stranger.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "authentication_error"

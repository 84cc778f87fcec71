"""Anthropic's Messages wire as a target (gateway/providers/anthropic.py), reached from every client API: OpenAI chat,
Anthropic's Messages and the Responses API, streamed and not, with tools, thinking, images, structured output,
prompt caching's usage, its overloaded and too-long answers. The provider is a fake of the test's own
(tests/support/fake_providers.py) holding every request to the anthropic SDK's request types."""

from __future__ import annotations

import base64

import anthropic
import httpx2
import openai
import pytest

from chaos.processes import NodeProcess
from tests.support.fake_providers import Failure, FakeAnthropic, FakeOpenAI, Reply, started

KEYS = {"FAKE_ANTHROPIC_KEY": "sk-ant-secret", "FAKE_OPENAI_KEY": "sk-openai-secret"}
PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a")).decode()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def fakes():
    with started({"claude": FakeAnthropic("claude"), "busy": FakeAnthropic("busy"),
                  "gpt": FakeOpenAI("gpt")}) as servers:
        yield servers



@pytest.fixture(scope="module")
def node(fakes, log_dir, tmp_path_factory):
    config = tmp_path_factory.mktemp("routes") / "models.yaml"
    config.write_text(f"""
targets:
  claude:
    provider: anthropic
    model: claude-fake-4
    base_url: {fakes['claude'].url}
    credential: env:FAKE_ANTHROPIC_KEY
    headers: {{anthropic-beta: "fine-grained-tool-streaming-2025-05-14"}}
  busy:
    provider: anthropic
    model: claude-busy
    base_url: {fakes['busy'].url}
    credential: env:FAKE_ANTHROPIC_KEY
  gpt:
    provider: openai
    model: gpt-fake
    base_url: {fakes['gpt'].url}/v1
    credential: env:FAKE_OPENAI_KEY
models:
  claude:
    targets: [claude]
  busy:
    targets: [{{target: busy}}, {{target: gpt, priority: 1}}]
""")
    node = NodeProcess(["--models-config", str(config)], log_dir, "anthropic-node", env=KEYS)
    yield node
    node.stop()




def test_openai_chat_reaches_anthropic_with_its_system_tools_images_and_headers(oai, fakes):
    fakes["claude"].reply = lambda body: Reply(content=None, reasoning="Oslo, then.",
                                               calls=[("get_weather", {"city": "Oslo"})], prompt_tokens=30,
                                               cached_tokens=20)
    reply = oai.chat.completions.create(model="claude", tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False, max_tokens=300,
        stop=["END"], messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather here?"},
                                         {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}])
    message = reply.choices[0].message
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [("get_weather", '{"city":"Oslo"}')]
    assert message.model_extra["reasoning_content"] == "Oslo, then." and reply.model == "claude-fake-4"
    assert message.model_extra["reasoning_signature"] == FakeAnthropic.signature
    assert reply.usage.prompt_tokens == 30 and reply.usage.prompt_tokens_details.cached_tokens == 20
    path, headers, body = fakes["claude"].requests[0]
    assert headers["x-api-key"] == "sk-ant-secret" and headers["anthropic-version"] == "2023-06-01"
    assert headers["anthropic-beta"] == "fine-grained-tool-streaming-2025-05-14"
    assert body["system"] == "Be brief." and body["max_tokens"] == 300 and body["stop_sequences"] == ["END"]
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Weather here?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}]
    assert body["tools"] == [{"name": "get_weather", "description": "Weather now",
                              "input_schema": TOOLS[0]["function"]["parameters"]}]
    assert body["tool_choice"] == {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}


def test_a_tool_result_turn_is_folded_into_alternating_roles(oai, fakes):
    oai.chat.completions.create(model="claude", tools=TOOLS, messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
            {"id": "toolu_2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Bergen"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "14"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "11"},
        {"role": "user", "content": "And tomorrow?"}])
    body = fakes["claude"].requests[0][2]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"][1] == {"type": "tool_use", "id": "toolu_2", "name": "get_weather",
                                                 "input": {"city": "Bergen"}}
    assert [b["type"] for b in body["messages"][2]["content"]] == ["tool_result", "tool_result", "text"]
    assert body["max_tokens"] == 4096  # Anthropic requires one: the default when the client names none


def test_a_wire_without_embeddings_refuses_them_by_name(oai, fakes):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.embeddings.create(model="claude", input="hello")
    assert "'claude'" in refused.value.message and "embeddings" in refused.value.message
    assert refused.value.code == "unsupported_feature" and not fakes["claude"].requests


WEATHER_WITH_THINKING = dict(model="claude", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
                             tools=[{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}],
                             messages=[{"role": "user", "content": "Weather in Oslo?"}])


def _asked(ant, asked, stream):
    """The message a Messages client gets for ``asked``, streamed (as the SDK assembles it) or whole."""
    if stream:
        with ant.messages.stream(**asked) as events:
            return events.get_final_message()
    return ant.messages.create(**asked)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropics_own_clients_get_thinking_text_and_tool_use_blocks(ant, fakes, stream):
    fakes["claude"].reply = lambda body: Reply(content="Looking it up.", reasoning="Need the tool.",
                                               calls=[("get_weather", {"city": "Oslo"})])
    asked = WEATHER_WITH_THINKING
    message = _asked(ant, asked, stream)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == "Need the tool." and message.content[2].input == {"city": "Oslo"}
    assert message.content[0].signature == FakeAnthropic.signature  # Anthropic's, not one of ours
    assert message.stop_reason == "tool_use"
    body = fakes["claude"].requests[0][2]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024} and body.get("stream", False) == stream
    # The next turn sends the blocks back as the SDK has them: Anthropic gets its thinking signed, as it requires
    # of a tool-use turn with thinking on.
    fakes["claude"].reply = lambda body: Reply(content="Fourteen degrees.")
    ant.messages.create(**{**asked, "messages": [*asked["messages"], {"role": "assistant", "content": [
        {"type": "thinking", "thinking": message.content[0].thinking, "signature": message.content[0].signature},
        {"type": "tool_use", "id": message.content[2].id, "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": message.content[2].id, "content": "14"}]}]})
    assistant = fakes["claude"].requests[1][2]["messages"][1]["content"]
    assert assistant[0] == {"type": "thinking", "thinking": "Need the tool.", "signature": FakeAnthropic.signature}


# An answer with what only Anthropic's own blocks carry: redacted thinking, two signed thinking blocks (interleaved
# thinking), a text with its citations field, Anthropic's own tool id.
OWN_BLOCKS = [{"type": "redacted_thinking", "data": "EnCrYpTeD-by-anthropic"},
              {"type": "thinking", "thinking": "First.", "signature": "sig-a"},
              {"type": "thinking", "thinking": "Second.", "signature": "sig-b"},
              {"type": "text", "text": "Looking it up.", "citations": None},
              {"type": "tool_use", "id": "toolu_01AbC", "name": "get_weather", "input": {"city": "Oslo"}}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_messages_client_gets_anthropics_own_answer_and_sends_its_blocks_back_as_they_were(ant, node, fakes,
                                                                                             stream):
    """A Messages client is given the message Anthropic wrote (every block, its id, its usage), as calling Anthropic
    itself, and the next turn gives Anthropic back its thinking block for block, signed and redacted."""
    fakes["claude"].reply = lambda body: Reply(blocks=OWN_BLOCKS, prompt_tokens=30, cached_tokens=20)
    asked = WEATHER_WITH_THINKING
    message = _asked(ant, asked, stream)
    assert [b.model_dump(exclude_none=True) for b in message.content] == [
        {k: v for k, v in b.items() if v is not None} for b in OWN_BLOCKS]
    assert message.id == "msg_fake" and message.model == "claude-fake-4" and message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (10, 20)
    fakes["claude"].reply = lambda body: Reply(content="Fourteen degrees.")
    ant.messages.create(**{**asked, "messages": [
        *asked["messages"], {"role": "assistant", "content": [b.model_dump() for b in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01AbC", "content": "14"}]}]})
    assistant = fakes["claude"].requests[1][2]["messages"][1]["content"]
    assert assistant == [{k: v for k, v in b.items() if k != "citations"} for b in OWN_BLOCKS]


def test_a_messages_stream_from_anthropic_is_its_own_events(node, fakes):
    """The bytes of Anthropic's events reach the client as Anthropic wrote them (the fake writes its JSON with spaces,
    the node's own rendering without), but for the ping before the answer began."""
    fakes["claude"].reply = lambda body: Reply(blocks=OWN_BLOCKS[:2] + OWN_BLOCKS[3:4])
    answer = httpx2.post(node.url + "/v1/messages", headers={"x-api-key": "client-key"}, timeout=30, json={
        "model": "claude", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Hi"}]})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    body = answer.content
    assert body.startswith(b'event: message_start\ndata: {"type": "message_start", "message": {"id": "msg_fake"')
    assert b'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, "content_block": ' \
           b'{"type": "redacted_thinking", "data": "EnCrYpTeD-by-anthropic"}}\n\n' in body
    assert b'{"type": "signature_delta", "signature": "sig-a"}' in body and b"event: ping" not in body
    assert body.endswith(b'event: message_stop\ndata: {"type": "message_stop"}\n\n')


def test_an_error_right_after_message_start_still_moves_a_messages_stream_to_the_next_target(ant, fakes):
    """Anthropic may answer 200 and then an overloaded error as its first event: nothing had gone to the client (the
    passed message_start waits for the answer to begin), so the route moves on."""
    # (a pause after message_start: the node has read it before the error comes)
    fakes["busy"].failures.append(Failure(200, "Overloaded", error_event="overloaded_error", stalls=((1, 0.3),)))
    with ant.messages.stream(model="busy", max_tokens=64, messages=[{"role": "user", "content": "Hi"}]) as events:
        message = events.get_final_message()
    assert message.content[0].text == "Hello from gpt." and len(fakes["busy"].requests) == 1


def test_a_signed_thinking_turn_goes_back_to_anthropic_signed(ant, fakes):
    ant.messages.create(model="claude", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
                        tools=[{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Need the tool.", "signature": "sig-1"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "14"}]}])
    assistant = fakes["claude"].requests[0][2]["messages"][1]["content"]
    assert assistant[0] == {"type": "thinking", "thinking": "Need the tool.", "signature": "sig-1"}


def test_the_responses_api_streams_from_anthropic_and_stores_the_turn(oai, fakes):
    fakes["claude"].reply = lambda body: Reply(content="Fourteen degrees.", reasoning="Easy.")
    events = list(oai.responses.create(model="claude", input="Weather?", reasoning={"effort": "low"}, stream=True,
                                       text={"format": {"type": "json_schema", "name": "w", "schema": {
                                           "type": "object", "properties": {"t": {"type": "number"}}}}}))
    final = events[-1].response
    assert events[-1].type == "response.completed" and final.output_text == "Fourteen degrees."
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert oai.responses.retrieve(final.id).output_text == "Fourteen degrees."
    body = fakes["claude"].requests[0][2]
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"t": {"type": "number"}}}}, "effort": "low"}


def test_an_overloaded_anthropic_falls_back_and_its_errors_reach_clients_in_their_shape(oai, ant, fakes):
    fakes["busy"].failures.append(Failure(529, "Overloaded"))
    reply = oai.chat.completions.create(model="busy", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Hello from gpt."
    fakes["claude"].failures.append(Failure(400, "prompt is too long: 250000 tokens > 200000 maximum"))
    with pytest.raises(anthropic.BadRequestError) as refused:
        ant.messages.create(model="claude", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert "prompt is too long" in str(refused.value) and refused.value.body["type"] == "error"
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="claude", messages=[{"role": "user", "content": "Hi"}], seed=3)
    assert "does not support seed" in refused.value.message
    for asked, feature in (({"n": 2}, "n above 1"), ({"logprobs": True}, "logprobs")):
        with pytest.raises(openai.BadRequestError) as refused:
            oai.chat.completions.create(model="claude", messages=[{"role": "user", "content": "Hi"}], **asked)
        assert "'claude'" in refused.value.message and f"does not support {feature}" in refused.value.message


RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]


def _weather_response(oai, stream: bool):
    """A Responses client's answer (the last event's response, streamed) to a question the tool answers."""
    asked = dict(model="claude", input="Weather in Oslo?", tools=RESPONSES_TOOLS, reasoning={"effort": "low"})
    if stream:
        return [e for e in oai.responses.create(**asked, stream=True)][-1].response
    return oai.responses.create(**asked)


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_chain_with_thinking_and_a_tool_goes_back_to_anthropic_signed(oai, fakes, stream):
    """The reasoning item carries Anthropic's signature (as encrypted_content, where OpenAI's reasoning carries its
    own), and the stored turn continued by id sends the thinking back signed, as Anthropic requires."""
    fakes["claude"].reply = lambda body: Reply(content=None, reasoning="Need the tool.",
                                               calls=[("get_weather", {"city": "Oslo"})])
    first = _weather_response(oai, stream)
    reasoning = [item for item in first.output if item.type == "reasoning"][0]
    assert reasoning.encrypted_content == FakeAnthropic.signature
    call = [item for item in first.output if item.type == "function_call"][0]
    fakes["claude"].reply = lambda body: Reply(content="Fourteen degrees.")
    second = oai.responses.create(model="claude", previous_response_id=first.id, tools=RESPONSES_TOOLS,
                                  input=[{"type": "function_call_output", "call_id": call.call_id, "output": "14"}])
    assert second.output_text == "Fourteen degrees."
    assistant = fakes["claude"].requests[1][2]["messages"][1]["content"]
    assert assistant[0] == {"type": "thinking", "thinking": "Need the tool.", "signature": FakeAnthropic.signature}
    assert assistant[1]["type"] == "tool_use"


def _chat_thinking_blocks(oai, asked: dict, stream: bool) -> "tuple[list, object]":
    """A chat client's ``thinking_blocks`` (LiteLLM's field: whole on the message, streamed a block a delta) and its
    tool call."""
    if not stream:
        message = oai.chat.completions.create(**asked).choices[0].message
        return message.model_extra["thinking_blocks"], message.tool_calls[0]
    blocks, calls = [], []
    for chunk in oai.chat.completions.create(**asked, stream=True):
        if chunk.choices:
            blocks += chunk.choices[0].delta.model_extra.get("thinking_blocks") or []
            calls += chunk.choices[0].delta.tool_calls or []
    return blocks, calls[0]


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_client_gets_every_thinking_block_and_sends_them_back(oai, fakes, stream):
    """Anthropic's redacted thinking and several signed blocks (interleaved thinking) reach a chat client block by
    block, each signature with its own text, and its next turn gives Anthropic back exactly those blocks."""
    fakes["claude"].reply = lambda body: Reply(blocks=OWN_BLOCKS)
    asked = dict(model="claude", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS,
                 reasoning_effort="low")
    blocks, call = _chat_thinking_blocks(oai, asked, stream)
    assert blocks == OWN_BLOCKS[:3]
    fakes["claude"].reply = lambda body: Reply(content="Fourteen degrees.")
    oai.chat.completions.create(**{**asked, "messages": [*asked["messages"], {
        "role": "assistant", "content": None, "thinking_blocks": blocks,
        "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                                       "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "14"}]})
    assistant = fakes["claude"].requests[1][2]["messages"][1]["content"]
    assert assistant[:3] == OWN_BLOCKS[:3] and assistant[3]["type"] == "tool_use"


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_chain_keeps_every_thinking_block_and_gives_them_back(oai, fakes, stream):
    """Each of Anthropic's thinking blocks is a reasoning item with its own signature (a redacted one marked in
    encrypted_content, no text); the turn continued by id gives Anthropic back the blocks as they were."""
    fakes["claude"].reply = lambda body: Reply(blocks=OWN_BLOCKS)
    first = _weather_response(oai, stream)
    reasoning = [item for item in first.output if item.type == "reasoning"]
    assert [(item.encrypted_content, [c.text for c in item.content or ()]) for item in reasoning] == [
        ("redacted_thinking:EnCrYpTeD-by-anthropic", []), ("sig-a", ["First."]), ("sig-b", ["Second."])]
    call = [item for item in first.output if item.type == "function_call"][0]
    fakes["claude"].reply = lambda body: Reply(content="Fourteen degrees.")
    oai.responses.create(model="claude", previous_response_id=first.id, tools=RESPONSES_TOOLS,
                         input=[{"type": "function_call_output", "call_id": call.call_id, "output": "14"}])
    assistant = fakes["claude"].requests[1][2]["messages"][1]["content"]
    assert assistant[:3] == OWN_BLOCKS[:3] and assistant[-1]["type"] == "tool_use"

"""AWS Bedrock's Converse wire as a target (gateway/providers/bedrock.py): every call signed with SigV4 by botocore
from AWS's credential chain (the environment here), checked again by the fake Bedrock; bodies held to botocore's
bedrock-runtime service model; streams in AWS's binary event stream; from OpenAI chat, Anthropic's Messages and the
Responses API; throttling and validation errors as each client's."""

from __future__ import annotations

import base64
import json

import anthropic
import openai
import pytest

from gateway.providers.base import ProviderError
from gateway.providers.eventstream import EventStreamDecoder
from tests.support.fake_providers import AWS_KEYS, Failure, FakeBedrock, FakeOpenAI, Reply, event_message, \
    routed_node, started

PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000")).decode()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def fakes():
    with started({"bedrock": FakeBedrock("bedrock"), "spare": FakeOpenAI("spare")}) as servers:
        yield servers



@pytest.fixture(scope="module")
def node(fakes, log_dir, tmp_path_factory):
    node = routed_node(f"""
[targets.claude-on-aws]
provider = "bedrock"
model = "us.anthropic.claude-fake-v1:0"
base_url = "{fakes['bedrock'].url}"
region = "{FakeBedrock.region}"

[targets.spare]
provider = "openai"
model = "gpt-spare"
base_url = "{fakes['spare'].url}/v1"
credential = "env:FAKE_OPENAI_KEY"

[models.aws]
targets = ["claude-on-aws"]

[models.aws-first]
targets = [{{ target = "claude-on-aws" }}, {{ target = "spare", priority = 1 }}]
""", tmp_path_factory.mktemp("routes"), log_dir, "bedrock-node", {**AWS_KEYS, "FAKE_OPENAI_KEY": "sk-spare"})
    yield node
    node.stop()



@pytest.mark.parametrize("stream", [False, True])
def test_a_signed_converse_call_with_tools_images_and_reasoning(oai, fakes, stream):
    fakes["bedrock"].reply = lambda body: Reply(content=None, reasoning="Use the tool.",
                                                calls=[("get_weather", {"city": "Oslo"})], cached_tokens=4)
    asked = dict(model="aws", tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0.2, stop=["END"],
                 messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
                     {"type": "text", "text": "Weather here?"},
                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}])
    if stream:
        chunks = list(oai.chat.completions.create(**asked, stream=True, stream_options={"include_usage": True}))
        pieces = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
        name = "".join(p.function.name or "" for p in pieces)
        arguments = "".join(p.function.arguments or "" for p in pieces)
        reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks
                            if c.choices)
        signature = "".join(c.choices[0].delta.model_extra.get("reasoning_signature") or "" for c in chunks
                            if c.choices)
        usage = chunks[-1].usage
    else:
        reply = oai.chat.completions.create(**asked)
        call = reply.choices[0].message.tool_calls[0]
        name, arguments = call.function.name, call.function.arguments
        reasoning = reply.choices[0].message.model_extra["reasoning_content"]
        signature = reply.choices[0].message.model_extra["reasoning_signature"]
        usage = reply.usage
    assert (name, json.loads(arguments), reasoning) == ("get_weather", {"city": "Oslo"}, "Use the tool.")
    assert signature == "sig-bedrock"  # the client sends it back with the reasoning (a later turn's reasoningContent)
    assert usage.prompt_tokens == 11 and usage.prompt_tokens_details.cached_tokens == 4
    path, headers, body = fakes["bedrock"].requests[0]
    assert path == "/model/us.anthropic.claude-fake-v1%3A0/" + ("converse-stream" if stream else "converse")
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDFAKEEXAMPLE/")
    assert body["system"] == [{"text": "Be brief."}]
    assert body["inferenceConfig"] == {"maxTokens": 200, "temperature": 0.2, "stopSequences": ["END"]}
    assert body["messages"][0]["content"][1] == {"image": {"format": "png", "source": {"bytes": PNG}}}
    assert body["toolConfig"]["toolChoice"] == {"any": {}}
    assert body["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"] == {"json": TOOLS[0]["function"]["parameters"]}


def test_the_messages_and_responses_clients_reach_bedrock(node, oai, fakes):
    client = anthropic.Anthropic(base_url=node.url, api_key="client-key", max_retries=0)
    with client.messages.stream(model="aws", max_tokens=100, messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "tooluse_1", "name": "get_weather",
                                               "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tooluse_1", "content": "14"}]}],
            tools=[{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]) as events:
        assert "".join(events.text_stream) == "Hello from bedrock."
    sent = fakes["bedrock"].requests[0][2]["messages"]
    assert sent[1]["content"] == [{"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather",
                                               "input": {"city": "Oslo"}}}]
    assert sent[2]["content"] == [{"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": "14"}],
                                                  "status": "success"}}]
    response = oai.responses.create(model="aws", input="Weather?", text={"format": {
        "type": "json_schema", "name": "w", "schema": {"type": "object"}}})
    assert response.output_text == "Hello from bedrock."
    assert fakes["bedrock"].requests[1][2]["outputConfig"] == {"textFormat": {"type": "json_schema", "structure": {
        "jsonSchema": {"schema": '{"type":"object"}', "name": "w"}}}}


def test_throttling_falls_back_and_a_validation_error_is_the_clients(oai, fakes):
    fakes["bedrock"].failures.append(Failure(429, "Too many requests, please wait before trying again."))
    reply = oai.chat.completions.create(model="aws-first", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Hello from spare."
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="aws", messages=[{"role": "user", "content": "Hi"}], seed=1)
    assert "does not support seed" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="aws", messages=[{"role": "user", "content": [
            {"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}])
    assert "images by URL" in refused.value.message


def test_the_event_stream_decoder_reads_cut_messages_and_refuses_broken_ones():
    messages = event_message({":event-type": "messageStart", ":message-type": "event"}, b'{"role":"assistant"}') + \
        event_message({":event-type": "messageStop", ":message-type": "event"}, b'{"stopReason":"end_turn"}')
    for cut in range(1, len(messages)):
        decoder = EventStreamDecoder()
        found = decoder.feed(messages[:cut]) + decoder.feed(messages[cut:])
        assert [(h[":event-type"], p) for h, p in found] == [("messageStart", b'{"role":"assistant"}'),
                                                             ("messageStop", b'{"stopReason":"end_turn"}')], cut
    broken = bytearray(messages)
    broken[30] ^= 0xFF  # a header byte: the message's CRC no longer matches
    with pytest.raises(ProviderError, match="CRC"):
        EventStreamDecoder().feed(bytes(broken))
    with pytest.raises(ProviderError, match="at most"):
        EventStreamDecoder(message_bytes_max=20).feed(messages)


# Claude on Bedrock, interleaved thinking with a redacted block: its blocks in Anthropic's form (FakeBedrock gives
# them as Converse's; a redacted block's data is a blob, base64 in the JSON protocol).
THINKING_BLOCKS = [{"type": "redacted_thinking", "data": base64.b64encode(b"encrypted by Bedrock").decode()},
                   {"type": "thinking", "thinking": "First.", "signature": "sig-a"},
                   {"type": "thinking", "thinking": "Second.", "signature": "sig-b"}]
CALLED = [*THINKING_BLOCKS, {"type": "tool_use", "id": "tooluse_7", "name": "get_weather", "input": {"city": "Oslo"}}]


@pytest.mark.parametrize("stream", [False, True])
def test_every_reasoning_block_reaches_the_client_and_goes_back_to_bedrock(node, oai, fakes, stream):
    """Bedrock's redacted reasoning and several signed blocks reach a Messages client as thinking blocks and a chat
    client as ``thinking_blocks``, block by block; the next turn gives Bedrock back its reasoningContent as it was."""
    fakes["bedrock"].reply = lambda body: Reply(blocks=CALLED)
    client = anthropic.Anthropic(base_url=node.url, api_key="client-key", max_retries=0)
    asked = dict(model="aws", max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 1024},
                 messages=[{"role": "user", "content": "Weather in Oslo?"}],
                 tools=[{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}])
    if stream:
        with client.messages.stream(**asked) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**asked)
    assert [b.model_dump(exclude_none=True) for b in message.content][:3] == THINKING_BLOCKS
    chat = dict(model="aws", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS)
    if stream:
        chunks = [c for c in oai.chat.completions.create(**chat, stream=True) if c.choices]
        blocks = [b for c in chunks for b in c.choices[0].delta.model_extra.get("thinking_blocks") or ()]
    else:
        blocks = oai.chat.completions.create(**chat).choices[0].message.model_extra["thinking_blocks"]
    assert blocks == THINKING_BLOCKS
    fakes["bedrock"].reply = lambda body: Reply(content="Fourteen degrees.")
    client.messages.create(**{**asked, "messages": [*asked["messages"], {
        "role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": message.content[-1].id,
                                      "content": "14"}]}]})
    sent = fakes["bedrock"].requests[2][2]["messages"][1]["content"]
    assert sent[:3] == [{"reasoningContent": {"redactedContent": THINKING_BLOCKS[0]["data"]}},
                        {"reasoningContent": {"reasoningText": {"text": "First.", "signature": "sig-a"}}},
                        {"reasoningContent": {"reasoningText": {"text": "Second.", "signature": "sig-b"}}}]

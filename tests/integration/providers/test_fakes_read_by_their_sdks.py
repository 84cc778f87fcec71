"""The fake providers' answers read by each provider's official SDK pointed at them directly (no node between): the
openai SDK (chat completions and the Responses API), the anthropic SDK, google-genai and botocore's bedrock-runtime
client (its SigV4 signing, its rest-json and event stream parsers over the service model), whole and streamed, with
reasoning, text and a tool call. What the gateway is tested against is then what the providers' own clients read:
a field a fake misspelt would be dropped by the SDK (they skip names they do not know), so the values are checked
too, not only that parsing raised nothing."""

from __future__ import annotations

import base64
import json

import anthropic
import openai
import pytest

from tests.support.fake_providers import AWS_KEYS, FakeAnthropic, FakeBedrock, FakeGemini, FakeOpenAI, Reply, started

CALL = ("get_weather", {"city": "Oslo"})
REPLY = Reply(content="Fourteen degrees.", reasoning="Need the tool.", calls=[CALL], prompt_tokens=20,
              completion_tokens=9, cached_tokens=4)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def fakes():
    with started({"openai": FakeOpenAI("openai"), "anthropic": FakeAnthropic("anthropic"),
                  "gemini": FakeGemini("gemini"), "bedrock": FakeBedrock("bedrock")}) as servers:
        yield servers


@pytest.fixture(autouse=True)
def replying(fakes):
    for server in fakes.values():
        server.reply = lambda body: REPLY


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_completions(fakes, stream):
    client = openai.OpenAI(base_url=fakes["openai"].url + "/v1", api_key="sk-fake", max_retries=0)
    asked = dict(model="gpt-fake", messages=[{"role": "user", "content": "Weather?"}], tools=[
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}])
    if stream:
        chunks = list(client.chat.completions.create(**asked, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = chunks[-1].usage
        name, arguments = calls[0].function.name, "".join(call.function.arguments or "" for call in calls)
    else:
        answer = client.chat.completions.create(**asked)
        text, finish, usage = answer.choices[0].message.content, [answer.choices[0].finish_reason], answer.usage
        name, arguments = answer.choices[0].message.tool_calls[0].function.name, \
            answer.choices[0].message.tool_calls[0].function.arguments
    assert text == "Fourteen degrees." and finish == ["tool_calls"]
    assert (name, json.loads(arguments)) == CALL
    assert (usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens) == (20, 9, 4)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses(fakes, stream):
    client = openai.OpenAI(base_url=fakes["openai"].url + "/v1", api_key="sk-fake", max_retries=0)
    asked = dict(model="gpt-fake", input="Weather?", reasoning={"effort": "low"},
                 tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False}])
    if stream:
        events = list(client.responses.create(**asked, stream=True))
        assert events[-1].type == "response.completed"
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == "Fourteen degrees."
        response = events[-1].response
    else:
        response = client.responses.create(**asked)
    assert response.output_text == "Fourteen degrees."
    kinds = [item.type for item in response.output]
    assert "reasoning" in kinds and "function_call" in kinds
    call = [item for item in response.output if item.type == "function_call"][0]
    assert (call.name, json.loads(call.arguments)) == CALL
    assert (response.usage.input_tokens, response.usage.output_tokens) == (20, 9)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages(fakes, stream):
    client = anthropic.Anthropic(base_url=fakes["anthropic"].url, api_key="sk-ant-fake", max_retries=0)
    asked = dict(model="claude-fake", max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 512},
                 tools=[{"name": "get_weather", "input_schema": WEATHER}],
                 messages=[{"role": "user", "content": "Weather?"}])
    if stream:
        with client.messages.stream(**asked) as events:
            texts = "".join(events.text_stream)
            message = events.get_final_message()
        assert texts == "Fourteen degrees."
    else:
        message = client.messages.create(**asked)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == "Need the tool." and message.content[0].signature == FakeAnthropic.signature
    assert (message.content[2].name, message.content[2].input) == CALL and message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens, message.usage.output_tokens) == \
        (16, 4, 9)


@pytest.mark.parametrize("stream", [False, True])
def test_google_genai(fakes, stream):
    from google import genai
    from google.genai import types

    # (v1beta: the API the gateway's Gemini wire calls; this SDK's default is v1)
    client = genai.Client(api_key="fake-gemini-key", http_options=types.HttpOptions(base_url=fakes["gemini"].url,
                                                                                    api_version="v1beta"))
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name="get_weather", parameters_json_schema=
                                                                           WEATHER)])],
        thinking_config=types.ThinkingConfig(include_thoughts=True))
    if stream:
        answers = list(client.models.generate_content_stream(model="gemini-fake", contents="Weather?", config=config))
    else:
        answers = [client.models.generate_content(model="gemini-fake", contents="Weather?", config=config)]
    parts = [part for answer in answers for candidate in answer.candidates or () for part in candidate.content.parts]
    assert "".join(p.text for p in parts if p.text and not p.thought) == "Fourteen degrees."
    assert "".join(p.text for p in parts if p.text and p.thought) == "Need the tool."
    calls = [p.function_call for p in parts if p.function_call]
    assert [(c.name, c.args) for c in calls] == [CALL]
    assert any(p.thought_signature == base64.b64decode(FakeGemini.signature) for p in parts
               if p.function_call)
    usage = answers[-1].usage_metadata
    assert (usage.prompt_token_count, usage.cached_content_token_count) == (20, 4)


@pytest.mark.parametrize("stream", [False, True])
def test_botocore_bedrock_runtime(fakes, stream):
    import botocore.session

    session = botocore.session.get_session()
    client = session.create_client(
        "bedrock-runtime", region_name=FakeBedrock.region, endpoint_url=fakes["bedrock"].url,
        aws_access_key_id=AWS_KEYS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=AWS_KEYS["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=AWS_KEYS["AWS_SESSION_TOKEN"])
    asked = dict(modelId="us.anthropic.claude-fake-v1:0",
                 messages=[{"role": "user", "content": [{"text": "Weather?"}]}],
                 toolConfig={"tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {"json": WEATHER}}}]})
    if not stream:
        answer = client.converse(**asked)
        blocks = answer["output"]["message"]["content"]
        assert blocks[0]["reasoningContent"]["reasoningText"] == {"text": "Need the tool.", "signature": "sig-bedrock"}
        assert blocks[1] == {"text": "Fourteen degrees."}
        assert (blocks[2]["toolUse"]["name"], blocks[2]["toolUse"]["input"]) == CALL
        stop, usage = answer["stopReason"], answer["usage"]
    else:
        events = list(client.converse_stream(**asked)["stream"])
        deltas = [e["contentBlockDelta"]["delta"] for e in events if "contentBlockDelta" in e]
        assert "".join(d.get("text", "") for d in deltas) == "Fourteen degrees."
        reasoning = [d["reasoningContent"] for d in deltas if "reasoningContent" in d]
        assert "".join(r.get("text", "") for r in reasoning) == "Need the tool."
        assert [r["signature"] for r in reasoning if "signature" in r] == ["sig-bedrock"]
        start = [e["contentBlockStart"]["start"]["toolUse"] for e in events if "contentBlockStart" in e]
        arguments = "".join(d["toolUse"]["input"] for d in deltas if "toolUse" in d)
        assert [(s["name"], json.loads(arguments)) for s in start] == [CALL]
        stop = [e["messageStop"]["stopReason"] for e in events if "messageStop" in e][0]
        usage = [e["metadata"]["usage"] for e in events if "metadata" in e][0]
    assert stop == "tool_use" and (usage["inputTokens"], usage["cacheReadInputTokens"]) == (16, 4)

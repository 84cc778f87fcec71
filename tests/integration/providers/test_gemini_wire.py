"""Google Gemini's generateContent wire as a target (gateway/providers/gemini.py), from every client API: function
calls whose thought signatures go back to Gemini with them, thinking, images, JSON schemas, a 429 whose wait is in
its RetryInfo. The provider is a fake of the test's own holding each part of a request to the google-genai SDK's
models (tests/support/fake_providers.py)."""

from __future__ import annotations

import base64

import openai
import pytest

from tests.support.fake_providers import Failure, FakeGemini, FakeOpenAI, Reply, routed_node, started

KEYS = {"FAKE_GEMINI_KEY": "gemini-secret", "FAKE_OPENAI_KEY": "sk-openai-secret"}
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0fake").decode()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def fakes():
    with started({"gemini": FakeGemini("gemini"), "spare": FakeOpenAI("spare")}) as servers:
        yield servers



@pytest.fixture(scope="module")
def node(fakes, log_dir, tmp_path_factory):
    node = routed_node(f"""
[targets.gemini]
provider = "gemini"
model = "gemini-fake-3"
base_url = "{fakes['gemini'].url}"
credential = "env:FAKE_GEMINI_KEY"

[targets.spare]
provider = "openai"
model = "gpt-spare"
base_url = "{fakes['spare'].url}/v1"
credential = "env:FAKE_OPENAI_KEY"

[models.gemini]
targets = ["gemini"]

[models.gemini-first]
targets = [{{ target = "gemini" }}, {{ target = "spare", priority = 1 }}]
""", tmp_path_factory.mktemp("routes"), log_dir, "gemini-node", KEYS)
    yield node
    node.stop()



@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_comes_back_and_its_signature_returns_to_gemini(oai, fakes, stream):
    fakes["gemini"].reply = lambda body: Reply(content=None, reasoning="Needs the tool.",
                                               calls=[("get_weather", {"city": "Oslo"})], reasoning_tokens=3)
    asked = dict(model="gemini", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
                     {"type": "text", "text": "Weather here?"},
                     {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{JPEG}"}}]}])
    if stream:
        chunks = list(oai.chat.completions.create(**asked, stream=True))
        pieces = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
        call_id = next(p.id for p in pieces if p.id)
        arguments = "".join(p.function.arguments or "" for p in pieces)
        reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks
                            if c.choices)
    else:
        reply = oai.chat.completions.create(**asked)
        call = reply.choices[0].message.tool_calls[0]
        call_id, arguments = call.id, call.function.arguments
        reasoning = reply.choices[0].message.model_extra["reasoning_content"]
        assert reply.usage.completion_tokens_details.reasoning_tokens == 3 and reply.usage.completion_tokens == 10
    assert arguments == '{"city":"Oslo"}' and reasoning == "Needs the tool."
    path, headers, body = fakes["gemini"].requests[0]
    assert path.startswith("/v1beta/models/gemini-fake-3:") and headers["x-goog-api-key"] == "gemini-secret"
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert body["contents"][0]["parts"][1] == {"inlineData": {"mimeType": "image/jpeg", "data": JPEG}}
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}}
    assert body["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"] == TOOLS[0]["function"]["parameters"]
    # The next turn sends the call back with the result: Gemini gets its signature with it, and the function's name
    # with the result (it names functions, not call ids).
    fakes["gemini"].reply = lambda body: Reply(content="It is 14 degrees.")
    answer = oai.chat.completions.create(model="gemini", tools=TOOLS, messages=[
        {"role": "user", "content": "Weather here?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "14"}])
    assert answer.choices[0].message.content == "It is 14 degrees."
    assert fakes["gemini"].signatures == [FakeGemini.signature]
    sent = fakes["gemini"].requests[1][2]["contents"]
    assert [c["role"] for c in sent] == ["user", "model", "user"]
    assert sent[2]["parts"] == [{"functionResponse": {"name": "get_weather", "response": {"result": "14"}}}]


def test_messages_and_responses_clients_reach_gemini_with_thinking_and_schemas(ant, oai, fakes):
    fakes["gemini"].reply = lambda body: Reply(content='{"t": 14}', reasoning="Simple.")
    message = ant.messages.create(model="gemini", max_tokens=2000, messages=[{"role": "user", "content": "Weather?"}],
                                  thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in message.content] == ["thinking", "text"] and message.stop_reason == "end_turn"
    config = fakes["gemini"].requests[0][2]["generationConfig"]
    assert config["thinkingConfig"] == {"thinkingBudget": 1024, "includeThoughts": True}
    assert config["maxOutputTokens"] == 2000
    response = oai.responses.create(model="gemini", input="Weather?", reasoning={"effort": "high"}, text={
        "format": {"type": "json_schema", "name": "w", "schema": {"type": "object", "properties": {
            "t": {"type": "number"}}}}})
    assert response.output_text == '{"t": 14}' and [i.type for i in response.output] == ["reasoning", "message"]
    config = fakes["gemini"].requests[1][2]["generationConfig"]
    assert config["responseMimeType"] == "application/json" and config["thinkingConfig"]["thinkingLevel"] == "HIGH"
    assert config["responseJsonSchema"] == {"type": "object", "properties": {"t": {"type": "number"}}}


def test_a_429_waits_as_its_retry_info_says_and_the_next_target_answers(oai, fakes):
    fakes["gemini"].failures.append(Failure(429, "Resource has been exhausted"))
    for _ in range(2):
        reply = oai.chat.completions.create(model="gemini-first", messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content == "Hello from spare."
    assert len(fakes["gemini"].requests) == 1  # cooling down for the 20 s its RetryInfo asked
    with pytest.raises(openai.RateLimitError) as limited:
        oai.chat.completions.create(model="gemini", messages=[{"role": "user", "content": "Hi"}])
    assert 1 <= int(limited.value.response.headers["retry-after"]) <= 20

"""Targets on OpenAI's Responses API (``api = "responses"``, gateway/providers/openai_responses.py) behind a node,
driven with the openai and anthropic SDKs: every client API reaches it, whole and streamed; messages, tool calls and
results, images, reasoning (with its summary), structured output and usage are translated both ways; nothing is
stored at the provider; Azure's path and key; what the API lacks is a 400 naming it; a 5xx falls back.

The provider is a fake server (tests/support/fake_providers.py) that holds every request to the openai SDK's
``ResponseCreateParams`` and answers with a ``Response`` and stream events the SDK's models parse."""

from __future__ import annotations

import openai
import pytest

from tests.support.fake_providers import Failure, FakeOpenAI, Reply, routed_node, started

KEYS = {"FAKE_KEY": "sk-responses-secret"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def fakes():
    with started({name: FakeOpenAI(name) for name in ("openai", "azure", "compat")}) as servers:
        yield servers


@pytest.fixture(scope="module")
def node(fakes, log_dir, tmp_path_factory):
    node = routed_node(f"""
[targets.reasoner]
provider = "openai"
model = "o-fake"
base_url = "{fakes['openai'].url}/v1"
credential = "env:FAKE_KEY"
api = "responses"
reasoning_summary = "auto"

[targets.azure]
provider = "azure"
model = "my-deployment"
base_url = "{fakes['azure'].url}"
credential = "env:FAKE_KEY"
api_version = "2025-04-01-preview"
api = "responses"

[targets.compat]
provider = "openai_compatible"
model = "served-model"
base_url = "{fakes['compat'].url}/v1"
api = "responses"

[models.reasoner]
targets = [{{ target = "reasoner" }}, {{ target = "compat", priority = 1 }}]

[models.azure]
targets = ["azure"]
""", tmp_path_factory.mktemp("routes"), log_dir, "responses-wire-node", KEYS)
    yield node
    node.stop()


def test_a_chat_request_goes_out_as_input_items_and_nothing_is_stored_there(oai, fakes):
    reply = oai.chat.completions.create(model="reasoner", messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}], max_tokens=20,
        temperature=0.5, top_p=0.9)
    assert reply.choices[0].message.content == "Hello from openai." and reply.choices[0].finish_reason == "stop"
    assert reply.model == "o-fake" and reply.usage.prompt_tokens == 11 and reply.usage.completion_tokens == 7
    path, headers, body = fakes["openai"].requests[0]
    assert path == "/v1/responses" and headers["authorization"] == "Bearer sk-responses-secret"
    assert body == {"model": "o-fake", "input": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Hi!"}],
                    "store": False, "max_output_tokens": 20, "temperature": 0.5, "top_p": 0.9,
                    "reasoning": {"summary": "auto"}}  # the target asks for the summary of its reasoning


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_and_the_reasoning_summary_come_back_in_openais_fields(oai, fakes, stream):
    fakes["openai"].reply = lambda body: Reply(content=None, reasoning="The user wants weather.",
                                              calls=[("get_weather", {"city": "Oslo"})], reasoning_tokens=5)
    asked = dict(model="reasoner", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS,
                 tool_choice="required", parallel_tool_calls=False, reasoning_effort="high")
    if not stream:
        reply = oai.chat.completions.create(**asked)
        assert reply.choices[0].finish_reason == "tool_calls"
        message = reply.choices[0].message
        calls, reasoning = message.tool_calls, message.model_extra["reasoning_content"]
        assert reply.usage.completion_tokens_details.reasoning_tokens == 5
    else:
        chunks = list(oai.chat.completions.create(**asked, stream=True))
        reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or ""
                            for c in chunks if c.choices)
        pieces = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
        calls = [openai.types.chat.ChatCompletionMessageToolCall(  # OpenAI's stream: a call's pieces by index
            id=next(p.id for p in pieces if p.index == index and p.id), type="function", function={
                "name": "".join(p.function.name or "" for p in pieces if p.index == index),
                "arguments": "".join(p.function.arguments or "" for p in pieces if p.index == index)})
            for index in sorted({p.index for p in pieces})]
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
            ["tool_calls"]
    assert reasoning == "The user wants weather."
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == \
        [("call_0", "get_weather", '{"city": "Oslo"}')]
    body = fakes["openai"].requests[0][2]
    assert body["tools"] == [{"type": "function", "name": "get_weather", "description": "The weather in a city",
                              "parameters": TOOLS[0]["function"]["parameters"], "strict": False}]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}


def test_a_tool_result_and_an_image_go_back_as_their_items(oai, fakes):
    fakes["openai"].reply = lambda body: Reply(content="It is 14 degrees.")
    oai.chat.completions.create(model="reasoner", tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "get_weather"}}, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Where is this?"},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/oslo.png",
                                                                         "detail": "low"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_9", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "14"}])
    body = fakes["openai"].requests[0][2]
    assert body["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "Where is this?"},
                                     {"type": "input_image", "image_url": "https://example.com/oslo.png",
                                      "detail": "low"}]},
        {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_9", "output": "14"}]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_structured_output_is_text_format_and_a_cut_answer_is_length(oai, fakes):
    fakes["openai"].reply = lambda body: Reply(content='{"a": 1', finish="length")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    reply = oai.chat.completions.create(model="reasoner", messages=[{"role": "user", "content": "JSON"}],
                                        response_format={"type": "json_schema", "json_schema": {
                                            "name": "thing", "schema": schema, "strict": True}})
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content == '{"a": 1'
    assert fakes["openai"].requests[0][2]["text"] == {"format": {"type": "json_schema", "name": "thing",
                                                                 "schema": schema, "strict": True}}


def test_the_responses_api_in_front_continues_through_the_responses_api_behind(oai, fakes):
    first = oai.responses.create(model="reasoner", input="Remember the word 'plum'.")
    assert first.output_text == "Hello from openai." and first.model == "o-fake"
    streamed = list(oai.responses.create(model="reasoner", previous_response_id=first.id, input="Which word?",
                                         stream=True))
    assert streamed[-1].type == "response.completed" and streamed[-1].response.output_text == "Hello from openai."
    assert [e.delta for e in streamed if e.type == "response.output_text.delta"][:2] == ["Hello ", "from "]
    sent = fakes["openai"].requests[1][2]
    assert sent["input"] == [{"role": "user", "content": "Remember the word 'plum'."},
                             {"role": "assistant", "content": "Hello from openai."},
                             {"role": "user", "content": "Which word?"}]
    assert sent["store"] is False and sent["stream"] is True
    assert oai.responses.retrieve(streamed[-1].response.id).output_text == "Hello from openai."  # stored by us


def test_anthropics_messages_reach_it_streamed(ant, fakes):
    fakes["openai"].reply = lambda body: Reply(content="Short answer.", reasoning="Thinking it over.")
    with ant.messages.stream(model="reasoner", max_tokens=64, system="Be brief.",
                             messages=[{"role": "user", "content": "Hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Short answer." and final.stop_reason == "end_turn"
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == \
        "Thinking it over."
    assert fakes["openai"].requests[0][2]["input"][0] == {"role": "system", "content": "Be brief."}


def test_azure_is_called_at_its_responses_path_with_the_deployment_as_the_model(oai, fakes):
    reply = oai.chat.completions.create(model="azure", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Hello from azure."
    path, headers, body = fakes["azure"].requests[0]
    assert path == "/openai/responses?api-version=2025-04-01-preview"
    assert headers["api-key"] == "sk-responses-secret" and "authorization" not in headers
    assert body["model"] == "my-deployment"
    answer = oai.embeddings.create(model="azure", input="a cat")  # embeddings stay at the deployment
    assert len(answer.data) == 1
    assert fakes["azure"].requests[1][0] == "/openai/deployments/my-deployment/embeddings?api-version=" \
                                            "2025-04-01-preview"


@pytest.mark.parametrize("asked, param", [({"stop": ["END"]}, "stop"), ({"seed": 7}, "seed"),
                                          ({"frequency_penalty": 0.5}, "frequency_penalty")])
def test_what_the_responses_api_lacks_is_a_400_naming_it(oai, fakes, asked, param):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="reasoner", messages=[{"role": "user", "content": "Hi"}], **asked)
    assert refused.value.body["param"] == param and "reasoner" in refused.value.body["message"]
    assert not fakes["openai"].requests and not fakes["compat"].requests


@pytest.mark.parametrize("stream", [False, True])
def test_a_5xx_falls_back_to_the_next_responses_target_and_a_failed_stream_is_an_error(oai, fakes, stream):
    fakes["openai"].failures.append(Failure(503))
    asked = dict(model="reasoner", messages=[{"role": "user", "content": "Hi"}])
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(**asked, stream=True)
                       if c.choices)
    else:
        text = oai.chat.completions.create(**asked).choices[0].message.content
    assert text == "Hello from compat." and fakes["compat"].requests[0][0] == "/v1/responses"
    assert "authorization" not in fakes["compat"].requests[0][1]  # no credential configured: none sent


def test_the_openai_sdk_pointed_at_the_fake_parses_its_answers(fakes):
    fakes["openai"].reply = lambda body: Reply(content="Direct.", reasoning="Mulling.",
                                              calls=[("get_weather", {"city": "Oslo"})])
    direct = openai.OpenAI(base_url=fakes["openai"].url + "/v1", api_key="sk-direct", max_retries=0)
    whole = direct.responses.create(model="o-fake", input="Hi", store=False)
    assert whole.output_text == "Direct." and [i.type for i in whole.output] == ["reasoning", "message",
                                                                                 "function_call"]
    with direct.responses.stream(model="o-fake", input="Hi", store=False) as stream:
        final = stream.get_final_response()
    assert final.output_text == "Direct." and final.output[2].arguments == '{"city": "Oslo"}'
    chat = direct.chat.completions.create(model="o-fake", messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].message.tool_calls[0].function.name == "get_weather"

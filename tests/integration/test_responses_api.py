"""OpenAI's Responses API (gateway/api/responses/) driven by the real openai SDK over a node and a
scripted engine: text with reasoning, function calls and their outputs sent back with
previous_response_id, streaming parsed by the SDK's own event types, structured output, GET / DELETE /
input_items, and stored responses scoped to the tenant that made them."""

from __future__ import annotations

import json

import httpx2
import jsonschema
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess

from tests.support.history_script import poll
from tests.support.waiting import eventually

MODEL = "qwen3-sim"
THOUGHT_CALL = ("<think>\nI need the weather.\n</think>\n\n<tool_call>\n"
                '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
KEY_A, KEY_B = "sk-tenant-a-0123456789abcdef", "sk-tenant-b-0123456789abcdef"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
          "required": ["city", "sunny"], "additionalProperties": False}


@pytest.fixture(scope="module")
def node(log_dir, tmp_path_factory):
    script = tmp_path_factory.mktemp("responses") / "answers.jsonl"
    # (matched in the whole prompt: the follow-up's rule needs the earlier turns there)
    rules = [{"match": "(?s)weather in Oslo.*14 degrees.*What did I ask", "output": "You asked about the weather "
                                                                                     "in Oslo."},
             {"match": "14 degrees", "output": "It is 14 degrees in Oslo today."},
             {"match": "weather", "output": THOUGHT_CALL},
             {"match": "Hello", "output": "<think>\nA greeting.\n</think>\n\nHi! How can I help?"}]
    script.write_text("".join(json.dumps(r) + "\n" for r in rules))
    engine = EngineProcess(["--zero-cost", "--script", str(script)], log_dir, "responses-engine")
    n = NodeProcess(["--worker-urls", engine.url, "--tenant-api-key", f"a:{KEY_A}", f"b:{KEY_B}"],
                    log_dir, "responses-node")
    yield n
    n.stop()
    engine.stop()


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=node.url + "/v1", api_key=KEY_A, max_retries=0)


def test_text_and_reasoning(client):
    response = client.responses.create(model=MODEL, input="Hello!")
    assert response.status == "completed" and response.id.startswith("resp_")
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "\nA greeting.\n"
    assert response.output_text == "Hi! How can I help?"
    assert response.usage.output_tokens > 0 and response.usage.output_tokens_details.reasoning_tokens > 0


def test_a_function_call_its_output_and_a_follow_up_by_previous_response_id(client):
    first = client.responses.create(model=MODEL, input="What is the weather in Oslo?", tools=TOOLS)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo"})
    second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=TOOLS, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "14 degrees and sunny"}])
    assert second.output_text == "It is 14 degrees in Oslo today." and second.previous_response_id == first.id
    third = client.responses.create(model=MODEL, previous_response_id=second.id, input="What did I ask?")
    assert third.output_text == "You asked about the weather in Oslo."  # the whole chain reached the model


def test_streaming_with_the_sdks_types(client):
    with client.responses.stream(model=MODEL, input="What is the weather in Oslo?", tools=TOOLS) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    with client.responses.stream(model=MODEL, input="Hello!") as stream:
        text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
    assert text == "Hi! How can I help?"
    assert client.responses.retrieve(stream.get_final_response().id).output_text == text  # stored when streamed


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_cut_by_max_output_tokens_is_incomplete_and_its_stream_ends_so(client, stream):
    """Issue 34: the response was incomplete but its stream ended with response.completed (OpenAI's:
    response.incomplete)."""
    if stream:
        # (The SDK's stream helper's get_final_response wants response.completed: the last event carries it.)
        events = list(client.responses.create(model=MODEL, input="Hello!", max_output_tokens=3, stream=True))
        kinds, final = [event.type for event in events], events[-1].response
        assert kinds[-1] == "response.incomplete" and "response.completed" not in kinds
    else:
        final = client.responses.create(model=MODEL, input="Hello!", max_output_tokens=3)
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert client.responses.retrieve(final.id).status == "incomplete"


def test_structured_output(client):
    response = client.responses.create(model=MODEL, input="A city as JSON", text={"format": {
        "type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), SCHEMA)


def test_get_delete_input_items_and_tenant_scoping(client, node):
    response = client.responses.create(model=MODEL, input="Hello!", metadata={"run": "7"})
    assert client.responses.retrieve(response.id).metadata == {"run": "7"}
    items = client.responses.input_items.list(response.id)
    assert [item.type for item in items.data] == ["message"]
    several = client.responses.create(model=MODEL, input=[
        {"type": "message", "role": "user", "content": f"Hello {i}"} for i in range(3)])
    newest_first = client.responses.input_items.list(several.id, limit=2)
    assert [i.content[0].text for i in newest_first.data] == ["Hello 2", "Hello 1"] and newest_first.has_more
    assert [i.content[0].text for i in client.responses.input_items.list(several.id, order="asc", limit=1)] == \
        ["Hello 0", "Hello 1", "Hello 2"]  # the SDK follows the pages
    other = openai.OpenAI(base_url=node.url + "/v1", api_key=KEY_B, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(response.id)  # another tenant's: as if it did not exist
    with pytest.raises(openai.BadRequestError) as caught:  # as unknown: OpenAI's 400 on the parameter
        other.responses.create(model=MODEL, input="hi", previous_response_id=response.id)
    assert (caught.value.code, caught.value.param) == ("previous_response_not_found", "previous_response_id")
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    unstored = client.responses.create(model=MODEL, input="Hello!", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}])


def test_with_storage_off_nothing_is_kept_and_a_follow_up_is_refused(node, log_dir):
    engine_url = node.argv[node.argv.index("--worker-urls") + 1]
    plain = NodeProcess(["--worker-urls", engine_url, "--history-backend", "none"], log_dir, "responses-unstored")
    try:
        client = openai.OpenAI(base_url=plain.url + "/v1", api_key="unused", max_retries=0)
        response = client.responses.create(model=MODEL, input="Hello!")
        assert response.output_text == "Hi! How can I help?"
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response.id)
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, input="more", previous_response_id=response.id)
        assert e.value.code == "storage_disabled"
    finally:
        plain.stop()


def test_conversations_and_their_items(client, node):
    conversation = client.conversations.create(metadata={"topic": "weather"}, items=[
        {"type": "message", "role": "user", "content": "Hello!"},
        {"type": "message", "role": "assistant", "content": "Hi! How can I help?"}])
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "weather"}
    assert client.conversations.retrieve(conversation.id).created_at == conversation.created_at
    assert client.conversations.update(conversation.id, metadata={"topic": "rain"}).metadata == {"topic": "rain"}
    added = client.conversations.items.create(conversation.id, items=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Note {i}"}]}
        for i in range(3)])
    assert len(added.data) == 3 and all(item.id.startswith("item_") for item in added.data)
    newest_first = client.conversations.items.list(conversation.id, limit=2)
    assert [i.content[0].text for i in newest_first.data] == ["Note 2", "Note 1"] and newest_first.has_more
    everything = [i.content[0].text for i in client.conversations.items.list(conversation.id, order="asc", limit=2)]
    assert everything == ["Hello!", "Hi! How can I help?", "Note 0", "Note 1", "Note 2"]  # the SDK pages on
    first = added.data[0]
    assert client.conversations.items.retrieve(first.id, conversation_id=conversation.id).id == first.id
    assert client.conversations.items.delete(first.id, conversation_id=conversation.id).id == conversation.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(first.id, conversation_id=conversation.id)
    other = openai.OpenAI(base_url=node.url + "/v1", api_key=KEY_B, max_retries=0)
    for call in (lambda: other.conversations.retrieve(conversation.id),
                 lambda: other.conversations.items.list(conversation.id),
                 lambda: other.conversations.delete(conversation.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert client.conversations.delete(conversation.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.BadRequestError):
        client.conversations.items.list(conversation.id, limit=500)


def test_responses_in_a_conversation(client):
    conversation = client.conversations.create()
    first = client.responses.create(model=MODEL, conversation=conversation.id, tools=TOOLS,
                                    input="What is the weather in Oslo?")
    (call,) = [item for item in first.output if item.type == "function_call"]
    with client.responses.stream(model=MODEL, conversation=conversation.id, tools=TOOLS, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "14 degrees and sunny"}]) as stream:
        for _ in stream:
            pass
        second = stream.get_final_response()
    assert second.output_text == "It is 14 degrees in Oslo today." and second.conversation.id == conversation.id
    third = client.responses.create(model=MODEL, conversation={"id": conversation.id}, input="What did I ask?")
    assert third.output_text == "You asked about the weather in Oslo."  # every turn came from the conversation
    kinds = [item.type for item in client.conversations.items.list(conversation.id, order="asc")]
    assert kinds == ["message", "reasoning", "function_call", "function_call_output", "message", "message",
                     "message"]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, conversation=conversation.id, previous_response_id=first.id, input="x")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, conversation="conv_missing", input="Hello!")


def test_a_background_response_is_queued_then_completed(client, node):
    queued = client.responses.create(model=MODEL, input="Hello!", background=True)
    assert queued.status in ("queued", "in_progress") and queued.background
    done = poll(client, queued.id, lambda r: r.status not in ("queued", "in_progress"))
    assert done.status == "completed" and done.output_text == "Hi! How can I help?"
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(done.id)  # over: nothing to cancel
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="Hello!", background=True, store=False)
    events = list(client.responses.create(model=MODEL, input="Hello!", background=True, stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "Hi! How can I help?"
    other = openai.OpenAI(base_url=node.url + "/v1", api_key=KEY_B, max_retries=0)
    with pytest.raises(openai.NotFoundError):  # another tenant's stream: as if it did not exist
        list(other.responses.retrieve(events[0].response.id, stream=True))
    assert [e.type for e in client.responses.retrieve(events[0].response.id, stream=True)] == \
        [e.type for e in events]


def test_a_background_response_is_cancelled(log_dir):
    slow = EngineProcess(["--itl-base-s", "0.05"], log_dir, "responses-slow-engine")  # 200 tokens: 10 s
    n = NodeProcess(["--worker-urls", slow.url], log_dir, "responses-slow-node")
    try:
        client = openai.OpenAI(base_url=n.url + "/v1", api_key="x", max_retries=0)
        queued = client.responses.create(model=MODEL, input="Write at length.", background=True,
                                         max_output_tokens=200)
        poll(client, queued.id, lambda r: r.status == "in_progress")
        assert client.responses.cancel(queued.id).status == "cancelled"
        assert client.responses.cancel(queued.id).status == "cancelled"  # again: the same answer
        # The generation stopped: the node holds no running request on the engine within a moment.
        _eventually_idle(n)
        assert client.responses.retrieve(queued.id).status == "cancelled"  # not overwritten by a late finish
        with pytest.raises(openai.BadRequestError):
            client.responses.cancel(client.responses.create(model=MODEL, input="x", max_output_tokens=2).id)
        # Streamed: a cancel ends the stream of whoever follows it (no terminal event: OpenAI has none).
        stream = client.responses.create(model=MODEL, input="Write at length.", background=True, stream=True,
                                         max_output_tokens=200)
        kinds, response_id = [], None
        for event in stream:
            kinds.append(event.type)
            response_id = response_id or event.response.id
            if len(kinds) == 8:
                assert client.responses.cancel(response_id).status == "cancelled"
        assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
        assert kinds[-1] == "response.output_text.delta" and len(kinds) < 100
    finally:
        n.stop()
        slow.stop()


def _eventually_idle(node, timeout_s=10.0):
    def idle():
        metrics = httpx2.get(node.url + "/metrics").text
        running = [line for line in metrics.splitlines() if line.startswith("smg_requests_running ")]
        assert running and float(running[0].split()[1]) == 0, running
        return True

    eventually(idle, timeout_s, "requests still running")


def test_include_output_text_logprobs(client):
    whole = client.responses.create(model=MODEL, input="Hello!", include=["message.output_text.logprobs"],
                                    top_logprobs=2)
    part = whole.output[-1].content[0]
    assert part.logprobs and all(len(entry.top_logprobs) == 2 for entry in part.logprobs)
    with client.responses.stream(model=MODEL, input="Hello!", include=["message.output_text.logprobs"]) as stream:
        events = list(stream)
    streamed = [entry.token for e in events if e.type == "response.output_text.delta" for entry in e.logprobs]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert streamed and streamed == [entry.token for entry in done.logprobs]
    plain = client.responses.create(model=MODEL, input="Hello!", include=["reasoning.encrypted_content"])
    assert plain.output[-1].content[0].logprobs == []  # nothing to include, nothing asked for
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="Hello!", include=["everything"])


def test_a_stream_whose_engine_dies_ends_with_response_failed(log_dir):
    """OpenAI's end of a failed stream is response.failed, the failed response in it; a background stream's
    too, and its resume (issues 34 and 41)."""
    engine = EngineProcess(["--itl-base-s", "0.05"], log_dir, "responses-dying-engine")
    n = NodeProcess(["--worker-urls", engine.url], log_dir, "responses-dying-node")
    try:
        client = openai.OpenAI(base_url=n.url + "/v1", api_key="x", max_retries=0, timeout=30)
        streams = [client.responses.create(model=MODEL, input="Write at length.", max_output_tokens=200, stream=True),
                   client.responses.create(model=MODEL, input="Write at length.", max_output_tokens=200, stream=True,
                                           background=True)]
        events = [[], []]
        for i, stream in enumerate(streams):
            for event in stream:
                events[i].append(event)
                if event.type == "response.output_text.delta":
                    break
        engine.kill()
        for i, stream in enumerate(streams):
            events[i] += list(stream)
            last = events[i][-1]
            assert last.type == "response.failed" and last.response.status == "failed", [e.type for e in events[i]]
            assert last.response.error.code and "response.completed" not in [e.type for e in events[i]]
        background_id = events[1][0].response.id
        assert client.responses.retrieve(background_id).status == "failed"
        assert [e.type for e in client.responses.retrieve(background_id, stream=True)][-1] == "response.failed"
    finally:
        n.stop()
        engine.stop()

"""The Responses, Conversations and Messages APIs on a real engine (vLLM on CPU, smg-grpc-servicer):
the same pipeline as chat, so these check that what each API asks of the engine (max tokens, the
prompt from stored turns, an abort when a background response is cancelled) reaches a real one.
Random weights: the texts are gibberish; the shapes, counts and the engine's own state are checked."""

from __future__ import annotations

import time

import anthropic
import pytest

from tests.support.vllm import engine_running

pytestmark = pytest.mark.real_engine


def test_responses_chain_stream_and_conversation(client, model):
    first = client.responses.create(model=model, input="Hello", max_output_tokens=6, temperature=0)
    assert first.status == "incomplete" and first.usage.output_tokens == 6  # cut at max_output_tokens
    # Cut by max_output_tokens too: the stream ends with response.incomplete, as OpenAI's (issue 34), which
    # the SDK's stream helper does not take as an end (it wants response.completed): the events as they come.
    events = list(client.responses.create(model=model, previous_response_id=first.id, input="Go on",
                                          max_output_tokens=6, temperature=0, stream=True))
    kinds, second = [event.type for event in events], events[-1].response
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete" and second.status == "incomplete"
    # The follow-up's prompt holds the first turn: more input tokens than the first had.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    conversation = client.conversations.create()
    turn = client.responses.create(model=model, conversation=conversation.id, input="Hi", max_output_tokens=4)
    assert turn.usage.output_tokens == 4
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert items[0].role == "user" and items[0].content[0].text == "Hi"
    assert [i.type for i in items[1:]] == [o.type for o in turn.output]  # the answer's items, whatever they hold


def test_a_cancelled_background_response_stops_the_real_engine(client, model, vllm_url):
    queued = client.responses.create(model=model, input="Write", max_output_tokens=1500, background=True,
                                     extra_body={"ignore_eos": True})
    deadline = time.monotonic() + 60
    while engine_running(vllm_url) != 1:
        assert time.monotonic() < deadline, "the background response never reached the engine"
        time.sleep(0.1)
    assert client.responses.cancel(queued.id).status == "cancelled"
    deadline = time.monotonic() + 10
    while engine_running(vllm_url) != 0:
        assert time.monotonic() < deadline, "the engine still runs a cancelled background response"
        time.sleep(0.1)
    assert client.responses.retrieve(queued.id).status == "cancelled"


def test_anthropic_messages_create_stream_and_count(node, model):
    claude = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0)
    message = claude.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5
    with claude.messages.stream(model=model, max_tokens=5, messages=[{"role": "user", "content": "Hi"}]) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == 5
    counted = claude.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Hi"}])
    assert counted.input_tokens == message.usage.input_tokens

"""Hosted providers on OpenAI's wire (gateway/providers/openai.py) behind a node, driven with the openai SDK: models
as routes, answers whole and streamed with text, reasoning and tool calls, fallbacks on 5xx, 429 and timeouts, a
cooldown that skips a failing target, errors in the oai's shape, features a target cannot do refused by name.

The providers are fake servers of the test's own (tests/support/fake_providers.py) that hold every request to the
openai SDK's request types and answer with bodies its response models parse."""

from __future__ import annotations

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess
from tests.support.fake_providers import Failure, FakeOpenAI, Reply, routed_node, started
from tests.support.nodes import ENGINE_ARGS, MODEL
from tests.support.waiting import eventually, remains

KEYS = {"FAKE_PRIMARY_KEY": "sk-primary-secret", "FAKE_BACKUP_KEY": "sk-backup-secret"}


@pytest.fixture(scope="module")
def fakes():
    names = ("primary", "backup", "flaky", "slow", "lone", "limited")
    with started({name: FakeOpenAI(name) for name in names}) as servers:
        yield servers



@pytest.fixture(scope="module")
def node(fakes, log_dir, tmp_path_factory):
    engine = EngineProcess(ENGINE_ARGS, log_dir, "providers-engine")
    node = routed_node(f"""
[targets.primary]
provider = "openai"
model = "gpt-fake"
base_url = "{fakes['primary'].url}/v1"
credential = "env:FAKE_PRIMARY_KEY"
organization = "org-test"

[targets.backup]
provider = "openai_compatible"
model = "backup-model"
base_url = "{fakes['backup'].url}/v1"
credential = "env:FAKE_BACKUP_KEY"

[targets.flaky]
provider = "openai"
model = "gpt-flaky"
base_url = "{fakes['flaky'].url}/v1"
credential = "env:FAKE_PRIMARY_KEY"

[targets.slow]
provider = "openai"
model = "gpt-slow"
base_url = "{fakes['slow'].url}/v1"
credential = "env:FAKE_PRIMARY_KEY"
timeout_secs = 1

[targets.limited]
provider = "openai"
model = "gpt-limited"
base_url = "{fakes['limited'].url}/v1"
credential = "env:FAKE_PRIMARY_KEY"

[targets.lone]
provider = "azure"
model = "my-deployment"
base_url = "{fakes['lone'].url}"
credential = "env:FAKE_PRIMARY_KEY"
api_version = "2024-10-21"

[models.smart]
targets = [{{ target = "primary" }}, {{ target = "backup", priority = 1 }}]

[models.flaky]
targets = [{{ target = "flaky" }}, {{ target = "backup", priority = 1 }}]

[models.slow]
targets = [{{ target = "slow" }}, {{ target = "backup", priority = 1 }}]

[models.limited]
targets = [{{ target = "limited" }}, {{ target = "backup", priority = 1 }}]

[models.azure]
targets = ["lone"]

[models.fleet-first]
targets = [{{ pool = "{MODEL}" }}, {{ target = "backup", priority = 1 }}]
fallback_on = ["server"]
""", tmp_path_factory.mktemp("routes"), log_dir, "providers-node", KEYS, ("--worker-urls", engine.url))
    yield node
    node.stop()
    engine.stop()



def test_a_routed_model_is_answered_by_its_provider(oai, fakes):
    reply = oai.chat.completions.create(model="smart", messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}], max_tokens=20,
        temperature=0.5)
    assert reply.choices[0].message.content == "Hello from primary." and reply.choices[0].finish_reason == "stop"
    assert reply.model == "gpt-fake" and reply.usage.prompt_tokens == 11 and reply.usage.completion_tokens == 7
    path, headers, body = fakes["primary"].requests[0]
    assert path == "/v1/chat/completions" and headers["authorization"] == "Bearer sk-primary-secret"
    assert headers["openai-organization"] == "org-test"
    assert body["model"] == "gpt-fake" and body["max_completion_tokens"] == 20 and body["temperature"] == 0.5
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    assert "client-key" not in str(headers)  # the client's credential is the gateway's, never a provider's
    assert not fakes["backup"].requests


def test_a_stream_arrives_in_pieces_with_its_usage(oai, fakes):
    fakes["primary"].reply = lambda body: Reply(content="one two three four", completion_tokens=4)
    chunks = list(oai.chat.completions.create(model="smart", messages=[{"role": "user", "content": "Count"}],
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2  # streamed, not one piece
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.completion_tokens == 4
    assert fakes["primary"].requests[0][2]["stream_options"] == {"include_usage": True}
    # The answer's own id on every chunk; the provider's usage (always asked for) in a chunk only for a client
    # that asked.
    assert len({c.id for c in chunks}) == 1 and chunks[0].id != "chatcmpl-fake"
    plain = list(oai.chat.completions.create(model="smart", messages=[{"role": "user", "content": "Count"}],
                                             stream=True))
    assert all(c.usage is None for c in plain) and fakes["primary"].requests[1][2]["stream_options"] == {
        "include_usage": True}


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_and_reasoning_come_back_in_openais_fields(oai, fakes, stream):
    fakes["backup"].reply = lambda body: Reply(content=None, reasoning="The user wants weather.",
                                              calls=[("get_weather", {"city": "Oslo"})], reasoning_tokens=5)
    fakes["primary"].failures.append(Failure(503))  # the backup (a compatible server that reasons) answers
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    asked = dict(model="smart", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=tools,
                 tool_choice="required", parallel_tool_calls=False)
    if not stream:
        reply = oai.chat.completions.create(**asked)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls"
        calls = message.tool_calls
        reasoning = message.model_extra["reasoning_content"]
        assert reply.usage.completion_tokens_details.reasoning_tokens == 5
    else:
        chunks = list(oai.chat.completions.create(**asked, stream=True))
        pieces = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or ())]
        calls = [openai.types.chat.ChatCompletionMessageToolCall(
            id=next(p.id for p in pieces if p.index == index and p.id), type="function", function={
                "name": "".join(p.function.name or "" for p in pieces if p.index == index),
                "arguments": "".join(p.function.arguments or "" for p in pieces if p.index == index)})
            for index in sorted({p.index for p in pieces})]  # OpenAI's stream: a call's pieces by index
        reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
            ["tool_calls"]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}')]
    assert reasoning == "The user wants weather."
    body = fakes["backup"].requests[0][2]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False and body["tools"] == tools
    assert "max_completion_tokens" not in body  # a compatible server reads max_tokens


def test_a_5xx_falls_back_to_the_next_target_and_three_cool_the_target_down(oai, fakes, node):
    fakes["flaky"].failures = [Failure(502), Failure(500), Failure(503)]
    for _ in range(3):
        reply = oai.chat.completions.create(model="flaky", messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content == "Hello from backup."
    assert len(fakes["flaky"].requests) == 3
    # Cooling down: the next request goes straight to the backup.
    reply = oai.chat.completions.create(model="flaky", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Hello from backup." and len(fakes["flaky"].requests) == 3
    metrics = httpx2.get(node.url + "/metrics").text
    assert 'smg_route_events_total{event="fallback",route="flaky",target="flaky"} 3.0' in metrics
    assert 'smg_route_events_total{event="cooling",route="flaky",target="flaky"} 1.0' in metrics
    assert 'smg_provider_requests_total{outcome="server",target="flaky"} 3.0' in metrics


def test_a_429_with_retry_after_cools_the_target_for_that_long(oai, fakes):
    fakes["limited"].failures.append(Failure(429, "Rate limit reached", {"retry-after": "30"},
                                             code="rate_limit_exceeded"))
    for _ in range(2):
        reply = oai.chat.completions.create(model="limited", messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content == "Hello from backup."
    assert len(fakes["limited"].requests) == 1  # asked once, then skipped while it cools down


def test_a_target_that_answers_too_late_is_left_for_the_next(oai, fakes):
    fakes["slow"].failures.append(Failure(200, delay_s=2.5))  # its bound is 1 s
    reply = oai.chat.completions.create(model="slow", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Hello from backup."


def _streamed_text(oai, model: str) -> "tuple[str, Exception | None]":
    """The text a streamed answer gave before it ended, and the error it ended with (None: it ended well)."""
    text = []
    try:
        for chunk in oai.chat.completions.create(model=model, stream=True,
                                                 messages=[{"role": "user", "content": "Hi"}]):
            text += [c.delta.content or "" for c in chunk.choices]
    except openai.APIError as e:
        return "".join(text), e
    return "".join(text), None


def test_a_stream_that_stops_or_breaks_off_after_it_began_ends_with_an_error_event(oai, fakes):
    words = " ".join(f"word{i}" for i in range(60))
    fakes["slow"].reply = lambda body: Reply(content=words)
    # A pause longer than the target's bound (1 s) once the answer has begun: the client has its first text, then
    # the stream's error (too late to move to another target).
    fakes["slow"].failures.append(Failure(200, stalls=((600, 2.5),)))
    text, error = _streamed_text(oai, "slow")
    assert text and words.startswith(text) and text != words
    assert error is not None and "stopped sending for 1 s" in str(error)
    # Pauses each shorter than the bound, longer together: the bound is between pieces, not for the whole answer.
    fakes["slow"].failures.append(Failure(200, stalls=((300, 0.6), (900, 0.6))))
    assert _streamed_text(oai, "slow") == (words, None)
    # The connection dropped part way.
    fakes["slow"].failures.append(Failure(200, drop_after_bytes=700))
    text, error = _streamed_text(oai, "slow")
    assert words.startswith(text) and text != words
    assert error is not None and "broke off" in str(error)
    assert not fakes["backup"].requests


def _timeouts(node, target: str) -> str:
    """The node's count of ``target``'s calls that timed out, as /metrics spells it (absent: none yet)."""
    line = f'smg_provider_requests_total{{outcome="timeout",target="{target}"}}'
    return next((row for row in httpx2.get(node.url + "/metrics").text.splitlines() if row.startswith(line)), "")


def test_a_client_gone_mid_stream_ends_the_providers_call_and_moves_to_no_other_target(oai, node, fakes):
    timeouts = _timeouts(node, "slow")
    words = " ".join(f"word{i}" for i in range(60))
    fakes["slow"].reply = lambda body: Reply(content=words)
    fakes["slow"].failures.append(Failure(200, stalls=((600, 0.8),)))  # a pause within the target's bound (1 s)
    stream = oai.chat.completions.create(model="slow", stream=True, messages=[{"role": "user", "content": "Hi"}])
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    stream.close()  # the client goes away while the provider pauses
    eventually(lambda: fakes["slow"].abandoned == 1, what="the provider's call closed")  # found at its next write
    assert not fakes["backup"].requests and _timeouts(node, "slow") == timeouts  # not the target's failure
    fakes["slow"].abandoned = 0
    assert _streamed_text(oai, "slow") == (words, None)  # and the node goes on


def test_a_client_gone_before_a_whole_answer_is_no_timeout_and_no_fallback(oai, node, fakes):
    timeouts = _timeouts(node, "slow")
    fakes["slow"].failures.append(Failure(200, delay_s=0.8))  # an answer within the target's bound (1 s)
    impatient = oai.with_options(timeout=0.2)
    with pytest.raises(openai.APITimeoutError):  # the client gives up and closes its connection
        impatient.chat.completions.create(model="slow", messages=[{"role": "user", "content": "Hi"}])
    # Past the provider's answer: the call was dropped with its client, neither counted a timeout nor moved on.
    remains(lambda: _timeouts(node, "slow") == timeouts and not fakes["backup"].requests, 1.0,
            "no timeout and no fallback")
    assert oai.chat.completions.create(model="slow", messages=[{"role": "user", "content": "Hi"}]
                                       ).choices[0].message.content == "Hello from slow."


def test_azure_is_called_at_its_deployment_with_its_api_key_header(oai, fakes):
    reply = oai.chat.completions.create(model="azure", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Hello from lone."
    path, headers, body = fakes["lone"].requests[0]
    assert path == "/openai/deployments/my-deployment/chat/completions?api-version=2024-10-21"
    assert headers["api-key"] == "sk-primary-secret" and "authorization" not in headers and "model" not in body
    oai.embeddings.create(model="azure", input="hello")
    path, headers, body = fakes["lone"].requests[1]
    assert path == "/openai/deployments/my-deployment/embeddings?api-version=2024-10-21"
    assert headers["api-key"] == "sk-primary-secret" and "model" not in body


def test_the_last_targets_error_is_the_clients_in_openais_shape(oai, fakes):
    fakes["lone"].failures.append(Failure(400, "Invalid 'messages': something the provider dislikes",
                                          code="invalid_value"))
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="azure", messages=[{"role": "user", "content": "Hi"}])
    assert refused.value.status_code == 400 and "something the provider dislikes" in refused.value.message
    assert "lone" in refused.value.message and "sk-primary-secret" not in refused.value.message
    fakes["lone"].failures.append(Failure(429, "Slow down", {"retry-after": "7"}))
    with pytest.raises(openai.RateLimitError) as limited:
        oai.chat.completions.create(model="azure", messages=[{"role": "user", "content": "Hi"}])
    assert limited.value.response.headers["retry-after"] == "7"
    # It asked for 7 s: until then the route has no target to try, and says so without asking it.
    with pytest.raises(openai.RateLimitError) as cooling:
        oai.chat.completions.create(model="azure", messages=[{"role": "user", "content": "Hi"}])
    assert "cooling down" in cooling.value.message and 1 <= int(cooling.value.response.headers["retry-after"]) <= 7
    assert len(fakes["lone"].requests) == 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_client_gets_the_providers_own_answer_with_n_and_logprobs(oai, fakes, stream):
    """A chat client on an OpenAI-wire target is given the provider's own chunks (its fields all kept) under this
    answer's id: what only the provider's answer carries (several choices, logprobs) reaches it."""
    fakes["primary"].reply = lambda body: Reply(content="one two three")
    asked = dict(model="smart", messages=[{"role": "user", "content": "Count"}], n=2, logprobs=True, top_logprobs=2)
    if stream:
        chunks = list(oai.chat.completions.create(**asked, stream=True))
        texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == k)
                 for k in (0, 1)]
        tokens = [lp.token for c in chunks if c.choices and c.choices[0].index == 0 and c.choices[0].logprobs
                  for lp in c.choices[0].logprobs.content]
        tops = [len(lp.top_logprobs) for c in chunks if c.choices and c.choices[0].logprobs
                for lp in c.choices[0].logprobs.content]
        assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
        assert chunks[0].id != "chatcmpl-fake" and all(c.usage is None for c in chunks)  # usage was not asked for
        ids = {c.id for c in chunks}
    else:
        reply = oai.chat.completions.create(**asked)
        texts = [choice.message.content for choice in reply.choices]
        tokens = [lp.token for lp in reply.choices[0].logprobs.content]
        tops = [len(lp.top_logprobs) for choice in reply.choices for lp in choice.logprobs.content]
        ids = {reply.id}
    assert texts == ["one two three", "one two three (1)"] and tokens == ["one ", "two ", "three"]
    assert set(tops) == {2} and "chatcmpl-fake" not in ids
    body = fakes["primary"].requests[0][2]
    assert (body["n"], body["logprobs"], body["top_logprobs"]) == (2, True, 2)


def test_what_a_target_cannot_do_is_a_400_naming_the_model_and_the_feature(oai, fakes):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="smart", messages=[{"role": "user", "content": "Hi"}],
                                       extra_body={"regex": "[a-z]+"})
    assert "regex constraints" in refused.value.message
    # A video is preprocessed for our own engines; no provider's wire carries one.
    frames = "data:video/jpeg;base64,/9j/4AAQ,/9j/4AAQ"
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model="smart", messages=[{"role": "user", "content": [
            {"type": "text", "text": "What happens?"}, {"type": "video_url", "video_url": {"url": frames}}]}])
    assert "'smart'" in refused.value.message and "video inputs" in refused.value.message
    assert refused.value.body["param"] == "messages[0].content[1]"
    assert not fakes["primary"].requests and not fakes["backup"].requests


def test_a_pool_first_route_is_answered_by_the_fleet_and_its_model_listed(oai, fakes):
    reply = oai.chat.completions.create(model="fleet-first", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4)
    assert reply.model == MODEL and reply.usage.completion_tokens == 4 and not fakes["backup"].requests


def test_anthropics_messages_reach_a_provider_and_come_back_as_blocks(ant, fakes):
    fakes["primary"].reply = lambda body: Reply(content=None, calls=[("get_weather", {"city": "Oslo"})])
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    message = ant.messages.create(model="smart", max_tokens=64, system="Be brief.", tools=tools,
                                  messages=[{"role": "user", "content": "Weather in Oslo?"}])
    assert message.stop_reason == "tool_use" and message.model == "gpt-fake"
    assert [(b.type, b.name, b.input) for b in message.content if b.type == "tool_use"] == \
        [("tool_use", "get_weather", {"city": "Oslo"})]
    body = fakes["primary"].requests[0][2]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."} and body["max_completion_tokens"] == 64
    fakes["primary"].reply = lambda body: Reply(content="It is 14 degrees.")
    with ant.messages.stream(model="smart", max_tokens=64, messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "14"}]}],
            tools=tools) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "It is 14 degrees." and final.stop_reason == "end_turn" and final.usage.output_tokens == 7
    sent = fakes["primary"].requests[1][2]["messages"]
    assert sent[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "14"}


def test_a_responses_conversation_moves_between_the_fleet_and_a_provider(oai, fakes):
    first = oai.responses.create(model=MODEL, input="Remember the word 'plum'.", max_output_tokens=4)
    assert first.status == "incomplete" and first.model == MODEL and first.output_text  # cut at 4 tokens
    second = oai.responses.create(model="smart", previous_response_id=first.id, input="Which word?")
    assert second.output_text == "Hello from primary." and second.model == "gpt-fake"
    sent = fakes["primary"].requests[0][2]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[0]["content"] == "Remember the word 'plum'." and sent[1]["content"] == first.output_text
    third = oai.responses.create(model=MODEL, previous_response_id=second.id, input="Again?", max_output_tokens=4)
    assert third.model == MODEL and third.output_text
    assert [i.type for i in oai.responses.input_items.list(third.id).data] == ["message"]
    streamed = list(oai.responses.create(model="smart", previous_response_id=third.id, input="Once more",
                                            stream=True))
    assert [e.type for e in streamed][0] == "response.created" and streamed[-1].type == "response.completed"
    assert streamed[-1].response.output_text == "Hello from primary."
    assert oai.responses.retrieve(streamed[-1].response.id).output_text == "Hello from primary."
    assert len(fakes["primary"].requests[1][2]["messages"]) == 7  # the whole chain, fleet and provider turns


def test_embeddings_reach_the_provider_as_sent_and_come_back_in_openais_list(oai, fakes, node):
    answer = oai.embeddings.create(model="smart", input=["a cat", "a dog sat"], dimensions=6)  # base64 by default
    assert [len(e.embedding) for e in answer.data] == [6, 6] and [e.index for e in answer.data] == [0, 1]
    assert answer.model == "gpt-fake" and answer.usage.prompt_tokens == 5 and answer.usage.total_tokens == 5
    path, headers, body = fakes["primary"].requests[0]
    assert path == "/v1/embeddings" and headers["authorization"] == "Bearer sk-primary-secret"
    assert body == {"model": "gpt-fake", "input": ["a cat", "a dog sat"], "dimensions": 6,
                    "encoding_format": "base64"}
    floats = oai.embeddings.create(model="smart", input=[[1, 2, 3]], encoding_format="float")
    assert len(floats.data[0].embedding) == 4 and floats.usage.prompt_tokens == 3
    assert 'smg_provider_requests_total{outcome="ok",target="primary"}' in httpx2.get(node.url + "/metrics").text


def test_embeddings_fall_back_on_a_5xx(oai, fakes):
    fakes["slow"].failures.append(Failure(503))
    answer = oai.embeddings.create(model="slow", input="hello there")
    assert answer.model == "backup-model" and len(fakes["slow"].requests) == 1
    assert fakes["backup"].requests[0][0] == "/v1/embeddings"


def test_embeddings_of_a_routed_model_are_checked_before_anything_is_sent(oai, fakes):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.embeddings.create(model="smart", input=[])
    assert refused.value.body["param"] == "input"
    assert not fakes["primary"].requests


def _finished(oai, response_id: str):
    return eventually(lambda: (lambda r: r if r.status not in ("queued", "in_progress") else None)(
        oai.responses.retrieve(response_id)), 20, f"the background response {response_id} did not finish")


def test_a_background_response_of_a_routed_model_falls_back_and_is_stored_as_it_goes(oai, fakes):
    fakes["primary"].failures.append(Failure(503))  # the backup answers: the route's fallback holds in the background
    queued = oai.responses.create(model="smart", input="Hello there", background=True)
    assert queued.status in ("queued", "in_progress") and queued.background and queued.model in ("smart", "gpt-fake",
                                                                                                "backup-model")
    done = _finished(oai, queued.id)
    assert done.status == "completed" and done.output_text == "Hello from backup." and done.model == "backup-model"
    assert done.usage.output_tokens == 7 and len(fakes["primary"].requests) == 1
    fakes["primary"].reply = lambda body: Reply(content="one two three")
    events = list(oai.responses.create(model="smart", previous_response_id=done.id, input="Count", background=True,
                                       stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"] and kinds.count(
        "response.in_progress") == 1
    assert kinds[-1] == "response.completed" and events[-1].response.output_text == "one two three"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in oai.responses.retrieve(events[0].response.id, stream=True)] == kinds  # resumed whole
    assert [m["role"] for m in fakes["primary"].requests[1][2]["messages"]] == ["user", "assistant", "user"]
    pooled = _finished(oai, oai.responses.create(model="fleet-first", input="Hi", background=True,
                                                 max_output_tokens=4).id)  # the route's pool answers it
    assert pooled.model == MODEL and pooled.status == "incomplete" and pooled.output_text


def test_a_background_response_whose_targets_all_fail_is_failed_and_one_can_be_cancelled(oai, fakes):
    fakes["lone"].failures.append(Failure(503, "no such thing"))  # the route's one target (or cooling already)
    failed = _finished(oai, oai.responses.create(model="azure", input="Hi", background=True).id)
    assert failed.status == "failed" and ("no such thing" in failed.error.message or
                                          failed.error.code == "no_target_available")
    fakes["primary"].failures.append(Failure(200, delay_s=3))  # answers, but late
    queued = oai.responses.create(model="smart", input="Take your time", background=True)
    eventually(lambda: oai.responses.retrieve(queued.id).status == "in_progress", 10, "the run did not start")
    assert oai.responses.cancel(queued.id).status == "cancelled"
    assert oai.responses.retrieve(queued.id).status == "cancelled"
    assert not fakes["backup"].requests  # a cancel is not a failure: nothing falls back

"""The Responses API in OpenAI's corners (issue 41), through the real openai SDK, on every history backend:
two nodes sharing what they store (the memory backend over their mesh, or one real PostgreSQL or Redis).

- an unknown previous_response_id, or one stored with store: false, is a 400 on that parameter;
- store: false in a conversation stores nothing, the conversation's new items included;
- a completed response has completed_at (and only a completed one), streamed or not, background or not;
- background with stream: OpenAI's opening events, the response stored under the same id, and a client that
  dropped resumes with GET /v1/responses/{id}?stream=true&starting_after=N on the other node: while the first
  generates (from the store), on the first (live), and after the first is killed (from the stored events);
- validation messages name the value.
"""

from __future__ import annotations

import json
import re
import time

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess

from tests.support.real_servers import postgres_server, redis_server
from tests.support import node_pairs
from tests.support.history_script import MODEL, RULES, poll
from tests.support.waiting import eventually

# Scripted where an answer must show what the model saw; any other prompt gets the simulated engine's words,
# one every 20 ms: a background stream lasts long enough to drop out of it and resume.
SLOW_ENGINE = ["--itl-base-s", "0.02", "--itl-per-running-s", "0", "--prefill-s-per-token", "0.000001"]
LONG = 60  # tokens of a background stream: ~1.2 s


@pytest.fixture(scope="module")
def engine(log_dir, tmp_path_factory):
    script = tmp_path_factory.mktemp("conformance") / "answers.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in RULES))
    e = EngineProcess([*SLOW_ENGINE, "--script", str(script)], log_dir, "conformance-engine")
    yield e
    e.stop()


@pytest.fixture(scope="module", params=["memory", "postgres", "redis"])
def backend(request, tmp_path_factory):
    """How the nodes of a pair are told to store: (node index, the pair's four free ports) -> arguments."""
    if request.param == "memory":
        yield lambda i, ports: node_pairs.mesh_args(i, ports, "c")
        return
    server = postgres_server if request.param == "postgres" else redis_server
    with server(tmp_path_factory.mktemp(request.param)) as url:
        flag = "--postgres-db-url" if request.param == "postgres" else "--redis-url"
        yield lambda i, ports: ["--history-backend", request.param, flag, url]


def start_pair(engine, backend, log_dir, name: str) -> list[NodeProcess]:
    return node_pairs.start_pair(lambda i, ports: ["--worker-urls", engine.url, *backend(i, ports)], log_dir, name)


@pytest.fixture(scope="module")
def pair(engine, backend, log_dir):
    nodes = start_pair(engine, backend, log_dir, "conformance")
    yield nodes
    for n in nodes:
        n.stop()


def client(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_or_unstored_previous_response_id_is_a_400_on_that_parameter(pair, stream):
    a, b = (client(n) for n in pair)
    unstored = a.responses.create(model=MODEL, input="Hello!", store=False)
    for previous in ("resp_never_made", unstored.id):
        for c in (a, b):
            with pytest.raises(openai.BadRequestError) as caught:
                c.responses.create(model=MODEL, input="more", previous_response_id=previous, stream=stream)
            error = caught.value
            assert (error.code, error.param, error.type) == \
                ("previous_response_not_found", "previous_response_id", "invalid_request_error")
            assert previous in error.message
    with pytest.raises(openai.NotFoundError):  # retrieving an unknown id stays a 404
        b.responses.retrieve("resp_never_made")


@pytest.mark.parametrize("stream", [False, True])
def test_store_false_in_a_conversation_stores_nothing(pair, stream):
    a, b = (client(n) for n in pair)
    conversation = a.conversations.create(items=[
        {"type": "message", "role": "user", "content": "Hello, my name is Ada."},
        {"type": "message", "role": "assistant", "content": "Hi Ada!"}])
    if stream:
        with b.responses.stream(model=MODEL, conversation=conversation.id, input="What is my name?",
                                store=False) as events:
            kinds = [event.type for event in events]
            answer = events.get_final_response()
        assert kinds[-1] == "response.completed"
    else:
        answer = b.responses.create(model=MODEL, conversation=conversation.id, input="What is my name?", store=False)
    assert answer.output_text == "Your name is Ada."  # the model saw the conversation
    for c in (a, b):
        assert [i.role for i in c.conversations.items.list(conversation.id, order="asc")] == ["user", "assistant"]
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(answer.id)


def test_completed_at_on_completed_responses_only(pair):
    a, b = (client(n) for n in pair)
    before = int(time.time())
    whole = a.responses.create(model=MODEL, input="Hello!")
    with a.responses.stream(model=MODEL, input="Hello!") as events:
        for _ in events:
            pass
        streamed = events.get_final_response()
    queued = a.responses.create(model=MODEL, input="Hello!", background=True)
    assert queued.completed_at is None
    background = poll(b, queued.id, lambda r: r.status == "completed")
    after = int(time.time()) + 1
    for response in (whole, streamed, background):
        assert response.status == "completed" and before <= response.completed_at <= after
        assert b.responses.retrieve(response.id).completed_at == response.completed_at  # as stored
    cut = a.responses.create(model=MODEL, input="Hello!", max_output_tokens=2)
    events = list(a.responses.create(model=MODEL, input="Hello!", max_output_tokens=2, stream=True))
    assert events[-1].type == "response.incomplete"  # OpenAI's end of an incomplete stream
    for response in (cut, events[-1].response, b.responses.retrieve(cut.id)):
        assert response.status == "incomplete" and response.completed_at is None


def test_validation_messages_name_the_value(pair):
    a = client(pair[0])
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            a.responses.create(model=MODEL, stream=stream, input=[
                {"type": "message", "role": "martian", "content": "Hello!"}])
        assert "'martian'" in caught.value.message and caught.value.param == "input[0].role"
    with pytest.raises(openai.BadRequestError) as caught:
        a.responses.create(model=MODEL, input="Hello!", store="yes")
    assert "'yes'" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        a.chat.completions.create(model=MODEL, messages=[{"role": "martian", "content": "Hello!"}])
    assert "'martian'" in caught.value.message and caught.value.param == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as caught:
        a.responses.create(model=MODEL, input="Hello!", reasoning={"effort": "maximal"})
    assert "'maximal'" in caught.value.message


def background_stream(c: openai.OpenAI, keep: int) -> tuple[str, list]:
    """A background stream of LONG tokens, left after its first ``keep`` events: (its id, those events)."""
    stream = c.responses.create(model=MODEL, input="Write at length.", background=True, stream=True,
                                max_output_tokens=LONG)
    events = []
    for event in stream:
        events.append(event)
        if len(events) == keep:
            break
    stream.close()  # the client drops; the response goes on
    return events[0].response.id, events


def assert_resumed(first: list, rest: list, final) -> None:
    """The first events then the resumed ones: every sequence number once, in order, ending with the
    terminal event, and the text they carry is the stored answer's."""
    events = [*first, *rest]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in first[:3]] == ["response.created", "response.queued", "response.in_progress"]
    assert first[0].response.status == first[1].response.status == "queued" and first[0].response.background
    assert events[-1].type == "response.incomplete"  # cut by max_output_tokens, as asked
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == final.output_text == events[-1].response.output_text
    assert final.status == "incomplete" and final.usage.output_tokens == LONG


def test_a_background_stream_resumes_on_either_node_while_it_runs(pair):
    a, b = (client(n) for n in pair)
    response_id, first = background_stream(a, keep=6)
    # On the other node: the stored events, then the store's new ones until the end.
    rest = list(b.responses.retrieve(response_id, stream=True, starting_after=5))
    final = b.responses.retrieve(response_id)
    assert_resumed(first, rest, final)
    # And on the node generating it, live: the same events again, from any point.
    response_id, first = background_stream(a, keep=4)
    rest = list(a.responses.retrieve(response_id, stream=True, starting_after=3))
    assert_resumed(first, rest, a.responses.retrieve(response_id))
    again = list(b.responses.retrieve(response_id, stream=True))  # from the start, after the end
    assert [e.sequence_number for e in again] == list(range(len(first) + len(rest)))
    with pytest.raises(openai.BadRequestError):  # a response made without stream has none to resume
        list(b.responses.retrieve(a.responses.create(model=MODEL, input="Hello!").id, stream=True))
    bad = httpx2.get(f"{pair[1].url}/v1/responses/{response_id}?stream=true&starting_after=soon")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"


def test_a_background_stream_resumes_on_the_other_node_after_the_first_is_killed(engine, backend, log_dir):
    a_node, b_node = start_pair(engine, backend, log_dir, "conformance-kill")
    try:
        a, b = client(a_node), client(b_node)
        response_id, first = background_stream(a, keep=5)
        poll(b, response_id, lambda r: r.status not in ("queued", "in_progress"))
        a_node.kill()  # what b serves now comes from the store alone
        rest = list(b.responses.retrieve(response_id, stream=True, starting_after=4))
        assert_resumed(first, rest, b.responses.retrieve(response_id))
    finally:
        a_node.stop()
        b_node.stop()



def background_cancels(node: NodeProcess) -> dict[str, float]:
    text = httpx2.get(node.url + "/metrics").text
    return {source: float(value) for source, value in
            re.findall(r'^smg_background_cancels_total\{source="(\w+)"\} (\S+)', text, re.MULTILINE)}


def test_a_background_response_cancelled_on_the_other_node_stops_where_it_runs(pair, backend):
    """The node that runs it hears of the cancel: told over the mesh (memory backend), or, with a shared store
    and no mesh between the nodes, from the store; either way its generation stops and the response stays
    cancelled."""
    a, b = (client(n) for n in pair)
    before = background_cancels(pair[0])
    queued = a.responses.create(model=MODEL, input="Write at length.", background=True, max_output_tokens=2000)
    poll(b, queued.id, lambda r: r.status == "in_progress")
    assert b.responses.cancel(queued.id).status == "cancelled"
    meshed = "--mesh-bind" in pair[0].argv
    source = "peer" if meshed else "store"
    eventually(lambda: background_cancels(pair[0]).get(source, 0) >= before.get(source, 0) + 1, 20,
               lambda: f"the cancel by {source}: {background_cancels(pair[0])}")
    assert background_cancels(pair[0]).get("local", 0) == before.get("local", 0)
    # The run is gone from the node that ran it (2,000 tokens at 20 ms would be 40 s), and nothing it wrote
    # after the cancel replaced the cancelled status.
    eventually(lambda: "smg_background_responses 0.0" in httpx2.get(pair[0].url + "/metrics").text, 20,
               "the cancelled run still on the node that ran it")
    assert a.responses.retrieve(queued.id).status == b.responses.retrieve(queued.id).status == "cancelled"

"""The Responses and Conversations flows with the durable backends, through the real openai SDK: two
nodes with no mesh between them share one real PostgreSQL or Redis (tests/support/real_servers.py); the turns
alternate between the nodes, the first node is killed before the last turn, and the chain and the
conversation go on from what the database holds."""

from __future__ import annotations

import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess

from tests.support.real_servers import postgres_server, redis_server
from tests.support.history_script import MODEL, TOOLS, write_script


@pytest.fixture(scope="module")
def engine(log_dir, tmp_path_factory):
    script = write_script(tmp_path_factory.mktemp("durable") / "answers.jsonl")
    e = EngineProcess(["--zero-cost", "--script", str(script)], log_dir, "durable-engine")
    yield e
    e.stop()


@pytest.fixture(params=["postgres", "redis"])
def backend_args(request, tmp_path_factory):
    server = postgres_server if request.param == "postgres" else redis_server
    with server(tmp_path_factory.mktemp(request.param)) as url:
        flag = "--postgres-db-url" if request.param == "postgres" else "--redis-url"
        yield ["--history-backend", request.param, flag, url]


def test_turns_on_two_nodes_sharing_a_database(engine, backend_args, log_dir):
    nodes = [NodeProcess(["--worker-urls", engine.url, *backend_args], log_dir, f"durable-node{i}") for i in range(2)]
    try:
        a, b = (openai.OpenAI(base_url=n.url + "/v1", api_key="x", max_retries=0, timeout=30) for n in nodes)
        first = a.responses.create(model=MODEL, input="What is the weather in Oslo?", tools=TOOLS)
        (call,) = [item for item in first.output if item.type == "function_call"]
        with b.responses.stream(model=MODEL, previous_response_id=first.id, tools=TOOLS, input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": "14 degrees"}]) as stream:
            for _ in stream:
                pass
            second = stream.get_final_response()
        assert second.output_text == "It is 14 degrees in Oslo today."
        conversation = a.conversations.create(metadata={"user": "ada"})
        a.responses.create(model=MODEL, conversation=conversation.id, input="Hello, my name is Ada.")

        nodes[0].kill()
        third = b.responses.create(model=MODEL, previous_response_id=second.id, input="What did I ask?")
        assert third.output_text == "You asked about the weather in Oslo."
        assert b.responses.create(model=MODEL, conversation=conversation.id,
                                  input="What is my name?").output_text == "Your name is Ada."
        assert [i.role for i in b.conversations.items.list(conversation.id, order="asc")] == \
            ["user", "assistant", "user", "assistant"]
        assert [i.id for i in b.responses.input_items.list(first.id)] and b.responses.delete(first.id) is None
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(first.id)
    finally:
        for n in nodes:
            n.stop()


def test_a_store_that_stops_answering_is_a_504_not_a_503(engine, log_dir, tmp_path):
    """A 504 history_unavailable: the node is fine, its store is not. A 503 would make a balancer that
    counts them (nginx's max_fails with http_503) take healthy nodes out."""
    with redis_server(tmp_path / "redis") as url:
        node = NodeProcess(["--worker-urls", engine.url, "--history-backend", "redis", "--redis-url", url],
                           log_dir, "durable-node-redis-gone")
    try:  # the server is stopped now: the node started with it, then lost it
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
        with pytest.raises(openai.APIStatusError) as caught:
            client.responses.create(model=MODEL, input="Hello!")
        assert caught.value.status_code == 504 and caught.value.code == "history_unavailable"
        assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello!"}],
                                              max_tokens=4).choices  # everything else still works
    finally:
        node.stop()

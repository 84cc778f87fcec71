"""OpenAI-compatible HTTP workers are proxied as they are: here the worker is another smg-node."""

from __future__ import annotations

import openai
import pytest

from chaos.processes import NodeProcess

from tests.support.nodes import MODEL


@pytest.fixture(scope="module")
def front(node, log_dir):
    n = NodeProcess(["--worker-urls", node.url, "--policy", "round_robin"], log_dir, "front-node")
    yield n
    n.stop()


def test_models_come_from_the_http_worker(front):
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_is_proxied_unchanged(front, client):
    proxied = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "via a proxy"}]
    direct = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=7)
    via = proxied.chat.completions.create(model=MODEL, messages=messages, max_tokens=7)
    assert via.choices[0].message.content == direct.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in proxied.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=7, stream=True) if c.choices)
    assert streamed == direct.choices[0].message.content


def test_worker_errors_pass_through(front):
    proxied = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        proxied.chat.completions.create(model=MODEL, messages=[], max_tokens=1)


@pytest.fixture(scope="module")
def fake_workers(log_dir):
    """Two OpenAI-compatible workers serving one model ("twin"), scriptable (tests/support/fake_providers.py)."""
    from tests.support.fake_providers import FakeOpenAI, started

    with started({"a": FakeOpenAI("twin"), "b": FakeOpenAI("twin")}) as servers:
        node = NodeProcess(["--worker-urls", servers["a"].url, servers["b"].url, "--policy", "round_robin"], log_dir,
                           "front-of-fakes")
        yield servers, node
        node.stop()


def test_a_worker_that_answers_503_is_retried_and_one_that_breaks_mid_stream_ends_with_an_error(fake_workers):
    from tests.support.fake_providers import Failure, Reply, each_test

    servers, node = fake_workers
    proxied = openai.OpenAI(base_url=node.url + "/v1", api_key="client-key", max_retries=0, timeout=30)
    with each_test(servers):
        servers["a"].reply = lambda body: Reply(content="from a")
        servers["b"].reply = lambda body: Reply(content="from b")
        for _ in range(2):  # whichever the round robin picks first, the 503 is the one that is not relayed
            servers["a"].failures.append(Failure(503))
            reply = proxied.chat.completions.create(model="twin", messages=[{"role": "user", "content": "Hi"}])
            assert reply.choices[0].message.content == "from b"
            servers["a"].failures.clear()
        path, headers, body = servers["b"].requests[0]
        assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "Hi"}]
        assert "authorization" not in headers  # the client's key is the gateway's, never a worker's
        assert headers["accept-encoding"] == "identity"
        for server in servers.values():  # a 200 whose connection drops part way through the stream
            server.failures.append(Failure(200, drop_after_bytes=150))
        with pytest.raises(openai.APIError):
            for _ in proxied.chat.completions.create(model="twin", messages=[{"role": "user", "content": "Hi"}],
                                                     stream=True):
                pass
        for server in servers.values():
            server.failures.clear()
        streamed = "".join(c.choices[0].delta.content or "" for c in proxied.chat.completions.create(
            model="twin", messages=[{"role": "user", "content": "Hi"}], stream=True) if c.choices)
        assert streamed in ("from a", "from b")  # the pools' broken connections were not reused

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


def test_classify_is_relayed_to_http_workers_and_refused_for_grpc_engines(fake_workers, front):
    """vLLM's /classify (and /v1/classify): a classifier served by an OpenAI-compatible worker (vLLM's own server) is
    relayed as it is; a model of gRPC engines is a 400 saying why (the contract asks engines for embeddings only)."""
    import httpx2

    from tests.support.fake_providers import each_test

    servers, node = fake_workers
    with each_test(servers):
        for path in ("/v1/classify", "/classify"):
            answer = httpx2.post(node.url + path, json={"model": "twin", "input": ["a fine day", "rain"]})
            assert answer.status_code == 200, answer.text
            data = answer.json()["data"]
            assert [d["index"] for d in data] == [0, 1] and data[1]["probs"] == [0.6, 0.4]
            assert data[1]["label"] == "negative" and answer.json()["usage"]["prompt_tokens"] == 4
        relayed = [request for server in servers.values() for request in server.requests]
        assert {path for path, _, _ in relayed} == {"/classify"}  # vLLM's own path, whichever name came
        assert all(body["input"] == ["a fine day", "rain"] for _, _, body in relayed)
        missing = httpx2.post(node.url + "/v1/classify", json={"model": "nope", "input": "x"})
        assert missing.status_code == 404
    # (front's worker is a node whose model is a gRPC engine's: relayed there, refused by that node)
    refused = httpx2.post(front.url + "/v1/classify", json={"model": MODEL, "input": "x"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "classification_not_supported"

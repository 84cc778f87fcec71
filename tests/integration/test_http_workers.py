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

"""End to end through a real node and simulated engines, with the official openai SDK."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import orjson
import pytest

from tests.support.nodes import MODEL, prompt_ids

USER = [{"role": "user", "content": "Tell me about tokenizers."}]


def test_models_lists_the_engines_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_a_model_is_retrieved_by_id_and_an_unknown_one_is_openais_404(client):
    import openai

    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model" and model.owned_by == "smg-node"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("org/no-such-model")  # an id with a slash, as Hugging Face names are
    assert e.value.body["code"] == "model_not_found" and "org/no-such-model" in e.value.body["message"]


def test_chat_completion_text_is_what_the_engine_generated(client, http, predict):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=12)
    ids = prompt_ids(http, USER)
    assert r.choices[0].message.content == predict(ids, 12)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 12
    assert r.usage.total_tokens == len(ids) + 12
    assert r.usage.prompt_tokens_details.cached_tokens is not None


def test_streaming_chat_equals_non_streaming(client, http, predict):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Streaming, please. 🎉"}]
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == predict(prompt_ids(http, messages), 20)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_a_client_reading_slowly_gets_every_streamed_token_in_order(node, http, predict):
    """Tokens are written as they arrive by the task reading the engine; when the client's socket
    is full the rest waits for the request's own task. A client that reads nothing for a while
    (a small receive buffer, ~100 KB of events produced meanwhile) must still get all of them."""
    messages = [{"role": "user", "content": "A long answer, read slowly."}]
    body = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 1200, "stream": True})
    url = urlsplit(node.url)
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(1.5)  # the slow client: the engine makes ~2 tokens a millisecond meanwhile
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed before the end: {data[-300:]!r}"
            data += chunk
    head, chunked = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    events = b""
    while True:
        size_line, chunked = chunked.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        events, chunked = events + chunked[:size], chunked[size + 2:]
    payloads = [line[6:] for line in events.split(b"\n") if line.startswith(b"data: ")]
    assert payloads[-1] == b"[DONE]"
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == predict(prompt_ids(http, messages), 1200)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_max_completion_tokens_and_seed(client, http, predict):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=5, seed=1234,
                                       temperature=0.7, top_p=0.9)
    # The SGLang service has no seed field; the simulated engine then seeds from the prompt.
    assert r.usage.completion_tokens == 5
    assert r.choices[0].message.content == predict(prompt_ids(http, USER), 5)


def test_completions_stream_and_not(client, tokenizer, predict):
    prompt = "The quick brown fox"
    ids = tokenizer.encode_uncached(prompt, add_special_tokens=True)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=9)
    assert r.choices[0].text == predict(ids, 9) and r.object == "text_completion"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=9, stream=True) if c.choices)
    assert streamed == r.choices[0].text
    echoed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True)
    assert echoed.choices[0].text == prompt + predict(ids, 3)


def test_completions_accepts_token_ids(client, predict):
    r = client.completions.create(model=MODEL, prompt=[785, 3974, 13876, 38835], max_tokens=4)
    assert r.choices[0].text == predict([785, 3974, 13876, 38835], 4)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_across_token_boundaries(client, http, predict, stream):
    full = predict(prompt_ids(http, USER), 30)
    # Two whole words from the middle: the stop string spans two engine tokens.
    words = full.split(" ")
    stop = " " + words[5] + " " + words[6][:2]
    expected = full[:full.index(stop)]
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=30, stop=[stop],
                                                     stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][0]
    else:
        r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=30, stop=stop)
        text, reason = r.choices[0].message.content, r.choices[0].finish_reason
    assert text == expected and reason == "stop"


def test_stop_token_ids_end_generation_at_that_token(client, http, tokenizer, predict):
    full = predict(prompt_ids(http, USER), 10)
    ids = tokenizer.encode_uncached(full)
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=10,
                                       extra_body={"stop_token_ids": [ids[3]]})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == ids.index(ids[3]) + 1


def test_cached_tokens_reported_for_a_repeated_long_prompt(client):
    messages = [{"role": "system", "content": "You are a careful assistant. " * 60},
                {"role": "user", "content": "first question"}]
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    messages[1]["content"] = "second question"
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    # cache_aware sent it to the engine holding the prefix; whole 16-token blocks are reused.
    assert r.usage.prompt_tokens_details.cached_tokens >= 300


def test_request_id_is_returned_and_kept(http):
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 1},
                  headers={"x-request-id": "my-id-42"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "my-id-42"
    assert r.json()["id"] == "chatcmpl-my-id-42"
    generated = http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 1})
    assert len(generated.headers["x-request-id"]) == 32


def test_tools_reach_the_template_and_an_impossible_tool_choice_is_a_400(client):
    import openai

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, tools=tools, tool_choice="auto")
    assert r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, tools=tools,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert e.value.body["param"] == "tool_choice" and "get_time" in e.value.body["message"]

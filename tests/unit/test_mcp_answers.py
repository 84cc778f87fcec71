"""The gate in front of MCP servers' answers (gateway/mcp/answers.py), without sockets: an httpx2 MockTransport
plays the server, the gate releases whole messages only after they passed their bounds."""

from __future__ import annotations

import httpx2
import orjson
import pytest
import trio

from gateway.mcp.answers import AnswerRefused, GatedTransport, Trip


class Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: "list[bytes]") -> None:
        self.chunks = chunks
        self.read = 0

    async def __aiter__(self):
        for chunk in self.chunks:
            self.read += len(chunk)
            yield chunk


def gate(answer: "httpx2.Response", trip: Trip, answer_bytes: int = 1000, list_bytes: int = 300,
         items: int = 4) -> httpx2.AsyncClient:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return answer

    transport = GatedTransport(httpx2.MockTransport(handler), trip, answer_bytes, list_bytes, items)
    client = httpx2.AsyncClient(transport=transport)
    client.seen = seen
    return client


def call(method: str = "tools/call") -> dict:
    return {"jsonrpc": "2.0", "id": 1, "method": method}


async def test_a_json_body_is_released_whole_when_it_is_under_the_bound():
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "hi"}]}})
    client = gate(httpx2.Response(200, headers={"content-type": "application/json"},
                                  stream=Chunks([body[:10], body[10:]])), Trip())
    response = await client.post("http://s/mcp", json=call())
    assert response.content == body
    assert client.seen[0].headers["accept-encoding"] == "identity"


async def test_a_body_that_never_ends_is_read_no_further_than_the_bound():
    stream = Chunks([b"[" + b"0," * 100] * 1000)
    trip = Trip()
    client = gate(httpx2.Response(200, headers={"content-type": "application/json"}, stream=stream), trip)
    with pytest.raises(AnswerRefused, match=r"sent an answer of more than 1000 bytes \(--mcp-max-answer-bytes\)"):
        await client.post("http://s/mcp", json=call())
    assert stream.read <= 1000 + 201 and trip.reason.startswith("sent an answer")


async def test_a_declared_length_or_an_encoding_is_refused_before_reading():
    for headers, says in ([{"content-length": "5000"}, "answered 5000 bytes, more than 1000"],
                          [{"content-encoding": "gzip"}, "sent a gzip-encoded answer"]):
        stream = Chunks([b"x" * 10])
        client = gate(httpx2.Response(200, headers={"content-type": "application/json", **headers}, stream=stream),
                      Trip())
        with pytest.raises(AnswerRefused, match=says):
            await client.post("http://s/mcp", json=call())
        assert stream.read == 0


async def test_a_tool_list_has_its_own_bound():
    client = gate(httpx2.Response(200, headers={"content-type": "application/json"}, stream=Chunks([b"x" * 400])),
                  Trip())
    with pytest.raises(AnswerRefused, match=r"more than 300 bytes \(--mcp-max-output-bytes x 4\)"):
        await client.post("http://s/mcp", json=call("tools/list"))


@pytest.mark.parametrize("method, key", [("tools/call", "content"), ("tools/list", "tools"),
                                         ("resources/list", "resources"), ("prompts/list", "prompts")])
async def test_more_typed_items_than_the_bound_are_refused(method, key):
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {key: [{}] * 5}})
    client = gate(httpx2.Response(200, headers={"content-type": "application/json"}, stream=Chunks([body])), Trip())
    with pytest.raises(AnswerRefused, match=f"answered 5 {key} items in one message; at most 4 are read"):
        await client.post("http://s/mcp", json=call(method))
    batch = orjson.dumps([{"jsonrpc": "2.0", "id": 1, "result": {key: [{}] * 4}}])
    client = gate(httpx2.Response(200, headers={"content-type": "application/json"}, stream=Chunks([batch])), Trip())
    assert (await client.post("http://s/mcp", json=call(method))).content == batch


async def test_sse_events_are_released_as_each_ends_and_bounded_each():
    one = b'event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n\n'
    stream = Chunks([one[:7], one[7:] + one[:20], one[20:], b"data: " + b"x" * 400])  # the last never ends
    trip = Trip()
    client = gate(httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=stream), trip,
                  answer_bytes=500)
    got = []
    async with client.stream("POST", "http://s/mcp", json=call()) as response:
        with pytest.raises(AnswerRefused, match="sent an event of more than 500 bytes"):
            async for chunk in response.aiter_raw():
                got.append(chunk)
                stream.chunks.append(b"y" * 100)  # keeps coming after what was released
    assert b"".join(got) == one + one  # only whole events were released
    # An event carrying too many items is refused too; one over the bound inside one chunk as well.
    many = b"data: " + orjson.dumps({"jsonrpc": "2.0", "id": 2, "result": {"content": [{}] * 9}}) + b"\r\n\r\n"
    for chunks, says in (([many], "9 content items"), ([b"data: " + b"z" * 600 + b"\n\n"], "more than 500 bytes")):
        client = gate(httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Chunks(chunks)),
                      Trip(), answer_bytes=500)
        with pytest.raises(AnswerRefused, match=says):
            await client.post("http://s/mcp", json=call())


async def test_a_trip_cancels_what_waits_on_the_session():
    trip = Trip()
    with trip.watching() as scope:
        trip.trip("sent too much")
        await trio.sleep_forever()
    assert scope.cancelled_caught and trip.reason == "sent too much"
    with trip.watching() as scope:  # a session already tripped cancels at once
        await trio.sleep_forever()
    assert scope.cancelled_caught
    trip.trip("later")
    assert trip.reason == "sent too much"  # the first reason is the one said

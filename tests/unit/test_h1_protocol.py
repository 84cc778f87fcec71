"""The HTTP/1.1 protocol core (gateway/net/http1/protocol.py) in memory, against h11 as the independent
implementation: the same bytes give the same requests, bodies and refusals; our responses read back
through h11's client as we framed them. Each attack on the HTTP front is among the vectors."""

from __future__ import annotations

import random
from urllib.parse import urlsplit

import h11
import pytest

from gateway.net.http1.protocol import (LAST_CHUNK, RESPONSE_MOVES, UPGRADE, LocalProtocolError, ReadState, Refusal,
                                     RequestReader, ResponseState, chunk, response_head, response_move)

DATE = b"date: Wed, 25 Nov 2026 15:00:00 GMT\r\n"


class Collector:
    """A RequestSink that records what the reader says, as h11-comparable tuples."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def request_begun(self) -> None:
        pass

    def request_head(self, method, path, raw_path, query, headers, http_version, keep_alive, expect_continue):
        self.events.append(("request", method, raw_path + (b"?" + query if query else b""),
                            [(k, v.lower() if k == b"transfer-encoding" else v) for k, v in headers], http_version))

    def request_body(self, data: bytes) -> None:
        if self.events and self.events[-1][0] == "data":
            self.events[-1] = ("data", self.events[-1][1] + data)
        else:
            self.events.append(("data", data))

    def request_complete(self) -> None:
        self.events.append(("end",))


def ours(data: bytes, split_seed: int | None = None):
    """(events, refusal or None), feeding ``data`` whole or in seeded random pieces."""
    sink = Collector()
    reader = RequestReader(sink, url_bytes_max=1024, header_bytes_max=4096)
    pieces = [data]
    if split_seed is not None:
        rng = random.Random(split_seed)
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, 6))) if len(data) > 1 else []
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    for piece in pieces:
        outcome = reader.feed(piece)
        if outcome is not None:
            return sink.events, outcome
    return sink.events, None


def theirs(data: bytes):
    """(events, error status or None) from h11's server, reading every pipelined request."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=4096)
    conn.receive_data(data)
    events: list[tuple] = []
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                if event is h11.PAUSED and conn.their_state is h11.DONE:
                    conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                    conn.send(h11.EndOfMessage())
                    conn.start_next_cycle()
                    continue
                return events, None
            if isinstance(event, h11.Request):
                target = event.target
                if not target.startswith(b"/"):
                    parts = urlsplit(target)
                    target = (parts.path or b"/") + (b"?" + parts.query if parts.query else b"")
                # h11 lower-cases a Transfer-Encoding value; we hand values on as they came.
                events.append(("request", event.method.decode(), target,
                               [(k, v.lower() if k == b"transfer-encoding" else v) for k, v in event.headers],
                               event.http_version.decode()))
            elif isinstance(event, h11.Data):
                if events and events[-1][0] == "data":
                    events[-1] = ("data", events[-1][1] + event.data)
                else:
                    events.append(("data", bytes(event.data)))
            elif isinstance(event, h11.EndOfMessage):
                events.append(("end",))
    except h11.RemoteProtocolError as e:
        return events, e.error_status_hint


VALID = [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models?x=1&y=%20 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
    b"POST /v1/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
    b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n5;ext=1\r\nhello\r\n0\r\n\r\n",
    b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n2\r\nok\r\n0\r\nx-trailer: 1\r\n\r\n",
    b"GET http://example.test/abs?q=1 HTTP/1.1\r\nHost: example.test\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n",  # pipelined
    b"GET /old HTTP/1.0\r\n\r\n",  # HTTP/1.0 needs no Host
    b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
]


@pytest.mark.parametrize("data", VALID)
def test_valid_requests_read_as_h11_reads_them(data):
    expected, error = theirs(data)
    assert error is None
    for seed in (None, 1, 2, 3):  # whole, and in seeded random pieces
        got, refusal = ours(data, seed)
        assert refusal is None, (seed, refusal)
        assert got == expected, f"split seed {seed}"


# The attacks of the HTTP front, and other bytes both implementations must refuse.
INVALID = [
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc", 400, True),  # bad chunk size
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc", 501, False),
    (b"GET / HTTP/1.1\r\n\r\n", 400, False),  # no Host
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, False),
    (b"NOT HTTP AT ALL\r\n\r\n", 400, False),
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n", 400, False),
]


@pytest.mark.parametrize("data, status, during_body", INVALID)
def test_what_h11_refuses_we_refuse(data, status, during_body):
    _, their_error = theirs(data)
    assert their_error is not None  # h11 refuses it too
    for seed in (None, 5, 6):
        events, refusal = ours(data, seed)
        assert isinstance(refusal, Refusal), (seed, events)
        assert refusal.status == status and refusal.during_body == during_body
        if not during_body:
            assert not any(e[0] == "request" for e in events)  # refused before any app could see it


@pytest.mark.parametrize("data, status", [
    (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"CONNECT evil:443 HTTP/1.1\r\nHost: evil\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400),
    # Both framings: RFC 9112 lets a server go by Transfer-Encoding (h11 does) or refuse; we refuse (smuggling).
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", 400),
    # A head over the limit that arrives whole: h11 bounds only an event still incomplete.
    (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"v" * 5000 + b"\r\n\r\n", 431),
])
def test_where_we_are_stricter_than_h11(data, status):
    """h11 takes these (asterisk and authority forms are valid HTTP; "chunked, identity" it answers 501;
    see each case), a gateway has no use for them: refused, before any app sees them."""
    events, refusal = ours(data)
    assert isinstance(refusal, Refusal) and refusal.status == status and not events


def test_trailers_never_join_the_head_the_app_saw():
    sink = Collector()
    reader = RequestReader(sink, 1024, 4096)
    seen = []
    sink.request_head = lambda *a: seen.append(a[4])  # the very list handed on
    reader.feed(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"1\r\na\r\n0\r\nAuthorization: Bearer forged\r\n\r\n")
    assert seen[0] == [(b"host", b"x"), (b"transfer-encoding", b"chunked")]


def test_an_upgrade_is_reported_and_reading_stops():
    sink = Collector()
    reader = RequestReader(sink, 1024, 4096)
    assert reader.feed(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n") is UPGRADE
    assert reader.state is ReadState.CLOSED
    with pytest.raises(LocalProtocolError):
        reader.feed(b"more")


def test_states_follow_the_table():
    from gateway.net.http1.protocol import _MOVES
    sink = Collector()
    reader = RequestReader(sink, 1024, 4096)
    moves = []  # the callbacks' moves, one request through: each must be the table's
    reader._parser = __import__("httptools").HttpRequestParser(_Recorder(reader, moves))
    reader.feed(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
    assert len(moves) == 3 and all(_MOVES[key] is after for key, after in moves)
    reader = RequestReader(sink, 1024, 4096)
    assert reader.state is ReadState.IDLE
    reader.feed(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
    assert reader.state is ReadState.BODY and reader.in_message
    reader.feed(b"cd")
    assert reader.state is ReadState.IDLE and not reader.in_message
    assert reader.feed(b"GARBAGE\r\n\r\n").status == 400 and reader.state is ReadState.ERROR
    with pytest.raises(LocalProtocolError):
        reader.feed(b"GET / HTTP/1.1\r\n\r\n")


class _Recorder:
    """Passes httptools' callbacks to a reader, noting each state move it makes."""

    def __init__(self, reader, moves) -> None:
        self.reader, self.moves = reader, moves

    def __getattr__(self, name):
        method = getattr(self.reader, name)
        if name not in ("on_message_begin", "on_headers_complete", "on_message_complete"):
            return method
        move = {"on_message_begin": "begin", "on_headers_complete": "head_complete",
                "on_message_complete": "message_complete"}[name]

        def call(*args):
            before = self.reader.state
            method(*args)
            self.moves.append(((before, move), self.reader.state))
        return call


def read_back(head: bytes, body: bytes, request: bytes = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"):
    """Our response through h11's client: (status, headers, body, h11's verdict on the connection)."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(head + body)
    status, headers, data = None, None, b""
    while True:
        event = client.next_event()
        if isinstance(event, h11.Response):
            status, headers = event.status_code, dict(event.headers)
        elif isinstance(event, h11.Data):
            data += event.data
        elif isinstance(event, h11.EndOfMessage):
            return status, headers, data, client.their_state
        elif event is h11.NEED_DATA:
            client.receive_data(b"")  # the end of the connection: a body framed by the close ends here


@pytest.mark.parametrize("body, more, version, keep_alive, complete, framing, state", [
    (b"hello", False, "1.1", True, True, b"content-length", h11.DONE),
    (b"first", True, "1.1", True, True, b"transfer-encoding", h11.DONE),
    (b"x", False, "1.1", False, True, b"content-length", h11.MUST_CLOSE),  # the client asked to close
    (b"x", False, "1.1", True, False, b"content-length", h11.MUST_CLOSE),  # answered before the body ended
    (b"stream", True, "1.0", True, True, None, h11.MUST_CLOSE),  # HTTP/1.0 without a length: until close
])
def test_responses_read_back_through_h11_as_framed(body, more, version, keep_alive, complete, framing, state):
    headers = [(b"content-type", b"text/plain"), (b"transfer-encoding", b"gzip"), (b"connection", b"keep-alive")]
    head, chunked, stays = response_head(200, headers, body, more, version, keep_alive, complete, DATE)
    payload = (chunk(body) + chunk(b" more") + LAST_CHUNK) if chunked else (body + (b" more" if more else b""))
    status, got_headers, data, verdict = read_back(head, payload)
    assert status == 200 and data == body + (b" more" if more else b"")
    assert (framing is None) or framing in got_headers
    assert got_headers.get(b"transfer-encoding", b"chunked") == b"chunked"  # the app's gzip is not ours to send
    assert stays == (verdict is h11.DONE) and verdict is state


@pytest.mark.parametrize("state", list(ResponseState))
@pytest.mark.parametrize("move", ["start", "body", "end", "discard"])
def test_response_moves_are_the_table_and_nothing_else(state, move):
    if (state, move) in RESPONSE_MOVES:
        assert response_move(state, move) is RESPONSE_MOVES[state, move]
    else:  # e.g. a second start, a body before the start or after the end: the app broke ASGI's order
        with pytest.raises(LocalProtocolError):
            response_move(state, move)

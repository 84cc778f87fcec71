"""The outside calls' HTTP/1.1 client (gateway/net/http_client.py) against real sockets: servers of the test's own
that answer the ways servers do (lengths, chunks, a close, keep-alive and its end), and the ways they misbehave
(a head without end, a body past the caller's bound, a close mid-answer, a kept-alive connection closed under us),
over clear text and TLS."""

from __future__ import annotations

import functools
import ssl

import pytest
import trio

from gateway.net.http_client import BodyTooLarge, HttpClient, HttpClientConfig, HttpClientError, Origin
from tests.support.certs import CertAuthority


class Server:
    """A loopback server whose connection handler the test writes: it reads requests by their blank line (and
    Content-Length) and answers with what ``answer(request, n)`` returns for the n-th request of the connection
    (bytes to send, then "close" to close or None to keep the connection)."""

    def __init__(self, answer, tls: "ssl.SSLContext | None" = None) -> None:
        self.answer = answer
        self.tls = tls
        self.requests: list[bytes] = []
        self.connections = 0
        self.port = 0

    async def start(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _serve(self, stream) -> None:
        if self.tls is not None:
            stream = trio.SSLStream(stream, self.tls, server_side=True)
        self.connections += 1
        buffer = b""
        n = 0
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(rest) < length:
                    rest += await stream.receive_some(65536)
                request, buffer = head + b"\r\n\r\n" + rest[:length], rest[length:]
                self.requests.append(request)
                n += 1
                out = self.answer(request, n)
                for piece in out[:-1]:
                    await stream.send_all(piece)
                if out[-1] == "close":
                    await stream.aclose()
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


def ok(body: bytes, extra: bytes = b"") -> tuple:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
            % (len(body), extra, body), None)


async def test_a_post_is_answered_and_its_connection_kept_for_the_next(nursery):
    server = Server(lambda request, n: ok(b'{"n": %d}' % n))
    await server.start(nursery)
    client = HttpClient()
    for n in (1, 2, 3):
        async with await client.request(b"POST", server.url + "/v1/x?y=1", [(b"authorization", b"Bearer k")],
                                        b'{"a": 1}') as answer:
            assert answer.status == 200 and answer.header(b"content-type") == b"application/json"
            assert await answer.read(1024) == b'{"n": %d}' % n
    assert server.connections == 1 and client.connections_opened == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/x?y=1 HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % server.port)
    assert b"content-length: 8\r\n" in first and b"authorization: Bearer k\r\n" in first and first.endswith(b'{"a": 1}')
    await client.aclose()


async def test_the_first_read_after_a_request_waits_for_the_answer_rather_than_trying_the_socket(nursery, monkeypatch):
    """Nothing of an answer can be there before the server read the request: the client waits for the socket
    instead of a read that would find it empty (a system call and a BlockingIOError a request), over a fresh and a
    kept-alive connection, and the answer arrives as before."""
    from gateway.net import fast_receive

    empty_reads = []
    read = fast_receive.os.read

    def counting(fd, n):
        try:
            return read(fd, n)
        except BlockingIOError:
            empty_reads.append(fd)
            raise

    monkeypatch.setattr(fast_receive.os, "read", counting)
    server = Server(lambda request, n: ok(b'{"n": %d}' % n))
    await server.start(nursery)
    client = HttpClient()
    for n in (1, 2):
        async with await client.request(b"POST", server.url + "/x", [], b"{}") as answer:
            assert await answer.read(1024) == b'{"n": %d}' % n
    assert empty_reads == [] and client.connections_opened == 1
    await client.aclose()


async def test_a_chunked_stream_arrives_piece_by_piece(nursery):
    def answer(request, n):
        return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
                b"5\r\ndata:\r\n", b"4\r\n 1\n\n\r\n", b"0\r\n\r\n", None)

    server = Server(answer)
    await server.start(nursery)
    client = HttpClient()
    async with await client.request(b"POST", server.url + "/s", [], b"{}") as answer:
        pieces = [piece async for piece in answer]
    assert b"".join(pieces) == b"data: 1\n\n"
    # Read to its end: the connection is reused.
    async with await client.request(b"POST", server.url + "/s", [], b"{}") as answer:
        assert await answer.read(100) == b"data: 1\n\n"
    assert client.connections_opened == 1


async def test_an_answer_ended_by_the_close_is_read_and_its_connection_not_reused(nursery):
    server = Server(lambda request, n: (b"HTTP/1.1 200 OK\r\n\r\nall of it", "close"))
    await server.start(nursery)
    client = HttpClient()
    for _ in range(2):
        async with await client.request(b"GET", server.url + "/", []) as answer:
            assert await answer.read(100) == b"all of it"
    assert client.connections_opened == 2


async def test_a_body_past_the_callers_bound_is_refused_and_the_connection_closed(nursery):
    server = Server(lambda request, n: ok(b"x" * 100_000))
    await server.start(nursery)
    client = HttpClient()
    answer = await client.request(b"GET", server.url + "/", [])
    with pytest.raises(BodyTooLarge):
        await answer.read(10_000)
    async with await client.request(b"GET", server.url + "/", []) as again:  # a new connection, not the half-read one
        assert len(await again.read(200_000)) == 100_000
    assert client.connections_opened == 2


async def test_a_head_without_end_stops_at_its_bound(nursery):
    server = Server(lambda request, n: (b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"p" * 200_000 + b"\r\n", None))
    await server.start(nursery)
    client = HttpClient(HttpClientConfig(head_bytes_max=16_384))
    with pytest.raises(HttpClientError) as refused:
        await client.request(b"GET", server.url + "/", [])
    assert refused.value.kind == "too_large"


async def test_a_close_in_the_middle_of_an_answer_is_an_error(nursery):
    server = Server(lambda request, n: (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part", "close"))
    await server.start(nursery)
    client = HttpClient()
    answer = await client.request(b"GET", server.url + "/", [])
    with pytest.raises(HttpClientError) as broke:
        await answer.read(1000)
    assert broke.value.kind == "closed"


async def test_a_kept_alive_connection_the_server_closed_is_replaced_once(nursery):
    # The server answers, keeps the connection, and closes it when the next request comes (as a front that timed
    # the connection out does): the client sends that request again on a new connection.
    def answer(request, n):
        return ok(b"first") if n == 1 else ("close",)

    server = Server(answer)
    await server.start(nursery)
    client = HttpClient()
    async with await client.request(b"GET", server.url + "/", []) as first:
        assert await first.read(100) == b"first"
    async with await client.request(b"GET", server.url + "/", []) as second:
        assert await second.read(100) == b"first"  # the new connection's first request
    assert client.connections_opened == 2 and len(server.requests) == 3


async def test_a_server_that_never_answers_is_the_callers_deadline(nursery, autojump_clock):
    server = Server(lambda request, n: (b"", None))
    await server.start(nursery)
    client = HttpClient()
    with trio.move_on_after(30) as scope:
        await client.request(b"GET", server.url + "/", [])
    assert scope.cancelled_caught and not client._idle.get(Origin.of(server.url)[0])


async def test_no_listener_is_a_connect_error():
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
    with pytest.raises(HttpClientError) as refused:
        await HttpClient().request(b"GET", f"http://127.0.0.1:{port}/", [])
    assert refused.value.kind == "connect"


async def test_tls_verifies_the_server_and_reuses_its_connection(nursery, tmp_path):
    ca = CertAuthority(tmp_path)
    cert, key, _ = ca.issue("server", "127.0.0.1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = Server(lambda request, n: ok(b"secret %d" % n), tls=context)
    await server.start(nursery)
    client = HttpClient(HttpClientConfig(ca_path=str(ca.path)))
    for n in (1, 2):
        async with await client.request(b"POST", server.url + "/", [], b"{}") as answer:
            assert await answer.read(100) == b"secret %d" % n
    assert client.connections_opened == 1
    untrusting = HttpClient()  # the system's CAs do not know the test's
    with pytest.raises(HttpClientError) as refused:
        await untrusting.request(b"GET", server.url + "/", [])
    assert refused.value.kind == "connect"


def test_origins_and_targets_from_urls():
    origin, target = Origin.of("https://api.example.com/v1/chat?x=1")
    assert origin == Origin(True, "api.example.com", 443, b"api.example.com") and target == b"/v1/chat?x=1"
    origin, target = Origin.of("http://[::1]:8080")
    assert origin.host == "::1" and origin.host_header == b"[::1]:8080" and target == b"/"
    with pytest.raises(ValueError):
        Origin.of("ftp://example.com/")

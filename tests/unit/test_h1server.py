"""The HTTP/1.1 server on real loopback sockets, with a small ASGI app: framing, limits, disconnects.

Every test on the ``server`` fixture runs twice: in the clear and over TLS (``gateway.net.fast_tls``, OpenSSL on
the socket), with a trio TLS client."""

from __future__ import annotations

import socket
import ssl

import orjson
import pytest
import trio

from gateway.api.errors import transport_error_body
from gateway.net.http1.server import DISCONNECT_EXTENSION, H1Config, H1Server
from tests.support.certs import loopback_tls_contexts


async def echo_app(scope, receive, send):
    """Answers with what it saw; /stream sends three chunks; /hang waits for the client to go."""
    if scope["path"] == "/limit":  # refuses a large body before reading it, as the gateway's 413 does
        await send({"type": "http.response.start", "status": 413, "headers": []})
        await send({"type": "http.response.body", "body": b"too large"})
        return
    if scope["path"] == "/slow-body":  # waits for a body that never completes
        BODY_WAITERS.append(scope)
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"unreachable"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/slow":  # answers after half a second
        await trio.sleep(0.5)
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if scope["path"] == "/hang":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"started", "more_body": True})
        message = await receive()
        HANG_SEEN.append(message["type"])
        return
    if scope["path"] == "/watch":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"started", "more_body": True})
        cycle = scope["extensions"][DISCONNECT_EXTENSION]
        with trio.CancelScope() as cancel_scope:
            cycle.watch_disconnect(cancel_scope)
            await trio.sleep_forever()
        cycle.unwatch_disconnect(cancel_scope)
        WATCH_SEEN.append((cancel_scope.cancelled_caught, cycle.client_gone))
        WATCH_DONE.set()
        return
    if scope["path"] in ("/now", "/now-from-the-start"):
        await send_body_now_until_the_kernel_is_full(scope, send, scope["path"] == "/now-from-the-start")
        return
    if scope["path"] == "/fail":
        raise RuntimeError("boom")
    if scope["path"] == "/start-then-fail":  # the head is given but never goes out
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        raise RuntimeError("boom after the start")
    answer = orjson.dumps({"method": scope["method"], "path": scope["path"], "query": scope["query_string"].decode(),
                           "body": body.decode(), "version": scope["http_version"]})
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": answer})


NOW_CHUNK = b"x" * 16_000
NOW_CHUNKS_MAX = 4_000  # 64 MB: far more than any socket buffer of a client that does not read
NOW_SENT: list[bytes] = []
NOW_FULL = trio.Event()


async def send_body_now_until_the_kernel_is_full(scope, send, start_now: bool):
    """The extension's synchronous writes: until one is left partly unsent, then flush and end. ``start_now``: the
    head and the first piece written synchronously too (``start_body_now``)."""
    cycle = scope["extensions"][DISCONNECT_EXTENSION]
    if start_now:
        assert cycle.can_start_body_now() and not cycle.can_send_body_now()
        assert cycle.start_body_now(200, [(b"x-first", b"now")], b"head;")  # a few bytes: the kernel takes them
        assert not cycle.can_start_body_now()  # one start only
    else:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-first", b"awaited")]})
        assert not cycle.can_send_body_now()  # the head is not out yet: only send() writes it
        assert not cycle.can_start_body_now()  # the start was given: the head goes with the first body
        await send({"type": "http.response.body", "body": b"head;", "more_body": True})
    for i in range(NOW_CHUNKS_MAX):
        assert cycle.can_send_body_now()
        chunk = b"%06d%s;" % (i, NOW_CHUNK)
        NOW_SENT.append(chunk)
        if not cycle.send_body_now(chunk):
            break
    else:
        raise AssertionError("the kernel took every chunk of a client that reads nothing")
    assert not cycle.can_send_body_now()  # what is left must go first: no one may write past it
    NOW_FULL.set()
    await cycle.flush()
    assert cycle.can_send_body_now()
    NOW_SENT.append(b"after;")
    if not cycle.send_body_now(b"after;"):
        await cycle.flush()
    await send({"type": "http.response.body", "body": b"tail", "more_body": False})


HANG_SEEN: list[str] = []
BODY_WAITERS: list[dict] = []
WATCH_SEEN: list[tuple[bool, bool]] = []
WATCH_DONE = trio.Event()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """(server context, client context): a server certificate for 127.0.0.1 and a client trusting its CA."""
    return loopback_tls_contexts(tmp_path_factory.mktemp("certs"))


# The client side of the ``server`` fixture's connections: None in the clear, a TLS context over TLS.
_client_tls: list[ssl.SSLContext | None] = [None]


@pytest.fixture(params=["clear", "tls"])
async def server(nursery, request, tls_files):
    shutdown = trio.Event()
    server_tls, client_tls = tls_files if request.param == "tls" else (None, None)
    h1 = H1Server(echo_app, H1Config(header_bytes_max=4096, url_bytes_max=1024, keep_alive_timeout_s=5,
                                     request_read_timeout_s=5, graceful_timeout_s=5,
                                     error_body=transport_error_body, ssl_context=server_tls))
    url = await nursery.start(h1.serve, "127.0.0.1", 0, shutdown)
    port = int(url.rsplit(":", 1)[1])
    _client_tls[0] = client_tls
    yield h1, port, shutdown
    _client_tls[0] = None
    shutdown.set()


async def connect(port: int, sock: trio.socket.SocketType | None = None) -> "trio.SocketStream | trio.SSLStream":
    """A client connection to the ``server`` fixture (over TLS when it serves TLS); ``sock``: one made by
    the test (its own buffer sizes), not yet connected."""
    if sock is None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    else:
        await sock.connect(("127.0.0.1", port))
        stream = trio.SocketStream(sock)
    if _client_tls[0] is None:
        return stream
    tls = trio.SSLStream(stream, _client_tls[0], server_hostname="127.0.0.1")
    await tls.do_handshake()
    return tls


def raw_socket(stream: "trio.SocketStream | trio.SSLStream") -> trio.socket.SocketType:
    return stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket


async def read_response(stream: trio.SocketStream) -> tuple[int, dict[str, str], bytes, bytes]:
    """One response (status, headers, body); returns leftover bytes of the next one too."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, f"connection closed before a response head: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    if "content-length" in headers:
        length = int(headers["content-length"])
        while len(rest) < length:
            rest += await stream.receive_some(65536)
        return status, headers, rest[:length], rest[length:]
    assert headers.get("transfer-encoding") == "chunked"
    body = b""
    while True:
        while b"\r\n" not in rest:
            rest += await stream.receive_some(65536)
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        while len(rest) < size + 2:
            rest += await stream.receive_some(65536)
        body += rest[:size]
        rest = rest[size + 2:]
        if size == 0:
            return status, headers, body, rest


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


async def test_keep_alive_and_pipelined_requests_answered_in_order(server):
    _, port, _ = server
    stream = await connect(port)
    requests = b"".join(b"POST /echo?n=%d HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nab%d" % (i, i)
                        for i in range(5))
    await stream.send_all(requests)
    leftover = b""
    for i in range(5):
        status, headers, body, leftover = await _read_with(stream, leftover)
        assert status == 200 and orjson.loads(body) == {"method": "POST", "path": "/echo", "query": f"n={i}",
                                                        "body": f"ab{i}", "version": "1.1"}
        assert "date" in headers and "connection" not in headers
    await stream.aclose()


async def _read_with(stream, leftover: bytes):
    class Prefixed:
        def __init__(self):
            self.buffer = leftover

        async def receive_some(self, n):
            if self.buffer:
                out, self.buffer = self.buffer, b""
                return out
            return await stream.receive_some(n)
    return await read_response(Prefixed())


async def test_chunked_request_body_and_streamed_chunked_response(server):
    _, port, _ = server
    stream = await connect(port)
    await stream.send_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                          b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    status, _, body, _ = await read_response(stream)
    assert orjson.loads(body)["body"] == "hello world"
    await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
    status, headers, body, _ = await read_response(stream)
    assert status == 200 and headers["transfer-encoding"] == "chunked" and body == b"one two three"


async def test_http_1_0_closes_after_the_answer(server):
    _, port, _ = server
    stream = await connect(port)
    await stream.send_all(b"GET /stream HTTP/1.0\r\n\r\n")
    data = await read_until_closed(stream)
    assert data.startswith(b"HTTP/1.1 200") and b"connection: close" in data and data.endswith(b"one two three")


async def test_head_has_no_body_and_expect_continue_is_answered(server):
    _, port, _ = server
    stream = await connect(port)
    await stream.send_all(b"HEAD /echo HTTP/1.1\r\nhost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\n")  # a length, but no body
    await stream.send_all(b"POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n")
    interim = await stream.receive_some(65536)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    await stream.send_all(b"ok")
    status, _, body, _ = await read_response(stream)
    assert orjson.loads(body)["body"] == "ok"


@pytest.mark.parametrize("request_bytes, status", [
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
    # Framing attacks (h11's rules): refused before any app sees them.
    (b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\nabc", 501),
    # (llhttp refuses a coding list or a repeated header itself as malformed: 400 rather than h11's 501.)
    (b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, identity\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\nabc", 400),
    (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host
    (b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", 400),
    (b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n", 400),
    (b"CONNECT evil:443 HTTP/1.1\r\nhost: evil\r\n\r\n", 400),
    # A body that breaks after the head was accepted: the app waiting for it gets nothing, the client a 400.
    (b"POST /slow-body HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc", 400),
    (b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: nope\r\n\r\n", 400),
    (b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\nhost: x\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(60)) + b"\r\n", 431),
])
async def test_bad_requests_get_an_error_and_the_connection_closes(server, request_bytes, status):
    h1, port, _ = server
    stream = await connect(port)
    await stream.send_all(request_bytes)
    data = await read_until_closed(stream)
    assert data.startswith(b"HTTP/1.1 %d" % status), data[:80]
    body = data.split(b"\r\n\r\n", 1)[1]
    assert orjson.loads(body)["error"]["code"] == "bad_http_request"
    assert h1.refused >= 1
    await stream.aclose()
    with trio.fail_after(5):  # nothing is left behind: no connection, no request in the app
        while h1._connections or h1.in_flight:
            await trio.sleep(0.01)


async def test_malformed_bodies_leak_no_connection(server):
    """300 broken chunked bodies: each answered 400 and closed; the server holds nothing afterwards."""
    h1, port, _ = server
    for i in range(300):
        stream = await connect(port)
        await stream.send_all(b"POST /slow-body HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                              b"5\r\nhello\r\nnot-hex\r\n")
        data = await read_until_closed(stream)
        assert data.startswith(b"HTTP/1.1 400"), (i, data[:60])
        await stream.aclose()
    with trio.fail_after(5):
        while h1._connections or h1.in_flight:
            await trio.sleep(0.01)


async def test_absolute_form_targets_are_served_by_their_path(server):
    _, port, _ = server
    stream = await connect(port)
    await stream.send_all(b"GET http://example.test/echo?q=1 HTTP/1.1\r\nhost: example.test\r\n\r\n")
    status, _, body, _ = await read_response(stream)
    answer = orjson.loads(body)
    assert status == 200 and answer["path"] == "/echo" and answer["query"] == "q=1"


async def test_an_answer_before_the_body_ended_closes_and_swallows_no_next_request(server):
    """A 413 before a large body is read: the connection closes, so bytes sent after it are never taken
    for a request (nor a request for body bytes), and the client reads the 413 without a reset."""
    h1, port, _ = server
    stream = await connect(port)
    await stream.send_all(b"POST /limit HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000\r\n\r\n" + b"a" * 65536)
    status, headers, body, _ = await read_response(stream)
    assert status == 413 and headers["connection"] == "close"
    try:  # what follows on this connection is never answered as a request
        await stream.send_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
    except trio.BrokenResourceError:
        pass
    rest = b""
    with trio.fail_after(10):
        try:
            rest = await read_until_closed(stream)
        except trio.BrokenResourceError:
            pass
    assert b"HTTP/1.1" not in rest
    await stream.aclose()
    with trio.fail_after(5):
        while h1._connections:
            await trio.sleep(0.01)


async def test_a_client_that_stops_reading_is_cut_off_after_the_write_timeout(nursery):
    h1 = H1Server(echo_app, H1Config(write_timeout_s=0.5))
    port = int((await nursery.start(h1.serve, "127.0.0.1", 0, trio.Event())).rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"GET /now HTTP/1.1\r\nhost: x\r\n\r\n")  # the app writes until the kernel is full
    with trio.fail_after(20):
        while not h1._connections:
            await trio.sleep(0.01)
        while h1._connections or h1.in_flight:  # ends although the client never reads
            await trio.sleep(0.05)
    sock.close()


async def test_connections_over_the_limit_get_a_fast_503(nursery):
    h1 = H1Server(echo_app, H1Config(max_connections=2))
    port = int((await nursery.start(h1.serve, "127.0.0.1", 0, trio.Event())).rsplit(":", 1)[1])
    held = [await connect(port) for _ in range(2)]
    with trio.fail_after(5):
        while len(h1._connections) < 2:
            await trio.sleep(0.01)
    extra = await connect(port)
    data = await read_until_closed(extra)
    # Without an app's error shape (H1Config.error_body), the server's own answers are plain text.
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503") and b"content-type: text/plain" in head and body == b"too many connections"
    assert h1.refused_connections == 1
    for s in held:
        await s.aclose()


async def test_app_failure_is_a_500_and_missing_answer_too(server):
    _, port, _ = server
    stream = await connect(port)
    await stream.send_all(b"GET /fail HTTP/1.1\r\nhost: x\r\n\r\n")
    status, headers, body, _ = await read_response(stream)
    assert status == 500 and headers["connection"] == "close"


async def test_an_app_failing_after_its_start_gets_a_500_in_its_place_and_the_server_goes_on(server):
    """The head the app gave never went out, so the server can still answer 500 (before, sending the
    500's start raised "sent twice" out of the connection task and ended the whole server)."""
    _, port, _ = server
    stream = await connect(port)
    await stream.send_all(b"GET /start-then-fail HTTP/1.1\r\nhost: x\r\n\r\n")
    status, headers, _, _ = await read_response(stream)
    assert status == 500 and headers["connection"] == "close"
    again = await connect(port)
    await again.send_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
    assert (await read_response(again))[0] == 200


async def test_client_disconnect_reaches_the_app(server):
    _, port, _ = server
    HANG_SEEN.clear()
    stream = await connect(port)
    await stream.send_all(b"GET /hang HTTP/1.1\r\nhost: x\r\n\r\n")
    data = b""
    while b"started" not in data:
        data += await stream.receive_some(65536)
    raw_socket(stream).setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    await stream.aclose()
    with trio.fail_after(5):
        while not HANG_SEEN:
            await trio.sleep(0.01)
    assert HANG_SEEN == ["http.disconnect"]


async def test_the_disconnect_extension_cancels_a_watched_scope_without_a_task(server):
    global WATCH_DONE
    _, port, _ = server
    WATCH_SEEN.clear()
    WATCH_DONE = trio.Event()
    stream = await connect(port)
    await stream.send_all(b"GET /watch HTTP/1.1\r\nhost: x\r\n\r\n")
    data = b""
    while b"started" not in data:
        data += await stream.receive_some(65536)
    await stream.aclose()
    with trio.fail_after(5):
        await WATCH_DONE.wait()
    assert WATCH_SEEN == [(True, True)]


async def test_idle_keep_alive_connection_is_closed_after_the_timeout(nursery):
    shutdown = trio.Event()
    h1 = H1Server(echo_app, H1Config(keep_alive_timeout_s=0.2))
    url = await nursery.start(h1.serve, "127.0.0.1", 0, shutdown)
    stream = await connect(int(url.rsplit(":", 1)[1]))
    await stream.send_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
    await read_response(stream)
    with trio.fail_after(5):  # the server closes it, after 0.2 s idle
        assert await read_until_closed(stream) == b""
    shutdown.set()


async def test_an_answer_longer_than_the_keep_alive_timeout_keeps_the_connection_and_its_idle_clock(nursery):
    """The read deadline is moved lazily (it may still hold an earlier idle deadline while a request is answered):
    firing then must not close the connection, and the idle timeout still counts from the last answer."""
    shutdown = trio.Event()
    h1 = H1Server(echo_app, H1Config(keep_alive_timeout_s=0.2))
    url = await nursery.start(h1.serve, "127.0.0.1", 0, shutdown)
    stream = await connect(int(url.rsplit(":", 1)[1]))
    for path in (b"/echo", b"/slow", b"/slow", b"/echo"):
        await stream.send_all(b"GET " + path + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        status, _, _, leftover = await read_response(stream)
        assert status == 200 and not leftover, path
    answered = trio.current_time()
    with trio.fail_after(5):
        assert await read_until_closed(stream) == b""
    assert trio.current_time() - answered >= 0.2 - 0.005  # not before the keep-alive timeout (the clock's grain)
    shutdown.set()


async def test_shutdown_closes_idle_connections_and_lets_requests_finish(nursery):
    shutdown = trio.Event()
    h1 = H1Server(echo_app, H1Config(graceful_timeout_s=5))
    url = await nursery.start(h1.serve, "127.0.0.1", 0, shutdown)
    port = int(url.rsplit(":", 1)[1])
    idle = await connect(port)
    await idle.send_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
    await read_response(idle)
    shutdown.set()
    with trio.fail_after(5):
        assert await read_until_closed(idle) == b""
    with pytest.raises(OSError):
        await connect(port)


@pytest.mark.parametrize("path", ["/now", "/now-from-the-start"])
async def test_chunks_written_without_awaiting_keep_their_order_when_the_socket_fills(server, path):
    """``send_body_now`` writes what the kernel takes and keeps the rest for ``flush``; meanwhile
    ``can_send_body_now`` is false, so nothing overtakes the bytes left behind. The head and first piece the same
    whether awaited or written by ``start_body_now``."""
    global NOW_FULL
    _, port, _ = server
    NOW_SENT.clear()
    NOW_FULL = trio.Event()
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing fills up soon
    stream = await connect(port, sock)
    await stream.send_all(b"GET " + path.encode() + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    with trio.fail_after(30):
        await NOW_FULL.wait()  # the app saw a partial write before we read a byte
        status, headers, body, rest = await read_response(stream)
    assert status == 200 and headers["transfer-encoding"] == "chunked" and rest == b""
    assert headers["x-first"] == ("now" if path.endswith("start") else "awaited") and "date" in headers
    assert body == b"head;" + b"".join(NOW_SENT) + b"tail"
    assert len(NOW_SENT) > 2


# -- TLS only ------------------------------------------------------------------------------------


def open_fds() -> int:
    import os
    return len(os.listdir("/proc/self/fd"))


async def test_tls_refuses_clear_text_and_stalled_handshakes_and_keeps_no_socket(nursery, tls_files):
    """A client speaking plain HTTP to the TLS port, one that connects and says nothing, one that leaves
    mid-handshake: each closed and counted; the server goes on serving, and no file descriptor stays."""
    server_tls, client_tls = tls_files
    h1 = H1Server(echo_app, H1Config(ssl_context=server_tls, tls_handshake_timeout_s=0.3))
    port = int((await nursery.start(h1.serve, "127.0.0.1", 0, trio.Event())).rsplit(":", 1)[1])
    before = open_fds()
    for _ in range(20):
        clear = await trio.open_tcp_stream("127.0.0.1", port)
        await clear.send_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
        with trio.fail_after(5):
            try:  # closed, or reset (the server did not read all we sent): never an answer in the clear
                assert b"HTTP/1.1" not in await read_until_closed(clear)
            except trio.BrokenResourceError:
                pass
        await clear.aclose()
    silent = await trio.open_tcp_stream("127.0.0.1", port)
    half = await trio.open_tcp_stream("127.0.0.1", port)
    await half.send_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the start of a ClientHello, no more
    await half.aclose()
    with trio.fail_after(5):
        assert await read_until_closed(silent) == b""  # cut off after the handshake timeout
    await silent.aclose()
    with trio.fail_after(5):
        while h1._handshaking or h1._connections or h1.tls_refused < 22:
            await trio.sleep(0.01)
    assert h1.tls_refused == 22
    tls = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", port), client_tls, server_hostname="127.0.0.1")
    await tls.send_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
    assert (await read_response(tls))[0] == 200
    await tls.aclose()
    with trio.fail_after(5):
        while h1._connections or open_fds() > before:
            await trio.sleep(0.01)


async def test_tls_large_bodies_both_ways_across_many_records(server):
    """A 3 MB request body and its 3 MB echo: hundreds of TLS records each way, read in pieces, written
    while the client is still sending (the server's writes meet a full socket and retry)."""
    _, port, _ = server
    stream = await connect(port)
    body = bytes(range(97, 123)) * 120_000
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_all, b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
                           % (len(body), body))
        with trio.fail_after(30):
            status, _, answer, _ = await read_response(stream)
    assert status == 200 and orjson.loads(answer)["body"].encode() == body
    await stream.aclose()


async def test_tls_client_that_stops_reading_is_cut_off_after_the_write_timeout(nursery, tls_files):
    server_tls, client_tls = tls_files
    h1 = H1Server(echo_app, H1Config(write_timeout_s=0.5, ssl_context=server_tls))
    port = int((await nursery.start(h1.serve, "127.0.0.1", 0, trio.Event())).rsplit(":", 1)[1])
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SSLStream(trio.SocketStream(sock), client_tls, server_hostname="127.0.0.1")
    await stream.send_all(b"GET /now HTTP/1.1\r\nhost: x\r\n\r\n")  # the app writes until the kernel is full
    with trio.fail_after(20):
        while not h1._connections:
            await trio.sleep(0.01)
        while h1._connections or h1.in_flight:  # ends although the client never reads
            await trio.sleep(0.05)
    await trio.aclose_forcefully(stream)


def test_the_server_context_refuses_renegotiation(tls_files):
    """A client-started TLS 1.2 renegotiation would make the server run a handshake per request of it,
    and TlsSocket's writes are built on never needing a read."""
    server_tls, _ = tls_files
    assert server_tls.options & ssl.OP_NO_RENEGOTIATION


async def test_a_fault_of_ours_in_one_connection_ends_that_connection_not_the_server(nursery, monkeypatch):
    """An exception no handler expected (a bug, or a library raising what it should not) leaves the
    connection task: the server logs it and goes on serving the others."""
    from gateway.net.http1 import server as server_module
    real_answer_loop = server_module._Connection._answer_loop
    faults = []

    async def answer_loop_failing_once(self):
        if not faults:
            faults.append(self)
            raise trio.BusyResourceError("another task is already reading / writing this fd")
        return await real_answer_loop(self)

    monkeypatch.setattr(server_module._Connection, "_answer_loop", answer_loop_failing_once)
    h1 = H1Server(echo_app, H1Config())
    port = int((await nursery.start(h1.serve, "127.0.0.1", 0, trio.Event())).rsplit(":", 1)[1])
    broken = await connect(port)
    await broken.send_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
    with trio.fail_after(5):
        try:
            assert await read_until_closed(broken) == b""
        except trio.BrokenResourceError:
            pass
    again = await connect(port)
    await again.send_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
    assert (await read_response(again))[0] == 200 and len(faults) == 1

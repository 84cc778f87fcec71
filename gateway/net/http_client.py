"""An HTTP/1.1 client for the node's outside calls (hosted providers): kept-alive connections per origin, the
answer read as it arrives and bounded by the caller, on the event loop with the server side's habits.

Why not a library: a pure-Python client (httpx2/httpcore/h11, as the HTTP workers' relay uses) spent 23-32 % of a
relayed request's CPU in its own layers (issue 61's profile), where this one parses with llhttp (``httptools``,
the parser of the node's own server), reads and writes the socket the way the server does (``fast_receive``,
``fast_send``; over TLS, OpenSSL on the socket: ``fast_tls.TlsSocket``) and keeps nothing per request but the
answer's head and what the caller has not read yet.

    client = HttpClient(HttpClientConfig())
    async with await client.request(b"POST", "https://api.example.com/v1/chat", headers, body) as answer:
        answer.status, answer.header(b"content-type")
        async for piece in answer: ...          # the body as it arrives (streams), or
        await answer.read(limit)                # all of it, refused past ``limit`` bytes (BodyTooLarge)

What it does not do, on purpose: redirects (an API answers where it was asked), proxies from the environment
(the outside calls go where the operator configured them), cookies, HTTP/2, decompression (it asks for
``identity``; a compressed answer is a ProtocolError rather than a hidden multiplier of its size).

Rules it keeps:

* A connection goes back to its origin's pool only after its answer was read to the end and both sides said
  keep-alive; an answer abandoned part way (a cancelled request, a client that left) closes it.
* A request sent on a kept-alive connection that the server had already closed (EOF or reset before any byte of
  an answer) is sent again once on a new connection, as browsers and urllib3 do: the server never read it.
* The answer's head is bounded (``head_bytes_max``) as it arrives; the body is the caller's to bound (``read``'s
  limit, or what it keeps of each piece).
* Connecting is bounded by ``connect_timeout_s``; the rest is the caller's deadline (its cancel scope).

Errors are ``HttpClientError`` with a ``kind`` the caller maps: ``connect`` (no connection: refused, unreachable,
timed out, TLS handshake failed), ``closed`` (the connection broke while sending or reading), ``protocol`` (not an
HTTP/1.1 answer we accept), ``too_large`` (past a bound).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

import httptools
import trio

from .fast_receive import receive_some
from .fast_send import send_now
from .fast_tls import TlsSocket

READ_BYTES = 65536


@dataclasses.dataclass(frozen=True)
class HttpClientConfig:
    # Connecting (TCP, and TLS's handshake) to a provider's front takes tens of milliseconds; a host that does not
    # answer in 10 s is down for this request's purposes (the caller falls back).
    connect_timeout_s: float = 10.0
    # Kept-alive connections held per origin: enough for the requests one process has in flight to one provider at
    # moderate load; past it a finished connection is closed rather than kept.
    idle_per_origin: int = 64
    # A kept-alive connection unused this long is closed instead of reused: providers' fronts close idle
    # connections after 60-120 s (a reuse past that meets a reset, which costs a resend).
    idle_s: float = 50.0
    # The answer's status line and headers: providers send a few KiB (rate-limit and tracing headers).
    head_bytes_max: int = 64 * 1024
    # The CA bundle to verify servers with (None: the system's).
    ca_path: str | None = None


class HttpClientError(Exception):
    """A call that got no usable answer; ``kind`` says why (the module's docstring)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class BodyTooLarge(HttpClientError):
    def __init__(self, limit: int) -> None:
        super().__init__("too_large", f"the answer's body is larger than {limit} bytes")
        self.limit = limit


@dataclasses.dataclass(frozen=True, slots=True)
class Origin:
    """Where a request goes: scheme, host and port (the pool's key), and the Host header it takes."""

    tls: bool
    host: str
    port: int
    host_header: bytes

    @staticmethod
    def of(url: str) -> "tuple[Origin, bytes]":
        """The origin of ``url`` and its request target (path and query)."""
        return _origin_of(url)


# A node calls a few URLs over and over (a target's chat URL): each is split once. Bounded, for a caller whose URLs
# vary (an error is not kept: a bad URL is refused each time).
@functools.lru_cache(maxsize=1024)
def _origin_of(url: str) -> "tuple[Origin, bytes]":
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == (443 if tls else 80) else f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Origin(tls, host, port, host_header.encode("ascii")), target.encode("ascii")


class _PlainIo:
    """A clear-text socket with the reads and writes the server side uses."""

    __slots__ = ("stream",)

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    async def receive_some(self, max_bytes: int, drained: bool) -> bytes:
        return await receive_some(self.stream, max_bytes, drained)

    async def send_all(self, data: bytes) -> None:
        sent = send_now(self.stream, data)
        if sent < len(data):
            await self.stream.send_all(memoryview(data)[sent:])

    def close_now(self) -> None:
        self.stream.socket.close()


class _Connection:
    """One connection to an origin, reading one answer at a time through llhttp (the parser's callbacks fill the
    answer's head and its body pieces)."""

    __slots__ = ("io", "origin", "parser", "status", "headers", "head_bytes", "head_done", "pieces", "body_bytes",
                 "complete", "keep_alive", "drained", "used_at", "broken", "reused", "head_bytes_max")

    def __init__(self, io: Any, origin: Origin, head_bytes_max: int) -> None:
        self.io = io
        self.origin = origin
        self.head_bytes_max = head_bytes_max
        self.used_at = time.monotonic()
        self.broken = False
        self.reused = False  # taken from the pool: the server may have closed it meanwhile
        self.parser = httptools.HttpResponseParser(self)
        self.new_answer()

    def new_answer(self) -> None:
        """Ready for the next answer on this connection. The parser is kept: llhttp reads the answers of a
        kept-alive connection one after the other, and a connection is reused only after its answer completed."""
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.head_done = False
        self.pieces: collections.deque[bytes] = collections.deque()
        self.body_bytes = 0
        self.complete = False
        self.keep_alive = False
        self.drained = False

    # -- llhttp's callbacks --
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # llhttp answers this while the head is fresh

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)
        self.body_bytes += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    async def send(self, request: bytes) -> None:
        try:
            await self.io.send_all(request)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            self.broken = True
            raise HttpClientError("closed", f"the connection broke while sending: {e}") from None

    async def read_more(self) -> int:
        """Read what arrived and feed it to the parser: the bytes read (0: the server closed)."""
        try:
            data = await self.io.receive_some(READ_BYTES, self.drained)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            self.broken = True
            raise HttpClientError("closed", f"the connection broke while reading: {e}") from None
        self.drained = len(data) < READ_BYTES
        if not data:
            self.broken = True
            try:
                self.parser.feed_data(b"")  # an answer delimited by the close ends here
            except httptools.HttpParserError:
                pass
            if not self.complete:
                if not self.head_done:
                    raise HttpClientError("closed", "the server closed the connection before answering")
                if not self._ends_at_close():
                    raise HttpClientError("closed", "the server closed the connection in the middle of its answer")
                self.complete = True
            return 0
        if not self.head_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.broken = True
            raise HttpClientError("protocol", "the server switched protocols") from None
        except httptools.HttpParserError as e:
            self.broken = True
            raise HttpClientError("protocol", f"not an HTTP/1.1 answer: {e}") from None
        if not self.head_done and self.head_bytes > self.head_bytes_max:
            self.broken = True
            raise HttpClientError("too_large", f"the answer's head is larger than {self.head_bytes_max} bytes")
        return len(data)

    def _ends_at_close(self) -> bool:
        return not any(name in (b"content-length", b"transfer-encoding") for name, _ in self.headers)

    def reusable(self) -> bool:
        return self.complete and not self.broken and self.keep_alive

    def close(self) -> None:
        self.broken = True
        try:
            self.io.close_now()
        except OSError:
            pass


class HttpResponse:
    """An answer being read: ``status``, ``headers`` (names in lower case), then its body (iterate, or ``read``).
    Use it as an async context manager, or call ``aclose``: the connection goes back to its pool or is closed."""

    def __init__(self, client: "HttpClient", connection: _Connection) -> None:
        self._client = client
        self._connection: _Connection | None = connection
        self.status = connection.status
        self.headers = connection.headers

    @property
    def complete(self) -> bool:
        """The whole body has arrived: what is left to read is here already (no read will wait)."""
        connection = self._connection
        return connection is None or connection.complete

    def header(self, name: bytes) -> "bytes | None":
        """The first value of the header ``name`` (lower case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def __aiter__(self) -> "HttpResponse":
        return self

    async def __anext__(self) -> bytes:
        piece = await self.next_piece()
        if piece is None:
            raise StopAsyncIteration
        return piece

    async def next_piece(self) -> "bytes | None":
        """The next piece of the body as it arrived; None after the last. (Not an async generator: under trio each
        one is registered for finalization, a cost per answer that a stream's relay pays for nothing.)"""
        connection = self._connection
        if connection is None:
            return None
        pieces = connection.pieces
        while not pieces:
            if connection.complete:
                self._release()
                return None
            await connection.read_more()
        return pieces.popleft()

    async def read(self, limit: int) -> bytes:
        """The whole body; BodyTooLarge (the connection closed) as soon as more than ``limit`` bytes came."""
        connection = self._connection
        if connection is None:
            return b""
        while not connection.complete and connection.body_bytes <= limit:
            await connection.read_more()
        if connection.body_bytes > limit:
            self._abandon()
            raise BodyTooLarge(limit)
        body = b"".join(connection.pieces)
        connection.pieces.clear()
        self._release()
        return body

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._client._give_back(connection)

    def _abandon(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    async def aclose(self) -> None:
        """Done with the answer: a connection whose answer was not read to its end is closed."""
        connection = self._connection
        if connection is not None and connection.complete and not connection.pieces:
            self._release()
        else:
            self._abandon()

    async def __aenter__(self) -> "HttpResponse":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class HttpClient:
    """Connections to any number of origins, kept alive per origin (``HttpClientConfig`` says how many, how long)."""

    def __init__(self, config: HttpClientConfig = HttpClientConfig(),
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.config = config
        self._idle: dict[Origin, list[_Connection]] = {}
        self._ssl = ssl_context
        self.connections_opened = 0  # for tests and metrics: how often a request could not reuse one

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            context = ssl.create_default_context(cafile=self.config.ca_path)
            context.set_alpn_protocols(["http/1.1"])
            context.options |= ssl.OP_NO_RENEGOTIATION
            self._ssl = context
        return self._ssl

    async def request(self, method: bytes, url: str, headers: "list[tuple[bytes, bytes]]", body: bytes = b"",
                      origin: "tuple[Origin, bytes] | None" = None) -> HttpResponse:
        """Send the request and read its answer's head; the body is read through the answer. ``headers`` are sent
        as given, after Host and Content-Length (never the caller's own of those). ``origin``: the URL already
        split (``Origin.of``), for callers that send many requests to one URL."""
        where, target = origin or Origin.of(url)
        head = b"".join([method, b" ", target, b" HTTP/1.1\r\nhost: ", where.host_header,
                         b"\r\ncontent-length: %d\r\naccept-encoding: identity\r\n" % len(body),
                         *[b"%s: %s\r\n" % (name, value) for name, value in headers], b"\r\n"])
        data = head + body if len(body) < 65536 else None
        for first_try in (True, False):
            connection = self._take_idle(where) if first_try else None
            if connection is None:
                connection = await self._connect(where)
            try:
                if data is not None:
                    await connection.send(data)
                else:
                    await connection.send(head)
                    await connection.send(body)
                # Nothing of the answer can be here before the server has read the request: the first read waits
                # rather than trying the socket first (a system call and a BlockingIOError a request).
                connection.drained = True
                while not connection.head_done:
                    await connection.read_more()
            except HttpClientError as e:
                connection.close()
                # A kept-alive connection the server had closed: it never read this request. Once, on a new one.
                if connection.reused and e.kind == "closed" and connection.head_bytes == 0:
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            return HttpResponse(self, connection)
        raise AssertionError("unreachable")

    def _take_idle(self, origin: Origin) -> "_Connection | None":
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if now - connection.used_at <= self.config.idle_s:
                connection.new_answer()
                connection.reused = True
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        try:
            with trio.fail_after(self.config.connect_timeout_s):
                stream = await trio.open_tcp_stream(origin.host, origin.port)
                try:
                    if origin.tls:
                        io: Any = await TlsSocket.connect(stream, self._ssl_context(), origin.host)
                    else:
                        io = _PlainIo(stream)
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except trio.TooSlowError:
            raise HttpClientError("connect", f"no connection to {origin.host}:{origin.port} within "
                                             f"{self.config.connect_timeout_s:g} s") from None
        except (OSError, ssl.SSLError) as e:
            raise HttpClientError("connect", f"no connection to {origin.host}:{origin.port}: {e}") from None
        self.connections_opened += 1
        return _Connection(io, origin, self.config.head_bytes_max)

    def _give_back(self, connection: _Connection) -> None:
        if not connection.reusable():
            connection.close()
            return
        idle = self._idle.setdefault(connection.origin, [])
        if len(idle) >= self.config.idle_per_origin:
            connection.close()
            return
        connection.used_at = time.monotonic()
        idle.append(connection)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

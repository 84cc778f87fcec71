"""A lean HTTP/1.1 server for the gateway's ASGI app: trio sockets, httptools (llhttp) parsing.

Why not hypercorn (which stays available as ``--http-server hypercorn``): on this
machine hypercorn's per-request machinery on trio costs ~870 µs of CPU for a
trivial JSON answer and ~2,200 µs for 16 SSE events, while a bare trio server
parsing with httptools costs ~42 µs (ARCHITECTURE.md, design notes). The gateway's whole
budget per short request is ~1 ms (smg 1.13.0), so the server has to be small:
one task per connection reading and parsing, the ASGI app run in the
connection's own task, the head written together with the first body bytes,
every body chunk one ``send_all``.

What it serves: HTTP/1.0 and 1.1, keep-alive, pipelined requests (answered in
order), chunked request bodies, ``Expect: 100-continue``, HEAD. Responses
without a content-length stream as chunked (1.1) or until close (1.0). No
HTTP/2, no websockets: load balancers speak HTTP/1.1 to their upstreams.

Limits on what comes from outside (``H1Config``): request-line and header
bytes (431/414), body read-ahead before the app consumes it (reading the
socket pauses: TCP pushes back on the client), pipelined requests queued,
connections (``max_connections``: more are answered 503 at once and closed),
timeouts for a request being read, for an idle keep-alive connection, and for
a write the client does not take (``write_timeout_s``: a client that stops
reading cannot hold the request's admission slot).

What the bytes mean, and the rules they must follow, are ``protocol.py``'s
(sans-I/O: a request reader with an explicit state table, response framing as
pure functions; tested in memory against h11): this module acts on its verdicts.
A request refused in its head is answered with the reader's status (400, 414,
431, 501) and the connection closed; one whose body breaks after the head was
handed on has its app told the client is gone (``receive()``), and the 400 goes
in its place. An answer sent before its request's body ended closes the
connection; closing then lingers: our side is shut for writing, and what the
client still sends is read and dropped for up to LINGER_S, so the answer is not
lost to a reset.

Disconnects: the connection keeps reading while the app answers, so a client
that goes away is seen at once: ``receive()`` returns ``http.disconnect``, and
later sends are dropped. The scope's ``extensions`` carry DISCONNECT_EXTENSION:
the request's cycle, whose ``watch_disconnect(cancel_scope)`` has the
connection cancel that scope when the client goes. The app uses it instead of
a task per request waiting on ``receive()`` (a task start, a cancel and two
trips through the scheduler per request, ~9 % of a short request's CPU).
The same cycle writes body chunks synchronously from any task
(``can_send_body_now``, ``send_body_now``, ``flush``): a streamed generation's
tokens are written by the task that reads them from the engine, without a
wake-up of the request's own task per token.
"""

from __future__ import annotations

import collections
import dataclasses
import email.utils
import errno
import functools
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

from ..fast_receive import receive_some
from ..fast_send import send_now
from ..fast_tls import TlsSocket
from ...observe.metrics import counter
from .protocol import CHUNK, LAST_CHUNK, UPGRADE, Refusal, RequestReader, ResponseState, response_head, response_move

# The response states bound once: they are compared on every send.
_R_IDLE, _R_STARTED, _R_BODY, _R_DONE = (ResponseState.IDLE, ResponseState.STARTED, ResponseState.BODY,
                                         ResponseState.DONE)

log = logging.getLogger("gateway.http")

DISCONNECT_EXTENSION = "smg.disconnect"

App = Callable[[dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

# After an answer sent before its request body ended: drop what the client still sends this long
# (and at most this much) before closing, so that the answer is read rather than lost to a TCP reset.
LINGER_S = 2.0
LINGER_BYTES_MAX = 4 * 1024 * 1024

_NEVER = float("inf")
# How far a connection's read deadline may stay before the one that applies (_Connection._arm): moving it costs
# trio a re-registration, so it moves about once a second on a busy connection, not twice a request (at most a
# twentieth of the keep-alive timeout: a scope that fires early is replaced, once).
_DEADLINE_SLACK_S = 1.0

# The answers the server gives itself (a malformed request, too many connections, an app that failed
# before answering) take their body from the application, which knows its API's error shape:
# (status, message, code) -> (content type, body).
ErrorBody = Callable[[int, str, "str | None"], "tuple[bytes, bytes]"]


def plain_error_body(status: int, message: str, code: str | None) -> tuple[bytes, bytes]:
    """The default: the message as text (an app with an error format of its own passes that)."""
    return b"text/plain; charset=utf-8", message.encode()


@dataclasses.dataclass
class H1Config:
    """Limits and timeouts of the HTTP/1.1 server; the defaults suit a gateway behind nginx/HAProxy."""

    # Longer than nginx's and HAProxy's upstream keep-alive defaults (60 s / 50 s), so the
    # balancer closes idle connections first and never sends on one we are closing.
    keep_alive_timeout_s: float = 75.0
    # A request (head and body) must arrive within this once it has begun: slow-loris guard.
    request_read_timeout_s: float = 60.0
    # Request line plus headers; real clients send < 8 KiB, an API key included.
    header_bytes_max: int = 64 * 1024
    url_bytes_max: int = 16 * 1024
    # Body bytes read ahead of the app; beyond this the socket is not read until the app consumes.
    body_read_ahead_bytes_max: int = 1024 * 1024
    # Pipelined requests parsed ahead of the one being answered.
    pipeline_depth_max: int = 16
    backlog: int = 2048
    # In-flight requests get this long to finish after shutdown begins; idle connections close at once.
    graceful_timeout_s: float = 30.0
    # A write the client's socket does not take within this ends the connection (and cancels its
    # request): a reader that stalls on purpose cannot hold a slot. Long enough for any real client.
    write_timeout_s: float = 60.0
    # TLS (gateway/net/tls.py): every connection is wrapped in this context; None serves plain HTTP.
    ssl_context: ssl.SSLContext | None = None
    tls_handshake_timeout_s: float = 10.0
    # Connections served at once; past it, a new one gets a 503 and is closed without reading it.
    # Each costs a descriptor and ~10 KB; 8,192 stays below common descriptor limits with room to spare.
    max_connections: int = 8192
    # SO_REUSEPORT: several worker processes bind the same port and the kernel spreads connections.
    reuse_port: bool = False
    # The body of the answers the server gives itself (see ErrorBody).
    error_body: ErrorBody = plain_error_body


def _wake(lot: trio.lowlevel.ParkingLot) -> None:
    """Wakes the tasks parked in ``lot``. Most lots are empty when a request's step wakes them, and trio's
    ``unpark_all`` costs ~0.6 us even then (several times a request): an empty lot costs a length check."""
    if lot:
        lot.unpark_all()


class _HttpDate:
    """The Date header, formatted once per second rather than per response."""

    def __init__(self) -> None:
        self._second = 0
        self._header = b""

    def header(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._header = b"date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._header


_DATE = _HttpDate()


class _Cycle:
    """One request and its response."""

    __slots__ = ("scope", "chunks", "buffered_bytes", "body_complete", "body_delivered", "response", "keep_alive",
                 "head_only", "chunked", "expect_continue", "continue_sent",
                 "status", "headers", "error_status", "error_message", "wakeup", "connection", "disconnect_scopes")

    def __init__(self, connection: "_Connection", scope: dict[str, Any], keep_alive: bool,
                 expect_continue: bool) -> None:
        self.connection = connection
        self.scope = scope
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered_bytes = 0
        self.body_complete = False
        self.body_delivered = False
        self.response = _R_IDLE  # where the app's response stands (protocol.RESPONSE_MOVES)
        self.keep_alive = keep_alive
        self.head_only = scope["method"] == "HEAD"
        self.chunked = False
        self.expect_continue = expect_continue
        self.continue_sent = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] | None = None  # from http.response.start, until written
        self.error_status = 0
        self.error_message = ""
        self.wakeup = trio.lowlevel.ParkingLot()
        self.disconnect_scopes: list[trio.CancelScope] = []

    # -- the disconnect extension (scope["extensions"][DISCONNECT_EXTENSION]) ----

    @property
    def client_gone(self) -> bool:
        return self.connection.closed

    def watch_disconnect(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` when the client goes away (now, if it already has)."""
        if self.connection.closed:
            scope.cancel()
        else:
            self.disconnect_scopes.append(scope)

    def unwatch_disconnect(self, scope: trio.CancelScope) -> None:
        if scope in self.disconnect_scopes:
            self.disconnect_scopes.remove(scope)

    # -- ASGI receive ------------------------------------------------------

    async def receive(self) -> dict[str, Any]:
        connection = self.connection
        while True:
            if not self.body_delivered:
                if self.body_complete:
                    self.body_delivered = True
                    body = b"".join(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
                    self.chunks.clear()
                    self.buffered_bytes = 0
                    connection.reading_allowed()
                    return {"type": "http.request", "body": body, "more_body": False}
                if self.chunks:
                    body = b"".join(self.chunks)
                    self.chunks.clear()
                    self.buffered_bytes = 0
                    connection.reading_allowed()
                    return {"type": "http.request", "body": body, "more_body": True}
                if self.expect_continue and not self.continue_sent and not connection.closed:
                    self.continue_sent = True
                    await connection.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    continue
            if self.response is _R_DONE or connection.closed or self.error_status:
                return {"type": "http.disconnect"}
            await self.wakeup.park()

    # -- ASGI send ---------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.response is not _R_IDLE:
                response_move(self.response, "start")  # raises: a second start
            self.response = _R_STARTED  # the table's move from IDLE, written out: it runs for every response
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        state = self.response
        if state is not _R_BODY and state is not _R_STARTED:
            response_move(state, "body")  # raises: a body before the start, or after the end
        out = self._framed(state, body, more_body)
        if out or not more_body:  # the end writes even with nothing new: send_body_now may have left bytes
            await self.connection.write(out)
        if not more_body:
            # Only now (the bytes are out): a receive() waiting for the end returns http.disconnect,
            # and an app watching for disconnects must not cancel its own last write.
            _wake(self.wakeup)

    def _framed(self, state: object, body: bytes, more_body: bool) -> bytes:
        """The bytes ``body`` goes out as: after the head when it is the first (``state`` STARTED), chunked or not."""
        out = b""
        if state is _R_STARTED:
            out = self._head(body, more_body)
        self.response = _R_BODY if more_body else _R_DONE  # the table's moves from STARTED and BODY
        if not self.head_only:
            if self.chunked:
                if body:
                    out += CHUNK % (len(body), body)
                if not more_body:
                    out += LAST_CHUNK
            else:
                out += body
        return out

    # -- body chunks written without awaiting (the extension's other use) -------

    def can_start_body_now(self) -> bool:
        """``start_body_now`` may be called: nothing of the response sent or started, no write pending."""
        return self.response is _R_IDLE and self.connection.can_write_now()

    def start_body_now(self, status: int, headers: "list[tuple[bytes, bytes]]", body: bytes) -> bool:
        """The response's start and its first body bytes, more to come, written synchronously from any task
        (``can_start_body_now`` first): what ``send`` does for http.response.start and such a body. So a stream's
        first piece needs no wake-up of the app's task either. False when ``flush()`` must follow."""
        self.response = _R_STARTED
        self.status = status
        self.headers = headers
        return self.connection.write_now(self._framed(_R_STARTED, body, True))

    def can_send_body_now(self) -> bool:
        """``send_body_now`` may be called: the head is out, the body goes on, no write is pending."""
        return self.response is _R_BODY and self.connection.can_write_now()

    def send_body_now(self, body: bytes) -> bool:
        """Write one more chunk of the body synchronously, from any task (``can_send_body_now`` first).

        False when the kernel did not take all of it: ``flush()`` must follow (the rest waits for it).
        """
        if self.head_only or not body:
            return True
        if self.chunked:
            body = CHUNK % (len(body), body)
        return self.connection.write_now(body)

    async def flush(self) -> None:
        """Write what ``send_body_now`` left, waiting until the client's socket takes it."""
        await self.connection.write(b"")

    def _head(self, body: bytes, more_body: bool) -> bytes:
        """The response head, framed by protocol.response_head (which decides keep-alive too)."""
        head, self.chunked, self.keep_alive = response_head(
            self.status, self.headers, body, more_body, self.scope["http_version"],
            self.keep_alive and not self.connection.server.shutting_down, self.body_complete, _DATE.header())
        self.headers = None
        return head


class _Connection:
    """One client connection: a reader that parses, and the requests answered in order."""

    def __init__(self, server: "H1Server", stream: "trio.SocketStream | TlsSocket") -> None:
        self.server = server
        self.stream = stream
        # Over TLS OpenSSL reads and writes the socket (TlsSocket): the same fast paths, its own calls.
        self.tls = isinstance(stream, TlsSocket)
        self._send_now = stream.send_now if self.tls else functools.partial(send_now, stream)
        self.closed = False
        config = server.config
        self._reader = RequestReader(self, config.url_bytes_max, config.header_bytes_max)
        self._cycles: collections.deque[_Cycle] = collections.deque()
        self._parsing: _Cycle | None = None  # the request whose body the reader is reading
        self._upgraded = False
        self._unread_input = False  # a request body was cut short: linger before closing
        self._cycles_changed = trio.lowlevel.ParkingLot()
        self._read_allowed = trio.lowlevel.ParkingLot()
        self._send_lock = trio.StrictFIFOLock()
        self._backlog = b""  # what write_now could not write: the next write's first bytes
        self._read_scope: trio.CancelScope | None = None
        self._message_deadline: float | None = None  # when the request being read must have arrived
        # When the connection, idle since it opened or since its last answer, is closed if nothing comes.
        self._idle_deadline = trio.current_time() + config.keep_alive_timeout_s
        self._slack_s = min(_DEADLINE_SLACK_S, config.keep_alive_timeout_s / 20)  # (_arm)
        try:
            sock = stream.socket
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._client = _address(sock.getpeername())
            self._server_address = _address(sock.getsockname())
        except OSError:
            self._client = self._server_address = None

    # -- the reader's events (protocol.RequestSink), inside feed ----------------

    def request_head(self, method: str, path: str, raw_path: bytes, query: bytes,
                     headers: "list[tuple[bytes, bytes]]", http_version: str, keep_alive: bool,
                     expect_continue: bool) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": http_version,
                 "method": method, "scheme": "https" if self.tls else "http", "path": path, "raw_path": raw_path,
                 "query_string": query, "root_path": "", "headers": headers, "client": self._client,
                 "server": self._server_address}
        cycle = _Cycle(self, scope, keep_alive, expect_continue)
        scope["extensions"] = {DISCONNECT_EXTENSION: cycle}
        self._parsing = cycle
        self._cycles.append(cycle)
        _wake(self._cycles_changed)

    def request_body(self, body: bytes) -> None:
        cycle = self._parsing
        if cycle is None or cycle.body_delivered or cycle.response is _R_DONE:
            return  # the app is done with this request: unread body bytes are dropped
        cycle.chunks.append(body)
        cycle.buffered_bytes += len(body)
        _wake(cycle.wakeup)

    def request_complete(self) -> None:
        self._message_deadline = None  # the next request's clock starts when it does
        cycle = self._parsing
        self._parsing = None
        if cycle is not None:
            cycle.body_complete = True
            _wake(cycle.wakeup)

    # -- reading ---------------------------------------------------------------

    def reading_allowed(self) -> None:
        _wake(self._read_allowed)

    def _must_pause(self) -> bool:
        parsing = self._parsing
        if parsing is not None and parsing.buffered_bytes >= self.server.config.body_read_ahead_bytes_max:
            return True
        return len(self._cycles) > self.server.config.pipeline_depth_max

    async def _read_loop(self) -> None:
        # One scope while no timeout fires (a scope per read cost ~30 calls per request), its deadline kept
        # within a little of the one that applies (_arm). A scope that fires when nothing has timed out (the
        # connection is busy answering, or idle with a later deadline than the scope's) is replaced and the
        # reading goes on: a cancelled read took no bytes.
        while True:
            with trio.CancelScope(deadline=self._deadline_now()) as scope:
                self._read_scope = scope
                await self._read_until_done(scope)
            self._read_scope = None
            if not scope.cancelled_caught or self.closed:
                return
            if trio.current_time() >= self._deadline_now():  # a read timed out
                self._lost()
                return

    def _arm(self, scope: trio.CancelScope) -> None:
        """The read scope's deadline for what the connection does now (``_deadline_now``). Moving it costs trio a
        re-registration (~2 us, twice a request before): it moves to come earlier (a timeout never runs late) or to
        gain more than ``_DEADLINE_SLACK_S``; left earlier than the one that applies (or set while a request is
        answered, when none does), it fires and the read loop replaces the scope with one at the deadline that
        applies then, so every timeout runs when it should."""
        deadline = self._deadline_now()
        if deadline == _NEVER:
            return
        current = scope.deadline
        if deadline < current or deadline - current > self._slack_s:
            scope.deadline = deadline

    def _deadline_now(self) -> float:
        """When reading must have given something by now: none while paused (by us, not idle) or answering."""
        return _NEVER if self._must_pause() else self._read_deadline()

    async def _read_until_done(self, scope: trio.CancelScope) -> None:
        drained = False  # the last read found the socket emptied (fast_receive)
        while not self.closed and not self._upgraded:
            if self._must_pause():
                while self._must_pause() and not self.closed:
                    await self._read_allowed.park()
            self._arm(scope)
            try:
                data = await (self.stream.receive_some(65536, drained) if self.tls
                              else receive_some(self.stream, 65536, drained))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                self._lost()
                return
            drained = len(data) < 65536
            outcome = self._reader.feed(data)
            if outcome is None:
                continue
            if outcome is UPGRADE:
                # No upgrades (h2c, websocket): answer the request as plain HTTP/1.1, then close.
                self._upgraded = True
                if self._cycles:
                    self._cycles[-1].keep_alive = False
                else:
                    self._refuse(400, "protocol upgrades are not supported")
            elif isinstance(outcome, Refusal):
                if outcome.during_body and self._parsing is not None:
                    self._body_broken(self._parsing, outcome.message)
                else:
                    self._refuse(outcome.status, outcome.message)
            return

    def _read_deadline(self) -> float:
        """Idle between requests: the keep-alive timeout; mid-request: the read timeout; else none."""
        config = self.server.config
        if self._reader.in_message:
            # Fixed at the first read after the request began (the read that began it): trickling a
            # byte at a time does not extend it (slow loris).
            if self._message_deadline is None:
                self._message_deadline = trio.current_time() + config.request_read_timeout_s
            return self._message_deadline
        if not self._cycles:
            return self._idle_deadline
        return _NEVER  # a request is being answered: we only read to see the client go

    def _lost(self) -> None:
        """The client closed (or timed out idle): every request of the connection sees a disconnect."""
        self.closed = True
        for cycle in self._cycles:
            _wake(cycle.wakeup)
            for scope in cycle.disconnect_scopes:
                scope.cancel()
        if self._parsing is not None:
            _wake(self._parsing.wakeup)
        _wake(self._cycles_changed)

    def _body_broken(self, cycle: _Cycle, message: str) -> None:
        """The body of a request already handed to the app cannot be parsed: the app, waiting for it in
        ``receive()``, is told the client is gone (it stops without answering), and the 400 goes in its
        place (the answer loop sends it); then the connection closes. A watched generation cannot be
        running: it starts only once the whole body was read."""
        self._parsing = None
        self._unread_input = True
        cycle.error_status = 400
        cycle.error_message = message
        cycle.keep_alive = False
        self.server.refused += 1
        _wake(cycle.wakeup)
        _wake(self._cycles_changed)

    def _refuse(self, status: int, message: str) -> None:
        """Queue an error answer after the requests already parsed, then stop reading."""
        cycle = _Cycle(self, {"method": "GET", "http_version": "1.1"}, False, False)
        cycle.error_status = status
        cycle.error_message = message
        self._cycles.append(cycle)
        _wake(self._cycles_changed)
        self.server.refused += 1

    # -- answering ---------------------------------------------------------------

    def can_write_now(self) -> bool:
        """A synchronous ``write_now`` would keep the order: no write in progress, none left over."""
        return not self._backlog and not self._send_lock.locked()

    def write_now(self, data: bytes) -> bool:
        """Write from any task without awaiting (after ``can_write_now``); False when some bytes wait.

        What the kernel does not take now is kept and goes first with the next ``write``, which
        the caller must make soon (``write(b"")`` flushes it): the order of the bytes holds because
        ``can_write_now`` is false meanwhile.
        """
        if self.closed:
            return True  # the client went away: nowhere to write, nothing to wait for
        try:
            sent = self._send_now(data)
        except (trio.BrokenResourceError, OSError):
            self._lost()
            return True
        if sent == len(data):
            return True
        self._backlog = data[sent:]
        return False

    async def write(self, data: bytes) -> None:
        if self.closed:
            return  # the client went away: what the app still sends goes nowhere
        if self._backlog:  # left by write_now: it goes first
            data, self._backlog = self._backlog + data, b""
        if not data:
            return
        try:
            if not self._send_lock.locked():  # no write in progress: try it synchronously
                sent = self._send_now(data)
                if sent == len(data):
                    return
                data = data[sent:]
            async with self._send_lock:  # (acquired before any yield: nothing can write in between)
                with trio.move_on_after(self.server.config.write_timeout_s) as deadline:
                    await self.stream.send_all(data)
                if deadline.cancelled_caught:
                    log.info("a client took no bytes for %.0fs: closing its connection",
                             self.server.config.write_timeout_s)
                    self._lost()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._lost()

    async def _answer_loop(self) -> None:
        server = self.server
        while True:
            while not self._cycles:
                if self.closed or server.shutting_down or self._upgraded:
                    return
                await self._cycles_changed.park()
            cycle = self._cycles[0]
            if cycle.error_status:
                await self._answer_error(cycle)
                return
            if self.closed and not cycle.body_complete:
                return
            server.in_flight += 1
            try:
                await server.app(cycle.scope, cycle.receive, cycle.send)
            except Exception:
                log.exception("ASGI app failed on %s %s", cycle.scope["method"], cycle.scope["path"])
            finally:
                server.in_flight -= 1
                if server.in_flight == 0:
                    _wake(server.idle)
            response = cycle.response
            nothing_out = response is _R_IDLE or response is _R_STARTED
            if response is _R_STARTED:
                cycle.response = response_move(response, "discard")  # its head never went out: ours goes
                cycle.headers = None
            if cycle.error_status:  # its body broke while the app waited for it: the 400, if nothing went out
                if nothing_out and not self.closed:
                    await self._answer_error(cycle)
                return
            if nothing_out and not self.closed:
                content_type, body = self.server.config.error_body(500, "internal error", None)
                cycle.keep_alive = False
                await cycle.send({"type": "http.response.start", "status": 500,
                                  "headers": [(b"content-type", content_type)]})
                await cycle.send({"type": "http.response.body", "body": body})
            elif cycle.response is not _R_DONE:
                return  # the app stopped mid-body (or the client went): the only honest end is to close
            _wake(cycle.wakeup)
            self._cycles.popleft()
            _wake(self._read_allowed)
            if not self._cycles:  # idle again: the keep-alive clock runs
                self._idle_deadline = trio.current_time() + self.server.config.keep_alive_timeout_s
                if self._read_scope is not None:
                    self._arm(self._read_scope)
            if not cycle.keep_alive or self.closed:
                return

    async def _answer_error(self, cycle: _Cycle) -> None:
        content_type, body = self.server.config.error_body(cycle.error_status, cycle.error_message,
                                                           "bad_http_request")
        await cycle.send({"type": "http.response.start", "status": cycle.error_status,
                          "headers": [(b"content-type", content_type), (b"connection", b"close")]})
        await cycle.send({"type": "http.response.body", "body": body})

    async def _linger(self) -> None:
        """Shut our side, then read and drop what the client still sends, bounded in time and bytes."""
        if self.tls:
            return  # TLS has no half-close: its close_notify ends both directions
        with trio.move_on_after(LINGER_S):
            try:
                await self.stream.send_eof()
                dropped = 0
                while dropped < LINGER_BYTES_MAX:
                    data = await self.stream.receive_some(65536)
                    if not data:
                        return
                    dropped += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError):
                return

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_loop)
                await self._answer_loop()
                nursery.cancel_scope.cancel()
            if not self.closed and (self._unread_input or any(not c.body_complete for c in self._cycles)
                                    or self._reader.in_message):
                await self._linger()
        finally:
            self.closed = True
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                try:
                    await self.stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return (value[0], value[1])
    return None


class H1Server:
    """Serves one ASGI app on one or more listeners until ``shutdown`` is set, then drains."""

    def __init__(self, app: App, config: H1Config) -> None:
        self.app = app
        self.config = config
        self.shutting_down = False
        self.in_flight = 0
        self.refused = 0  # requests answered 4xx by the server itself (malformed or too large)
        self.refused_connections = 0  # over max_connections
        self.tls_refused = 0  # failed or slow TLS handshakes (no certificate of the client CA, say)
        self._handshaking = 0
        content_type, body = config.error_body(503, "too many connections", "busy")
        self._busy_answer = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: %s\r\nconnection: close\r\n"
                             b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s" % (content_type, len(body), body))
        self.idle = trio.lowlevel.ParkingLot()
        self._connections: set[_Connection] = set()

    async def serve(self, host: str, port: int, shutdown: trio.Event, *,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen on host:port (0: any free port) and serve until ``shutdown`` is set and drained.

        ``task_status.started`` gets the bound URL.
        """
        listener = await open_listener(host, port, self.config.backlog, self.config.reuse_port)
        bound = listener.getsockname()
        scheme = "https" if self.config.ssl_context is not None else "http"
        url = f"{scheme}://[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{scheme}://{bound[0]}:{bound[1]}"
        listeners = [trio.SocketListener(listener)]
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(self._accept_loop, listeners[0], connections)
                task_status.started(url)
                await shutdown.wait()
                accepting.cancel_scope.cancel()
            for listener_obj in listeners:
                await listener_obj.aclose()
            self.shutting_down = True
            for connection in list(self._connections):
                _wake(connection._cycles_changed)  # idle connections close now
            with trio.move_on_after(self.config.graceful_timeout_s):
                while self.in_flight:
                    await self.idle.park()
            connections.cancel_scope.cancel()

    async def _accept_loop(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.error("accept failed (%s): pausing 100 ms", e)
                    await trio.sleep(0.1)
                    continue
                raise
            if len(self._connections) + self._handshaking >= self.config.max_connections:
                self.refused_connections += 1
                connections.start_soon(self._refuse_connection, stream, self.config.ssl_context is None)
                continue
            connections.start_soon(self._serve_connection, stream)

    async def _handshake(self, stream: trio.SocketStream) -> TlsSocket | None:
        """The TLS handshake, bounded in time; None (and the connection closed) when it fails."""
        with trio.move_on_after(self.config.tls_handshake_timeout_s):
            try:
                return await TlsSocket.accept(stream, self.config.ssl_context)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                self.tls_refused += 1
                log.debug("TLS handshake failed: %s", e)
                return None
        self.tls_refused += 1  # too slow: TlsSocket.accept closed the socket as it was cancelled
        return None

    async def _refuse_connection(self, stream: trio.SocketStream, plain: bool) -> None:
        """Over max_connections: a 503 without reading anything (over TLS: no handshake, just the
        close), then close (no linger: bounded work)."""
        try:
            if plain:
                send_now(stream, self._busy_answer)
        except OSError:
            pass
        await trio.aclose_forcefully(stream)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        if self.config.ssl_context is not None:
            self._handshaking += 1
            try:
                stream = await self._handshake(stream)
            finally:
                self._handshaking -= 1
            if stream is None:
                return
        connection = _Connection(self, stream)
        self._connections.add(connection)
        try:
            await connection.run()
        except Exception:  # a fault of ours with one connection ends that connection, never the server
            log.exception("connection from %s failed", connection._client)
        finally:
            self._connections.discard(connection)

    def metric_families(self) -> Iterator[Any]:
        yield counter("smg_http_refused", "Requests the HTTP server answered itself, before the API saw them "
                      "(400 malformed, 414 URL or 431 head over its limit)", [], [([], self.refused)])


async def open_listener(host: str, port: int, backlog: int, reuse_port: bool) -> trio.socket.SocketType:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        await sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock

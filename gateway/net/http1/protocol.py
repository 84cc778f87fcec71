"""The HTTP/1.1 connection's protocol, without I/O: request bytes in, events out; response heads framed.

The server (``server.py``) owns sockets, tasks, time and the ASGI app; this
module owns what the bytes mean and the rules they must follow. It runs in
memory in the tests, against h11 as an independent implementation
(tests/unit/test_h1_protocol.py).

Request side: ``RequestReader.feed(data)`` parses with httptools (llhttp) and
tells its ``RequestSink`` what happened, in order: ``request_head`` (method,
path, query, headers, version, keep-alive, expect 100-continue),
``request_body`` chunks, ``request_complete``; ``in_message`` says whether a
request has begun and not ended (the server times its arrival). It returns None,
``UPGRADE`` (a protocol switch asked for: the server answers as HTTP/1.1 and
closes), or a ``Refusal`` (status and reason; ``during_body`` when the head was
already handed on). The reader's state, and every move it may make:

    state  \\ input     begin   head_complete   message_complete   refusal / upgrade
    IDLE               HEAD    -               -                  ERROR / CLOSED
    HEAD               -       BODY            -                  ERROR / CLOSED
    BODY               -       -               IDLE               ERROR / CLOSED
    ERROR, CLOSED      (terminal: nothing more is read)

Any other move is a bug of ours (``LocalProtocolError``, as h11 names it).

Rules of the head (h11's, checked before a request is handed on):
  * request line + headers within ``header_bytes_max`` (431), target within ``url_bytes_max`` (414);
  * ``Transfer-Encoding`` exactly ``chunked`` (else 501), never with ``Content-Length`` (400:
    request smuggling); llhttp itself refuses lists and repeats (400);
  * HTTP/1.1 with exactly one ``Host`` (400);
  * a target that is a path, or an absolute http(s) URL served by its path (RFC 9112 3.2.2);
    ``*`` and authority form are refused (400).
A body that breaks (a bad chunk size) is a 400 too, with ``during_body`` set. Trailers of a chunked
body count against the head's limit and are dropped: the head the app saw cannot change after it.

Response side: ``ResponseState`` and its table say in which order an app's
messages may come (IDLE -start-> STARTED -body-> BODY ... -end-> DONE;
``response_move``); ``response_head`` decides the framing (a length, chunked, or
until close for HTTP/1.0) and whether the connection stays open; ``chunk`` and
``LAST_CHUNK`` frame a chunked body. A response sent before its request's body
ended closes the connection: the rest of that body cannot be told from a next
request.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol
from urllib.parse import unquote

import httptools


class ReadState(enum.Enum):
    IDLE = "idle"
    HEAD = "head"
    BODY = "body"
    ERROR = "error"
    CLOSED = "closed"


# (state, input) -> next state: the table above, and nothing else.
_MOVES: dict[tuple[ReadState, str], ReadState] = {
    (ReadState.IDLE, "begin"): ReadState.HEAD,
    (ReadState.HEAD, "head_complete"): ReadState.BODY,
    (ReadState.BODY, "message_complete"): ReadState.IDLE,
}


# The states bound once: the moves below run for every request.
_IDLE, _HEAD, _BODY, _ERROR, _CLOSED = ReadState.IDLE, ReadState.HEAD, ReadState.BODY, ReadState.ERROR, ReadState.CLOSED


class LocalProtocolError(Exception):
    """We broke the state table: a bug, never the peer's doing."""


@dataclasses.dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    during_body: bool = False  # the head was handed on already: its request must not be answered by the app


UPGRADE = "upgrade"

_TRANSFER_ENCODING, _CONTENT_LENGTH = 1, 2


class RequestSink(Protocol):
    def request_head(self, method: str, path: str, raw_path: bytes, query: bytes, headers: "list[tuple[bytes, bytes]]",
                     http_version: str, keep_alive: bool, expect_continue: bool) -> None: ...
    def request_body(self, data: bytes) -> None: ...
    def request_complete(self) -> None: ...


class _Stop(Exception):
    """Raised inside a callback to stop llhttp; the reason is on the reader."""


class RequestReader:
    """Request bytes to sink events, under the rules above. One per connection."""

    __slots__ = ("_sink", "_url_bytes_max", "_header_bytes_max", "_parser", "state", "in_message", "_url",
                 "_headers", "_header_bytes", "_hosts", "_framing", "_refusal")

    def __init__(self, sink: RequestSink, url_bytes_max: int, header_bytes_max: int) -> None:
        self._sink = sink
        self._url_bytes_max = url_bytes_max
        self._header_bytes_max = header_bytes_max
        self._parser = httptools.HttpRequestParser(self)
        self.state = _IDLE
        self.in_message = False  # HEAD or BODY: kept with the state, read on every socket read
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] | None = None  # None outside a head: trailers are dropped
        self._header_bytes = 0
        self._hosts = 0
        self._framing = 0
        self._refusal: Refusal | None = None

    def feed(self, data: bytes) -> "Refusal | str | None":
        """Parse ``data``; None, UPGRADE, or the Refusal that ends the connection's reading."""
        if self.state is _ERROR or self.state is _CLOSED:
            raise LocalProtocolError(f"fed in state {self.state.name}")
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._set(_CLOSED)
            return UPGRADE
        except httptools.HttpParserError as e:
            # What our callbacks refuse surfaces here too (httptools wraps what they raise).
            in_body = self.state is _BODY
            refusal = self._refusal or Refusal(400, f"malformed HTTP request{' body' if in_body else ''}: {e}",
                                               during_body=in_body)
            self._set(_ERROR)
            return refusal
        return None

    def _set(self, state: ReadState) -> None:
        self.state = state
        self.in_message = state is _HEAD or state is _BODY

    def _illegal(self, move: str) -> LocalProtocolError:
        return LocalProtocolError(f"{move} in state {self.state.name}")

    # The three moves of a request are written out in the callbacks below (an identity check and two
    # assignments each, no call: they run for every request); test_h1_protocol checks them against
    # _MOVES.

    def _refuse(self, status: int, message: str) -> None:
        self._refusal = Refusal(status, message)
        raise _Stop()

    # -- httptools callbacks (inside feed) -------------------------------------

    def on_message_begin(self) -> None:
        if self.state is not _IDLE:
            raise self._illegal("begin")
        self.state, self.in_message = _HEAD, True
        self._url = b""
        self._headers = []
        self._header_bytes = 0
        self._hosts = 0
        self._framing = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._url_bytes_max:
            self._refuse(414, "request URL too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self._header_bytes_max:
            self._refuse(431, "request head too large")
        headers = self._headers
        if headers is None:
            return  # a trailer of a chunked body: counted against the limit, never added to the request's head
        name = name.lower()
        if name == b"host":
            self._hosts += 1
        elif name == b"transfer-encoding":
            if value.strip().lower() != b"chunked":
                # Decided here, before llhttp judges the value (it would say 400): h11's 501 for codings we lack.
                self._refuse(501, "Transfer-Encoding other than chunked is not supported")
            self._framing |= _TRANSFER_ENCODING
        elif name == b"content-length":
            self._framing |= _CONTENT_LENGTH
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        http_version = parser.get_http_version()
        # The headers were counted as they came (on_header): no second pass over them.
        if self._framing == _TRANSFER_ENCODING | _CONTENT_LENGTH:
            self._refuse(400, "Transfer-Encoding and Content-Length together")
        if self._hosts != 1 and http_version == "1.1":
            self._refuse(400, "an HTTP/1.1 request needs exactly one Host header")
        url = self._url
        if not url.startswith(b"/"):
            scheme, sep, rest = url.partition(b"://")
            if not sep or scheme.lower() not in (b"http", b"https"):
                self._refuse(400, "the request target must be a path or an absolute http URL")
            url = b"/" + rest.partition(b"/")[2]
        raw_path, _, query = url.partition(b"?")
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path, encoding="utf-8", errors="replace")
        headers = self._headers
        self._headers = None
        expect_continue = False
        if http_version == "1.1":
            for name, value in headers:
                if name == b"expect" and value.lower() == b"100-continue":
                    expect_continue = True
        if self.state is not _HEAD:
            raise self._illegal("head_complete")
        self.state = _BODY
        self._sink.request_head(parser.get_method().decode("ascii"), path, raw_path, query, headers,
                                http_version, parser.should_keep_alive(), expect_continue)

    def on_body(self, body: bytes) -> None:
        self._sink.request_body(body)

    def on_message_complete(self) -> None:
        if self.state is not _BODY:
            raise self._illegal("message_complete")
        self.state, self.in_message = _IDLE, False
        self._sink.request_complete()


# -- response side ----------------------------------------------------------------


class ResponseState(enum.Enum):
    """One response, as the app sends it (ASGI's http.response.start and http.response.body)."""

    IDLE = "idle"  # nothing from the app yet
    STARTED = "started"  # the status and headers are known; the head waits for the first body bytes
    BODY = "body"  # the head is on the wire, more body to come
    DONE = "done"  # the whole response is out


# (state, input) -> next state. "body" is a body message with more to come, "end" the last one;
# "discard" drops a head that never went out, so the server can answer in the app's place (a 500 when
# the app failed after http.response.start and before any body).
RESPONSE_MOVES: dict[tuple[ResponseState, str], ResponseState] = {
    (ResponseState.IDLE, "start"): ResponseState.STARTED,
    (ResponseState.STARTED, "body"): ResponseState.BODY,
    (ResponseState.STARTED, "end"): ResponseState.DONE,
    (ResponseState.BODY, "body"): ResponseState.BODY,
    (ResponseState.BODY, "end"): ResponseState.DONE,
    (ResponseState.STARTED, "discard"): ResponseState.IDLE,
}


def response_move(state: ResponseState, move: str) -> ResponseState:
    """The next state; LocalProtocolError for a move the table does not have (the app broke ASGI's order,
    or we did)."""
    try:
        return RESPONSE_MOVES[state, move]
    except KeyError:
        raise LocalProtocolError(f"response {move} in state {state.name}") from None

_REASONS = {100: b"Continue", 200: b"OK", 201: b"Created", 202: b"Accepted", 204: b"No Content",
            400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
            405: b"Method Not Allowed", 408: b"Request Timeout", 409: b"Conflict", 413: b"Payload Too Large",
            414: b"URI Too Long", 422: b"Unprocessable Entity", 429: b"Too Many Requests",
            431: b"Request Header Fields Too Large", 499: b"Client Closed Request",
            500: b"Internal Server Error", 501: b"Not Implemented", 502: b"Bad Gateway",
            503: b"Service Unavailable", 504: b"Gateway Timeout"}
_STATUS_LINES: dict[int, bytes] = {}
LAST_CHUNK = b"0\r\n\r\n"


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Status"))
        if 100 <= status < 600:
            _STATUS_LINES[status] = line
    return line


def response_head(status: int, headers: "list[tuple[bytes, bytes]]", body: bytes, more_body: bool,
                  http_version: str, keep_alive: bool, request_complete: bool, date_header: bytes
                  ) -> tuple[bytes, bool, bool]:
    """(head bytes, chunked, keep_alive) of a response whose first body bytes are ``body``.

    Framing is ours: the app's Transfer-Encoding and Connection headers are replaced. Without a
    Content-Length a complete body gets one, an unfinished one is chunked (HTTP/1.1) or ends with the
    connection (HTTP/1.0). The connection closes after it when the client asked, when the app said
    ``connection: close``, when HTTP/1.0 has no length, or when the request's body did not end first.
    """
    keep_alive = keep_alive and request_complete
    has_length = chunked = False
    parts = [status_line(status)]
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-length":
            has_length = True
        elif lname == b"connection":
            if value.lower() == b"close":
                keep_alive = False
            continue
        elif lname == b"transfer-encoding":
            continue
        parts.append(b"%s: %s\r\n" % (name, value))
    if not has_length:
        if not more_body:
            parts.append(b"content-length: %d\r\n" % len(body))
        elif http_version == "1.1":
            chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
        else:
            keep_alive = False
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(date_header)
    parts.append(b"\r\n")
    return b"".join(parts), chunked, keep_alive


# One chunk of a chunked body: CHUNK % (len(data), data). A format, not a function: the server frames
# every streamed token with it. An empty chunk would end the body: callers skip empty data.
CHUNK = b"%x\r\n%s\r\n"


def chunk(data: bytes) -> bytes:
    return CHUNK % (len(data), data)

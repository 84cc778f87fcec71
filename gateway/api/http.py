"""A minimal ASGI layer: the request we hand to handlers, and the ways to answer.

No framework: the request path is short and every step is ours to measure.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any

import orjson
import trio

from ..auth import ANONYMOUS, Principal
from .errors import BadRequest, PayloadTooLarge
from ..net.http1 import DISCONNECT_EXTENSION

JSON_HEADERS = [(b"content-type", b"application/json")]
PIECES_WRITE_BYTES = 1024 * 1024  # send_pieces joins this much into one write
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               # Tell nginx not to buffer the stream (it honours this header).
               (b"x-accel-buffering", b"no")]


class Request:
    # Set on the requests they concern (the class holds the defaults: a plain request assigns none of them).
    # The route's target that answered (a routed model, gateway/api/routed.py): the access log names it.
    target: str | None = None
    # What the request generated and for which model (its public name, and the route's when one answered it): its
    # cost is counted from these when the answer ends (gateway/spend).
    usage: Any = None  # a UsageTally
    model: str | None = None
    route: str | None = None
    # Set when the node adds x-smg-cost to whole answers (--cost-header): the request's cost in dollars.
    cost_of: "Callable[[Request], float] | None" = None
    # The response cache (gateway/api/cached.py): x-smg-cache's value, and the answer's bytes and content type
    # while they are recorded to be kept.
    cache_status: bytes | None = None
    recording: "list[bytes] | None" = None
    recording_bytes_left = 0  # past it the recording stops (recording_overflowed): an answer too large to keep
    recording_overflowed = False
    recorded_type: bytes | None = None
    _body: bytes | None = None  # read once, kept for a second reader

    def __init__(self, scope: dict[str, Any], receive: Any, send: Any, request_id: str, body_bytes_max: int,
                 background: trio.Nursery) -> None:
        self.scope = scope
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[bytes, bytes] = dict(scope["headers"])
        self.receive = receive
        self._send = send
        self.request_id = request_id
        self.body_bytes_max = body_bytes_max
        self.response_started = False
        self.status = 0
        self.path_params: dict[str, str] = {}
        self.principal: Principal = ANONYMOUS  # set by the app once the route's access is checked
        self.disconnected = False
        self._background = background
        # Added to every response head (the rate-limit headers, decided before the answer is).
        self.extra_headers: list[tuple[bytes, bytes]] = []
        # The native server's request cycle (gateway/http1): None under another ASGI server.
        self._native = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)

    @property
    def owner(self) -> str:
        """Whose stored data and shares this request's are: its tenant, else its key, else "anonymous"."""
        principal = self.principal
        return f"tenant:{principal.tenant}" if principal.tenant else principal.key_id

    @property
    def tenant_key(self) -> str | None:
        """The share of the node this request counts against (admission): its owner when it was authenticated;
        None on the open data plane, where nobody can be told apart."""
        return self.owner if self.principal.authenticated else None

    def query(self) -> dict[str, str]:
        """The query string's parameters (the last of repeated ones), decoded."""
        raw = self.scope.get("query_string", b"")
        return dict(urllib.parse.parse_qsl(raw.decode("latin-1"), keep_blank_values=True)) if raw else {}

    def header(self, name: str) -> str | None:
        value = self.headers.get(name.lower().encode("latin-1"))
        return value.decode("latin-1") if value is not None else None

    async def body(self) -> bytes:
        if self._body is not None:
            return self._body
        self._body = body = await self._read_body()
        return body

    async def _read_body(self) -> bytes:
        declared = self.headers.get(b"content-length")
        if declared is not None:
            try:
                if int(declared) > self.body_bytes_max:
                    raise PayloadTooLarge(f"request body is larger than {self.body_bytes_max} bytes",
                                          code="body_too_large")
            except ValueError:
                raise BadRequest("invalid Content-Length", code="invalid_header") from None
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.body_bytes_max:
                raise PayloadTooLarge(f"request body is larger than {self.body_bytes_max} bytes", code="body_too_large")
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts) if len(parts) != 1 else parts[0]

    def _base_headers(self, headers: "list[tuple[bytes, bytes]]") -> list[tuple[bytes, bytes]]:
        if self.cache_status is not None:
            headers = [*headers, (b"x-smg-cache", self.cache_status)]
        return [*headers, *self.extra_headers, (b"x-request-id", self.request_id.encode("latin-1"))]

    def _record(self, headers: "list[tuple[bytes, bytes]]", body: bytes) -> None:
        """The answer's head and first bytes, while the response cache records it."""
        assert self.recording is not None
        self.recorded_type = next((v for k, v in headers if k == b"content-type"), None)
        if body:
            self._keep(body)

    def _keep(self, data: bytes) -> None:
        left = self.recording_bytes_left - len(data)
        if left < 0:  # never held whole: a long stream would cost its size again in memory
            self.recording = None
            self.recording_overflowed = True
            return
        self.recording_bytes_left = left
        self.recording.append(data)  # type: ignore[union-attr]

    def _whole_headers(self, headers: "list[tuple[bytes, bytes]]") -> list[tuple[bytes, bytes]]:
        """A whole answer's head: its usage is final, so its cost may be said."""
        if self.cost_of is not None and self.usage is not None and self.usage.total() > 0:
            headers = [*headers, (b"x-smg-cost", f"{self.cost_of(self):.8f}".encode())]
        return self._base_headers(headers)

    async def send_bytes(self, status: int, body: bytes, headers: "list[tuple[bytes, bytes]]") -> None:
        self.response_started = True
        self.status = status
        if self.recording is not None:
            self._record(headers, body)
        await self._send({"type": "http.response.start", "status": status,
                          "headers": self._whole_headers([*headers, (b"content-length", str(len(body)).encode())])})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def send_pieces(self, status: int, pieces: "list[bytes]", size: int,
                          headers: "list[tuple[bytes, bytes]]" = ()) -> None:
        """A body of ``size`` bytes sent from ``pieces`` in order, a write per ~1 MiB: never joined whole (a large
        answer held once, not twice)."""
        self.response_started = True
        self.status = status
        if self.recording is not None:
            if size > self.recording_bytes_left:  # too large to keep: never joined whole for it
                self.recording, self.recording_overflowed = None, True
            else:
                self._record(headers, b"".join(pieces))
        await self._send({"type": "http.response.start", "status": status,
                          "headers": self._whole_headers([*headers, (b"content-length", b"%d" % size)])})
        batch: list[bytes] = []
        batched = 0
        for piece in pieces:
            batch.append(piece)
            batched += len(piece)
            if batched >= PIECES_WRITE_BYTES:
                await self._send({"type": "http.response.body", "body": b"".join(batch), "more_body": True})
                batch, batched = [], 0
        await self._send({"type": "http.response.body", "body": b"".join(batch), "more_body": False})

    async def send_json(self, status: int, value: Any, headers: "list[tuple[bytes, bytes]]" = ()) -> None:
        await self.send_bytes(status, orjson.dumps(value), [*JSON_HEADERS, *headers])

    async def start_stream(self, status: int, headers: "list[tuple[bytes, bytes]]") -> None:
        self.response_started = True
        self.status = status
        if self.recording is not None:
            self._record(headers, b"")
        await self._send({"type": "http.response.start", "status": status, "headers": self._base_headers(headers)})

    async def send_chunk(self, data: bytes) -> None:
        if self.recording is not None:
            self._keep(data)
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    def can_send_chunk_now(self) -> bool:
        """``send_chunk_now`` may be called: the native server, a started stream, no write pending."""
        native = self._native
        return native is not None and native.can_send_body_now()

    def can_start_stream_now(self) -> bool:
        """``start_stream_now`` may be called: the native server, nothing of the response sent, no write pending."""
        native = self._native
        return native is not None and native.can_start_body_now()

    def start_stream_now(self, status: int, headers: "list[tuple[bytes, bytes]]", data: bytes) -> bool:
        """``start_stream`` and a first ``send_chunk`` without awaiting, from any task; False when ``flush()`` must
        follow."""
        self.response_started = True
        self.status = status
        if self.recording is not None:
            self._record(headers, data)
        return self._native.start_body_now(status, self._base_headers(headers), data)

    def send_chunk_now(self, data: bytes) -> bool:
        """``send_chunk`` without awaiting, from any task; False when ``flush()`` must follow."""
        if self.recording is not None:
            self._keep(data)
        return self._native.send_body_now(data)

    async def flush(self) -> None:
        """Write what ``send_chunk_now`` left, once the client's socket takes it."""
        await self._native.flush()

    async def end_stream(self, data: bytes = b"") -> None:
        if self.recording is not None and data:
            self._keep(data)
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    def cancel_on_disconnect(self) -> "_CancelOnDisconnect":
        """``async with request.cancel_on_disconnect() as scope:`` runs the block; if the client
        disconnects meanwhile, the scope is cancelled.

        Used around generations, so a client that goes away aborts its work on
        the engine. The native server cancels the scope itself when the
        connection is lost (DISCONNECT_EXTENSION). Under other ASGI servers a
        watcher task waits for ``http.disconnect``; it runs in the node's
        background nursery rather than a nursery of our own, so exceptions of
        the block propagate as they are (not wrapped in an exception group).
        """
        return _CancelOnDisconnect(self)

    def disconnect_watch(self) -> "DisconnectWatch":
        """For a call that has a cancel scope of its own (a provider call's timeout): that scope, cancelled when
        the client goes away too, instead of a second around it (``cancel_on_disconnect``)."""
        return DisconnectWatch(self)

    async def _watch_disconnect(self, scope: trio.CancelScope, watcher: trio.CancelScope) -> None:
        with watcher:
            while True:
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    self.disconnected = True
                    scope.cancel()
                    return


class _CancelOnDisconnect:
    """The context manager of ``Request.cancel_on_disconnect``.

    A class rather than an ``asynccontextmanager`` generator: it is on every generation's
    path, where a generator-based manager costs a generator, its wrapper and trio's
    async-generator hooks per use. The cancel scope is entered and exited by hand, in the
    request's task, around the caller's block, as a ``with`` would.
    """

    __slots__ = ("_request", "_native", "_scope", "_watcher")

    def __init__(self, request: Request) -> None:
        self._request = request

    async def __aenter__(self) -> trio.CancelScope:
        request = self._request
        self._native = native = request._native
        scope = self._scope = trio.CancelScope()
        if native is not None:
            native.watch_disconnect(scope)
        else:
            self._watcher = trio.CancelScope()
            request._background.start_soon(request._watch_disconnect, scope, self._watcher)
        scope.__enter__()  # last: nothing above can leave it open by raising
        return scope

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> bool:
        native = self._native
        if native is not None:
            native.unwatch_disconnect(self._scope)
            if native.client_gone:
                self._request.disconnected = True
        else:
            self._watcher.cancel()
        return self._scope.__exit__(exc_type, exc, traceback)


class DisconnectWatch:
    """``watch(scope)`` makes the client's going away cancel ``scope`` (a scope its caller enters, with its own
    deadline), ``unwatch(scope)`` after it; ``gone`` then says whether the client went, which is the caller's to
    tell apart from its own deadline. One scope where ``cancel_on_disconnect`` around a call with a timeout would
    add a second (entering and leaving one costs trio ~5 us). Unlike ``cancel_on_disconnect``, what follows the
    call (the answer's writes) is not cancelled: a write to a client that went away returns at once."""

    __slots__ = ("_request", "_native", "_watcher")

    def __init__(self, request: Request) -> None:
        self._request = request
        self._native = request._native
        self._watcher: trio.CancelScope | None = None

    def watch(self, scope: trio.CancelScope) -> None:
        native = self._native
        if native is not None:
            native.watch_disconnect(scope)
        else:
            self._watcher = watcher = trio.CancelScope()
            self._request._background.start_soon(self._request._watch_disconnect, scope, watcher)

    def unwatch(self, scope: trio.CancelScope) -> None:
        native = self._native
        if native is not None:
            native.unwatch_disconnect(scope)
            if native.client_gone:
                self._request.disconnected = True
        elif self._watcher is not None:
            self._watcher.cancel()

    @property
    def gone(self) -> bool:
        return self._request.disconnected


class ClientGone(Exception):
    """The client disconnected before the body arrived: nothing to answer."""


def sse_event(value: Any) -> bytes:
    return b"data: " + orjson.dumps(value) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"

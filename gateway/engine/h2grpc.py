"""gRPC calls to engines straight from trio: HTTP/2 with ``h2``, no grpcio, no thread.

Why: through grpcio's asyncio API on its own thread (``bridge.py``) a call
cost ~850-1,250 µs of CPU and a 16-token stream ~2,900-4,800 µs on this
machine (``python tests/bench/bridge_bench.py``), more than smg's whole
request: every call crosses two threads (self-pipe writes, trio wake-ups,
GIL hand-offs) and runs grpcio's Python layers. Here a call is a few HTTP/2
frames on a connection the node's own event loop reads; the same benchmark
gives the figures in BENCHMARKS.md.

What it implements of gRPC over HTTP/2 (the client side of the spec in
grpc/doc/PROTOCOL-HTTP2.md): unary-request calls answered by one or many
messages; the 5-byte message framing; ``grpc-timeout`` and a local deadline;
``grpc-status``/``grpc-message`` from trailers or a trailers-only answer; the
HTTP-status mapping for non-gRPC answers; RST_STREAM(CANCEL) when the caller
leaves; GOAWAY (calls opened after the server's last stream fail as
UNAVAILABLE and new calls use a new connection); flow control in both
directions, with the window of a stream re-opened only as its reader
consumes (so a slow consumer pushes back on the engine, like the bridge's
window). No compression (we never ask for it; a compressed message is an
INTERNAL error), no TLS (engines are reached in the clear, as before).

One connection per engine target, opened on first use and again after it
fails; calls multiplex on it up to the server's MAX_CONCURRENT_STREAMS.
A connection that answers nothing while a call times out is dropped (a
half-open TCP connection would otherwise hold every later call).

Interface: the same as ``GrpcBridge`` (``unary``, ``open_stream`` giving
lists of messages, ``close_channel``, ``aclose``), so ``grpc_engine.py`` does
not know which one it talks through.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from .errors import EngineCallError

# Same bound as the bridge: any real context fits, an engine cannot make us hold more.
GRPC_MESSAGE_BYTES_MAX = 64 * 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
# Receive windows: large, so a stream of tokens rarely waits for a WINDOW_UPDATE.
STREAM_WINDOW_BYTES = 4 * 1024 * 1024
CONNECTION_WINDOW_BYTES = 32 * 1024 * 1024
_READ_BYTES = 256 * 1024

_STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                 "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
# gRPC's mapping of HTTP statuses of answers that are not gRPC (a proxy's error page, say).
_HTTP_STATUS_CODES = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED",
                      429: "UNAVAILABLE", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE"}
_RESET_CODES = {h2.errors.ErrorCodes.CANCEL: "CANCELLED", h2.errors.ErrorCodes.REFUSED_STREAM: "UNAVAILABLE",
                h2.errors.ErrorCodes.ENHANCE_YOUR_CALM: "RESOURCE_EXHAUSTED",
                h2.errors.ErrorCodes.INADEQUATE_SECURITY: "PERMISSION_DENIED"}
_FRAME = struct.Struct(">BI")


def _grpc_timeout(timeout_s: float) -> bytes:
    # At most 8 digits (the spec): milliseconds up to ~27 hours, then seconds.
    ms = max(1, int(timeout_s * 1000))
    return b"%dm" % ms if ms < 100_000_000 else b"%dS" % min(int(timeout_s), 99_999_999)


class _Call:
    """One call's received state, written by the connection's reader, read by the caller."""

    __slots__ = ("stream_id", "buffer", "messages", "message_bytes", "status", "headers", "error", "finished",
                 "changed", "unacked_bytes")

    def __init__(self) -> None:
        self.stream_id = 0
        self.buffer = bytearray()  # bytes of a message not complete yet
        self.messages: list[bytes] = []
        self.message_bytes = 0
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.error: EngineCallError | None = None
        self.finished = False
        self.changed = trio.Event()
        self.unacked_bytes = 0  # received, flow-controlled, not yet given back to the engine

    def wake(self) -> None:
        self.changed.set()

    def feed(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while len(buffer) >= 5:
            compressed, length = _FRAME.unpack_from(buffer)
            if length > GRPC_MESSAGE_BYTES_MAX:
                self.fail(EngineCallError("RESOURCE_EXHAUSTED", f"a message of {length} bytes exceeds the limit"))
                return
            if len(buffer) < 5 + length:
                break
            if compressed:
                self.fail(EngineCallError("INTERNAL", "the engine sent a compressed message (never asked for)"))
                return
            self.messages.append(bytes(buffer[5:5 + length]))
            del buffer[:5 + length]

    def fail(self, error: EngineCallError) -> None:
        if not self.finished:
            self.error = error
            self.finished = True
        self.wake()

    def end(self, trailers: dict[bytes, bytes]) -> None:
        """The stream ended: its status from the trailers (or a trailers-only answer's headers)."""
        if self.finished:
            return
        fields = {**self.headers, **trailers}
        if self.status != 200:
            self.fail(EngineCallError(_HTTP_STATUS_CODES.get(self.status, "UNKNOWN"),
                                      f"the engine answered HTTP {self.status}, not gRPC"))
            return
        code = fields.get(b"grpc-status")
        if code is None:
            self.fail(EngineCallError("INTERNAL", "the engine ended the call without a grpc-status"))
            return
        try:
            name = _STATUS_NAMES[int(code)]
        except (ValueError, IndexError):
            name = "UNKNOWN"
        if name != "OK":
            message = unquote(fields.get(b"grpc-message", b"").decode("utf-8", "replace"))
            self.fail(EngineCallError(name, message))
            return
        if self.buffer:
            self.fail(EngineCallError("INTERNAL", "the engine ended the call inside a message"))
            return
        self.finished = True
        self.wake()


class _Connection:
    """One HTTP/2 connection to an engine and the calls open on it."""

    def __init__(self, target: str, stream: trio.SocketStream) -> None:
        self.target = target
        self.stream = stream
        config = h2.config.H2Configuration(client_side=True, header_encoding=None, validate_outbound_headers=False,
                                           normalize_outbound_headers=False)
        self.h2 = h2.connection.H2Connection(config)
        self.calls: dict[int, _Call] = {}
        self.alive = True
        self.accepting = True  # False after GOAWAY: running calls finish, new ones go elsewhere
        self.received_bytes = 0
        self._send_lock = trio.StrictFIFOLock()
        self._window_opened = trio.Event()
        self._stream_closed = trio.Event()

    async def start(self) -> None:
        self.h2.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW_BYTES,
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
        })
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(CONNECTION_WINDOW_BYTES - 65_535)
        await self.flush()

    async def flush(self) -> None:
        async with self._send_lock:
            data = self.h2.data_to_send()
            if data:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                    self.lost(f"write failed: {e}")

    # -- reading (one task per connection) ------------------------------------

    async def read_loop(self) -> None:
        reason = "the engine closed the connection"
        try:
            while self.alive:
                data = await self.stream.receive_some(_READ_BYTES)
                if not data:
                    break
                self.received_bytes += len(data)
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError as e:
                    reason = f"HTTP/2 protocol error: {e}"
                    break
                for event in events:
                    self._handle(event)
                await self.flush()  # settings and ping acknowledgements, window updates
                if not self.accepting and not self.calls:
                    reason = "drained after GOAWAY"
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            reason = f"read failed: {e}"
        self.lost(reason)
        with trio.CancelScope(shield=True):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await self.stream.aclose()

    def _handle(self, event: Any) -> None:
        if isinstance(event, h2.events.DataReceived):
            call = self.calls.get(event.stream_id)
            if call is None:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                return
            call.unacked_bytes += event.flow_controlled_length
            call.feed(event.data)
            call.wake()
        elif isinstance(event, h2.events.ResponseReceived):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.headers = dict(event.headers)
                try:
                    call.status = int(call.headers.get(b":status", b"0"))
                except ValueError:
                    call.status = 0
        elif isinstance(event, h2.events.TrailersReceived):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call.end(dict(event.headers))
        elif isinstance(event, h2.events.StreamEnded):
            call = self.calls.pop(event.stream_id, None)
            if call is not None:
                call.end({})
            self._stream_closed.set()
        elif isinstance(event, h2.events.StreamReset):
            call = self.calls.pop(event.stream_id, None)
            if call is not None:
                call.fail(EngineCallError(_RESET_CODES.get(event.error_code, "INTERNAL"),
                                          f"the engine reset the call ({event.error_code!s})"))
            self._stream_closed.set()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._window_opened.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.accepting = False
            last = event.last_stream_id if event.last_stream_id is not None else 0
            for stream_id in [s for s in self.calls if s > last]:
                self.calls.pop(stream_id).fail(EngineCallError("UNAVAILABLE", "the engine is going away (GOAWAY)"))
            if event.error_code != h2.errors.ErrorCodes.NO_ERROR:
                self.lost(f"GOAWAY {event.error_code!s}")

    def lost(self, reason: str) -> None:
        """The connection is unusable: every open call fails as UNAVAILABLE (retryable)."""
        if not self.alive:
            return
        self.alive = False
        self.accepting = False
        for call in self.calls.values():
            call.fail(EngineCallError("UNAVAILABLE", f"connection to {self.target} lost: {reason}"))
        self.calls.clear()
        self._window_opened.set()
        self._stream_closed.set()

    # -- calls -------------------------------------------------------------------

    async def start_call(self, path: str, payload: bytes, timeout_s: float | None) -> _Call:
        call = _Call()
        headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode("ascii")),
                   (b":authority", self.target.encode("ascii")), (b"content-type", b"application/grpc"),
                   (b"te", b"trailers"), (b"user-agent", b"smg-node")]
        if timeout_s is not None:
            headers.append((b"grpc-timeout", _grpc_timeout(timeout_s)))
        body = _FRAME.pack(0, len(payload)) + payload
        while True:
            if not self.alive:
                raise EngineCallError("UNAVAILABLE", f"connection to {self.target} lost")
            async with self._send_lock:
                # At most the engine's MAX_CONCURRENT_STREAMS at once: later calls wait for a stream to end.
                if self.h2.open_outbound_streams < self.h2.remote_settings.max_concurrent_streams:
                    stream_id = self.h2.get_next_available_stream_id()
                    call.stream_id = stream_id
                    self.calls[stream_id] = call
                    self.h2.send_headers(stream_id, headers)
                    break
                self._stream_closed = trio.Event()
            await self._stream_closed.wait()
        await self._send_body(stream_id, body)
        return call

    async def _send_body(self, stream_id: int, body: bytes) -> None:
        """The request message, as fast as the engine's windows allow (the lock is released while waiting)."""
        view = memoryview(body)
        while True:
            async with self._send_lock:
                if not self.alive:
                    raise EngineCallError("UNAVAILABLE", f"connection to {self.target} lost")
                try:
                    while view:
                        window = self.h2.local_flow_control_window(stream_id)
                        if window <= 0:
                            break
                        size = min(window, self.h2.max_outbound_frame_size, len(view))
                        chunk, view = view[:size], view[size:]
                        self.h2.send_data(stream_id, chunk.tobytes(), end_stream=not view)
                except h2.exceptions.StreamClosedError:
                    raise EngineCallError("CANCELLED", "the engine closed the call before its request") from None
                if view:
                    self._window_opened = trio.Event()  # set by the reader on the next WINDOW_UPDATE
                try:
                    await self.stream.send_all(self.h2.data_to_send())
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                    self.lost(f"write failed: {e}")
                    raise EngineCallError("UNAVAILABLE", f"connection to {self.target} lost: {e}") from None
                if not view:
                    return
            await self._window_opened.wait()

    async def consumed(self, call: _Call) -> None:
        """Give the engine back the window of what the caller took (back-pressure follows the reader)."""
        if call.unacked_bytes and self.alive and call.stream_id in self.calls:
            with contextlib.suppress(h2.exceptions.StreamClosedError, KeyError):
                self.h2.acknowledge_received_data(call.unacked_bytes, call.stream_id)
            call.unacked_bytes = 0
            await self.flush()

    async def cancel(self, call: _Call) -> None:
        if call.stream_id in self.calls and self.alive:
            del self.calls[call.stream_id]
            with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                self.h2.reset_stream(call.stream_id, h2.errors.ErrorCodes.CANCEL)
            await self.flush()


class H2GrpcClient:
    """gRPC to every engine target, from trio. Call ``aclose`` when done."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._connections: dict[str, _Connection] = {}
        self._connecting: dict[str, trio.Lock] = {}

    async def _connection(self, target: str) -> _Connection:
        connection = self._connections.get(target)
        if connection is not None and connection.accepting:
            return connection
        async with self._connecting.setdefault(target, trio.Lock()):
            connection = self._connections.get(target)
            if connection is not None and connection.accepting:
                return connection
            host, _, port = target.rpartition(":")
            try:
                with trio.fail_after(CONNECT_TIMEOUT_S):
                    stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
            except (OSError, trio.TooSlowError) as e:
                raise EngineCallError("UNAVAILABLE", f"cannot connect to {target}: {e}") from None
            connection = _Connection(target, stream)
            await connection.start()
            self._nursery.start_soon(connection.read_loop)
            self._connections[target] = connection
            return connection

    @contextlib.asynccontextmanager
    async def _call(self, target: str, method: str, request: Any,
                    timeout_s: float | None) -> AsyncIterator[tuple[_Connection, _Call]]:
        deadline = trio.current_time() + timeout_s if timeout_s is not None else float("inf")
        connection = await self._connection(target)
        received_at_start = connection.received_bytes
        call: _Call | None = None
        try:
            with trio.CancelScope(deadline=deadline) as scope:
                call = await connection.start_call(method, request.SerializeToString(), timeout_s)
                yield connection, call
            if scope.cancelled_caught:
                if connection.received_bytes == received_at_start:
                    connection.lost("no answer at all before a call's deadline")  # half-open: start over
                raise EngineCallError("DEADLINE_EXCEEDED", f"no answer from {target} within {timeout_s}s")
        finally:
            if call is not None and not call.finished:
                with trio.CancelScope(shield=True):
                    await connection.cancel(call)

    async def unary(self, target: str, method: str, request: Any, response_type: Any,
                    timeout_s: float | None) -> Any:
        """One request, one response. Raises EngineCallError."""
        async with self._call(target, method, request, timeout_s) as (connection, call):
            while not call.finished:
                await call.changed.wait()
                call.changed = trio.Event()
        if call.error is not None:
            raise call.error
        if len(call.messages) != 1:
            raise EngineCallError("INTERNAL", f"a unary call answered {len(call.messages)} messages")
        return _parse(response_type, call.messages[0])

    @contextlib.asynccontextmanager
    async def open_stream(self, target: str, method: str, request: Any, response_type: Any,
                          timeout_s: float | None, window_messages: int = 0) -> AsyncIterator[AsyncIterator[list]]:
        """A server stream read as ``async for batch in stream`` (lists of messages that arrived together).

        Leaving the block before the stream ends cancels the call.
        """
        async with self._call(target, method, request, timeout_s) as (connection, call):
            yield _batches(connection, call, response_type)

    async def close_channel(self, target: str) -> None:
        connection = self._connections.pop(target, None)
        if connection is not None:
            connection.lost("closed")
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await connection.stream.aclose()

    async def aclose(self) -> None:
        for target in list(self._connections):
            await self.close_channel(target)


def _parse(response_type: Any, data: bytes) -> Any:
    try:
        return response_type.FromString(data)
    except Exception as e:  # protobuf's DecodeError, or anything a broken message raises
        raise EngineCallError("INTERNAL", f"cannot parse the engine's message: {e}") from None


async def _batches(connection: _Connection, call: _Call, response_type: Any) -> AsyncIterator[list]:
    while True:
        if call.messages:
            raw, call.messages = call.messages, []
            await connection.consumed(call)
            yield [_parse(response_type, data) for data in raw]
            continue
        if call.finished:
            if call.error is not None:
                raise call.error
            return
        await call.changed.wait()
        call.changed = trio.Event()

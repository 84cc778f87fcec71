"""gRPC calls to engines straight from trio: our own HTTP/2 client framing, no grpcio, no thread.

Why: through grpcio's asyncio API on its own thread (``bridge.py``) a call
cost ~850-1,250 µs of CPU and a 16-token stream ~2,900-4,800 µs on this
machine (``python tests/bench/bridge_bench.py``), more than smg's whole
request: every call crosses two threads (self-pipe writes, trio wake-ups,
GIL hand-offs) and runs grpcio's Python layers. Here a call is a few HTTP/2
frames on a connection the node's own event loop reads. The frames are ours
(``http2_frames.py`` says why not the ``h2`` library); HPACK is ``hpack``'s.

What it implements of gRPC over HTTP/2 (the client side of the spec in
grpc/doc/PROTOCOL-HTTP2.md, on RFC 9113): unary-request calls answered by one
or many messages; the 5-byte message framing; ``grpc-timeout`` and a local
deadline; ``grpc-status``/``grpc-message`` from trailers or a trailers-only
answer; the HTTP-status mapping for non-gRPC answers; RST_STREAM(CANCEL) when
the caller leaves, unless it has read the call's last message (``open_stream``'s
``last_message``): then the engine ends the stream itself, as it was about to
(a reset there would make a grpcio server run its cancellation path, SGLang's an
abort of a request already done), and one it does not end within
``H2Config.left_call_grace_s`` is reset then; GOAWAY (calls opened after the server's last stream fail as
UNAVAILABLE and new calls use a new connection); SETTINGS, PING, CONTINUATION,
padding; flow control in both directions: our sends wait for the engine's
windows, and a stream's receive window is re-opened only as its reader
consumes (so a slow consumer pushes back on the engine). The connection's
receive window is given back as calls consume or end. No compression (we
never ask for it; a compressed message is an INTERNAL error). TLS for
``grpcs://`` targets (ALPN h2). Keepalive: a connection with open calls
that received nothing for an interval is sent a PING and dropped when
nothing answers it (a half-open connection would otherwise hold a KV-event
stream forever when health checks are off). Closing a connection sends
GOAWAY first. The tunables are one frozen ``H2Config``
(``GatewayConfig.engine_h2``).

A streaming caller may also ``listen``: the connection's reading task then
hands messages that arrive while the caller awaits them to a listener, which
takes them synchronously (``take_now``) instead of waking the caller's task:
a streamed token costs no trip through the scheduler. The caller's own reads
keep the call's order and its end; the listener only ever gets messages the
caller was waiting for.

One connection per engine target, opened on first use and again after it
fails; calls multiplex on it up to the server's MAX_CONCURRENT_STREAMS.
A connection that answers nothing while a call times out is dropped (a
half-open TCP connection would otherwise hold every later call). A peer that
breaks the protocol gets GOAWAY with the error and its calls fail as
UNAVAILABLE (retryable).

Interface: the same as ``GrpcBridge`` (``unary``, ``open_stream`` giving
lists of messages, ``close_channel``, ``aclose``), so ``grpc_engine.py`` does
not know which one it talks through.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import ssl
import struct
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import trio

from ..fast_receive import receive_some
from ..fast_send import send_now
from . import http2_frames as h2f
from .engine_tls import EngineTlsConfig, client_context, split_target
from .errors import EngineCallError

# Same bound as the bridge: any real context fits, an engine cannot make us hold more.
GRPC_MESSAGE_BYTES_MAX = 64 * 1024 * 1024
_READ_BYTES = 256 * 1024


@dataclasses.dataclass(frozen=True)
class H2Config:
    """The HTTP/2 client's tunables (``GatewayConfig.engine_h2``)."""

    connect_timeout_s: float = 10.0
    # A write the engine does not take within this ends the connection (half a frame cannot be left).
    write_timeout_s: float = 10.0
    # Receive windows: large, so a stream of tokens rarely waits for a WINDOW_UPDATE. Credit goes
    # back once a quarter of a window is consumed: short calls end before that and cost no update.
    stream_window_bytes: int = 4 * 1024 * 1024
    connection_window_bytes: int = 32 * 1024 * 1024
    # Frames up to 1 MiB from the engine (fewer frames for large answers; RFC 9113 allows 16 MiB).
    receive_frame_bytes: int = 1024 * 1024
    header_list_bytes_max: int = 64 * 1024
    # A header block (HEADERS + CONTINUATIONs) compressed beyond this is refused before decoding.
    header_block_bytes_max: int = 256 * 1024
    # A call left after its last message whose stream the engine has not ended by then is reset.
    left_call_grace_s: float = 5.0
    # A connection with open calls that received nothing for this long is sent a PING; one that then
    # receives nothing for keepalive_timeout_s more is dropped and its calls fail as UNAVAILABLE
    # (retryable). 30 s: a KV-event stream of an idle engine may be silent that long, and a PING costs
    # 17 bytes each way. gRPC's own timeout default is 20 s (GRPC_ARG_KEEPALIVE_TIMEOUT_MS). 0: off.
    keepalive_interval_s: float = 30.0
    keepalive_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if not 2**14 <= self.receive_frame_bytes <= 2**24 - 1:
            raise ValueError("receive_frame_bytes must be within HTTP/2's 16 KiB - 16 MiB")
        if not 0 < self.stream_window_bytes <= h2f.WINDOW_BYTES_LIMIT:
            raise ValueError("stream_window_bytes must be within HTTP/2's 1 - 2^31-1")
        if not h2f.DEFAULT_WINDOW_BYTES <= self.connection_window_bytes <= h2f.WINDOW_BYTES_LIMIT:
            raise ValueError("connection_window_bytes must be within 64 KiB - 2^31-1")

    def settings(self) -> dict[int, int]:
        """Our SETTINGS frame."""
        return {h2f.ENABLE_PUSH: 0, h2f.INITIAL_WINDOW_SIZE: self.stream_window_bytes,
                h2f.MAX_FRAME_SIZE: self.receive_frame_bytes, h2f.MAX_HEADER_LIST_SIZE: self.header_list_bytes_max}

_STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                 "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
# gRPC's mapping of HTTP statuses of answers that are not gRPC (a proxy's error page, say).
_HTTP_STATUS_CODES = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED",
                      429: "UNAVAILABLE", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE"}
# gRPC's mapping of RST_STREAM codes.
_RESET_CODES = {h2f.CANCEL: "CANCELLED", h2f.REFUSED_STREAM: "UNAVAILABLE", h2f.ENHANCE_YOUR_CALM: "RESOURCE_EXHAUSTED",
                h2f.INADEQUATE_SECURITY: "PERMISSION_DENIED"}
_FRAME = struct.Struct(">BI")
_BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

log = logging.getLogger("gateway.engine")


def _grpc_timeout(timeout_s: float) -> bytes:
    # At most 8 digits (the spec): milliseconds up to ~27 hours, then seconds.
    ms = max(1, int(timeout_s * 1000))
    return b"%dm" % ms if ms < 100_000_000 else b"%dS" % min(int(timeout_s), 99_999_999)


class _Call:
    """One call's received state, written by the connection's reader, read by the caller."""

    __slots__ = ("stream_id", "buffer", "messages", "status", "headers", "got_headers", "error", "finished",
                 "changed", "unacked_bytes", "connection_debt_bytes", "send_window_bytes", "last_read", "left_at",
                 "listener", "listener_due", "reader_waiting", "nudged")

    def __init__(self) -> None:
        self.stream_id = 0
        self.buffer = bytearray()  # bytes of a message not complete yet
        self.messages: list[bytes] = []
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.got_headers = False
        self.error: EngineCallError | None = None
        self.finished = False
        self.changed = trio.Event()
        self.unacked_bytes = 0  # received on the stream, not yet credited back to the engine
        self.connection_debt_bytes = 0  # the same, for the connection's window
        self.send_window_bytes = 0  # what the engine lets us send on this stream
        self.last_read = False  # the caller has read the call's last message: only the end is due
        self.left_at: float | None = None  # when the caller left it, its end still due
        # ServerStream.listen: called by the connection's reader with messages that arrived while
        # the caller awaits them (reader_waiting); True when it took care of them, else the caller
        # is woken, nudged (its next read returns [] if no message is left for it).
        self.listener: Callable[[], bool] | None = None
        self.listener_due = False  # in the connection's list of calls to hand to their listeners
        self.reader_waiting = False
        self.nudged = False

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


def _renewed(event: trio.Event) -> trio.Event:
    """The event to wait on: the same one while unset, so every waiter is woken by one ``set``."""
    return trio.Event() if event.is_set() else event


class _Connection:
    """One HTTP/2 connection to an engine and the calls open on it.

    State is changed synchronously (frames to send go to ``_outbox``) and written by
    ``flush`` under a lock, so frames leave in the order they were made: stream ids
    increase on the wire and a header block's frames stay together.
    """

    # Slots: more than 30 attributes would take instances off CPython's fast attribute path (shared
    # keys), and every frame reads a dozen of them (measured: +1 % instructions per streamed request).
    __slots__ = ("_arrived", "_block", "_block_flags", "_block_stream_id", "_connection_credit_bytes",
                 "_connection_window_bytes", "_credit_pending_bytes", "_header_decoder", "_keepalive_scope", "_left",
                 "_next_stream_id", "_outbox", "_peer_initial_window_bytes", "_peer_max_frame_bytes",
                 "_peer_max_streams", "_reader", "_received_uncredited_bytes", "_request_header_prefixes",
                 "_send_lock", "_send_window_bytes", "_stream_closed", "_stream_credit_bytes",
                 "_stream_window_bytes", "_window_opened", "accepting", "alive", "calls", "config", "pings_sent",
                 "received_bytes", "stream", "target", "tls")

    def __init__(self, target: str, stream: "trio.SocketStream | trio.SSLStream", config: H2Config) -> None:
        self.target = target
        self.stream = stream
        self.config = config
        # Read on every frame: plain attributes rather than the config's, one lookup each.
        self._stream_window_bytes = config.stream_window_bytes
        self._connection_window_bytes = config.connection_window_bytes
        self._stream_credit_bytes = config.stream_window_bytes // 4
        self._connection_credit_bytes = config.connection_window_bytes // 4
        self._keepalive_scope = trio.CancelScope()
        self.pings_sent = 0
        # Over TLS (grpcs://) bytes go through the SSL object: the direct socket fast paths step aside.
        self.tls = isinstance(stream, trio.SSLStream)
        self.calls: dict[int, _Call] = {}
        self.alive = True
        self.accepting = True  # False after GOAWAY: running calls finish, new ones go elsewhere
        self.received_bytes = 0
        self._reader = h2f.FrameReader(config.receive_frame_bytes)
        self._header_decoder = h2f.HeaderBlockDecoder(config.header_list_bytes_max)
        self._outbox = bytearray()
        self._send_lock = trio.StrictFIFOLock()
        self._window_opened = trio.Event()
        self._stream_closed = trio.Event()
        self._left: collections.deque[_Call] = collections.deque()  # calls left, their end still due
        self._arrived: list[_Call] = []  # calls with listeners and new messages, in the read being parsed
        self._next_stream_id = 1
        self._request_header_prefixes: dict[str, bytes] = {}
        # The engine's settings; RFC 9113's defaults until its SETTINGS frame arrives.
        self._peer_max_streams = 2**31
        self._peer_initial_window_bytes = h2f.DEFAULT_WINDOW_BYTES
        self._peer_max_frame_bytes = h2f.DEFAULT_FRAME_BYTES
        self._send_window_bytes = h2f.DEFAULT_WINDOW_BYTES  # the connection's, for our DATA
        self._received_uncredited_bytes = 0  # the connection's receive window in use
        self._credit_pending_bytes = 0  # consumed, not yet sent back in a WINDOW_UPDATE
        # A header block arriving in HEADERS + CONTINUATION frames.
        self._block_stream_id = 0
        self._block_flags = 0
        self._block = bytearray()

    async def start(self) -> None:
        self._outbox += h2f.PREFACE + h2f.settings_frame(self.config.settings())
        self._outbox += h2f.window_update_frame(0, self._connection_window_bytes - h2f.DEFAULT_WINDOW_BYTES)
        await self.flush()

    async def flush(self) -> None:
        """Send what is queued, in queue order.

        With no write in progress the kernel usually takes it all at once, without a trip through
        the scheduler (fast_send). What it does not take stays at the head of the queue for the
        send lock's holder; waiting for the lock is shielded, since a frame may already be half
        on the wire and must be finished (the holder's write is bounded by ``write_timeout_s``).
        """
        if not self._send_lock.locked():
            self._write_now()
            if not self._outbox:
                return
        with trio.CancelScope(shield=True):
            async with self._send_lock:
                await self._write_outbox()

    def _write_now(self) -> None:
        """Write as much of the queue as the kernel takes now; the rest stays queued (all of it over
        TLS, where only the awaited write can encrypt)."""
        if not self._outbox or not self.alive or self.tls:
            return
        try:
            sent = send_now(self.stream, self._outbox)
        except _BROKEN as e:
            self.lost(f"write failed: {e}")
            return
        del self._outbox[:sent]

    async def _write_outbox(self) -> None:
        """Send what is queued (the caller holds the send lock).

        Shielded: a caller leaving (a client gone, a deadline) must not cut a write short, since
        half a frame would corrupt every call on the connection. A write the engine does not take
        within ``write_timeout_s`` ends the connection instead.
        """
        self._write_now()
        if not self._outbox or not self.alive:
            return
        data = bytes(self._outbox)
        self._outbox.clear()
        write_timeout_s = self.config.write_timeout_s
        with trio.CancelScope(shield=True, deadline=trio.current_time() + write_timeout_s) as scope:
            try:
                await self.stream.send_all(data)
            except _BROKEN as e:
                self.lost(f"write failed: {e}")
        if scope.cancelled_caught:
            self.lost(f"a write stalled for {write_timeout_s}s")

    # -- reading (one task per connection) ------------------------------------

    async def read_loop(self) -> None:
        reason = "the engine closed the connection"
        try:
            while self.alive:
                data = await (self.stream.receive_some(_READ_BYTES) if self.tls
                              else receive_some(self.stream, _READ_BYTES))
                if not data:
                    break
                self.received_bytes += len(data)
                try:
                    for kind, flags, stream_id, payload in self._reader.feed(data):
                        self._on_frame(kind, flags, stream_id, payload)
                except h2f.ConnectionFailure as e:
                    reason = f"HTTP/2 protocol error: {e}"
                    self._outbox += h2f.goaway_frame(0, e.code, str(e).encode()[:256])
                    await self.flush()
                    break
                if self._arrived:
                    self._hand_to_listeners()
                if self._outbox:  # settings and ping acknowledgements, window updates, resets
                    await self.flush()
                if not self.accepting and not self.calls:
                    reason = "drained after GOAWAY"
                    break
        except _BROKEN as e:
            reason = f"read failed: {e}"
        self.lost(reason)
        with trio.CancelScope(shield=True):
            with contextlib.suppress(*_BROKEN):
                await self.stream.aclose()

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block_stream_id and kind != h2f.CONTINUATION:
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, "a header block interrupted by another frame")
        if kind == h2f.DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == h2f.HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == h2f.CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == h2f.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == h2f.SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == h2f.PING:
            if stream_id:
                raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise h2f.ConnectionFailure(h2f.FRAME_SIZE_ERROR, "a PING frame not of 8 bytes")
            if not flags & h2f.ACK:
                self._outbox += h2f.frame(h2f.PING, h2f.ACK, 0, payload)
        elif kind == h2f.RST_STREAM:
            self._on_reset(stream_id, payload)
        elif kind == h2f.GOAWAY:
            self._on_goaway(stream_id, payload)
        elif kind == h2f.PUSH_PROMISE:
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, "PUSH_PROMISE, though push was disabled")
        # PRIORITY and frame types we do not know are ignored (RFC 9113 5.5).

    def _hand_to_listeners(self) -> None:
        """Calls whose messages arrived in the last read: to their listeners, or their readers woken."""
        arrived, self._arrived = self._arrived, []
        for call in arrived:
            call.listener_due = False
            listener = call.listener
            if listener is not None and call.reader_waiting and call.messages:
                try:
                    if listener():
                        continue
                except Exception:  # the caller's bug: its call fails, the connection's others go on
                    log.exception("a listener of stream %d failed", call.stream_id)
                    call.listener = None
                    call.fail(EngineCallError("INTERNAL", "the gateway failed handling the engine's messages"))
                call.nudged = True
            call.wake()

    def _call_of(self, stream_id: int, what: str) -> _Call | None:
        """The call of a stream the engine sends on; None for one we already left."""
        if stream_id == 0:
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, f"{what} on stream 0")
        call = self.calls.get(stream_id)
        if call is None and (stream_id % 2 == 0 or stream_id >= self._next_stream_id):
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, f"{what} on stream {stream_id}, which we never opened")
        return call

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        call = self._call_of(stream_id, "DATA")
        size = len(payload)  # padding included: it counts against the windows
        self._received_uncredited_bytes += size
        if self._received_uncredited_bytes > self._connection_window_bytes:
            raise h2f.ConnectionFailure(h2f.FLOW_CONTROL_ERROR, "the engine sent beyond the connection's window")
        data = h2f.unpad(flags, payload)
        if call is None:
            self._credit_connection(size)
            return
        if call.left_at is not None:  # nobody reads it any more: only its end matters
            self._credit_connection(size)
            if flags & h2f.END_STREAM:
                self._remove(call)
            return
        call.unacked_bytes += size
        call.connection_debt_bytes += size
        if call.unacked_bytes > self._stream_window_bytes:
            self._reset(call, h2f.FLOW_CONTROL_ERROR, "INTERNAL", "the engine sent beyond the stream's window")
            return
        if not call.got_headers:
            self._reset(call, h2f.PROTOCOL_ERROR, "INTERNAL", "the engine sent DATA before HEADERS")
            return
        if data:
            call.feed(data)
            if call.listener is None or not call.messages:
                call.wake()
            elif not call.listener_due:  # handed over once the whole read is parsed: batches stay whole
                call.listener_due = True
                self._arrived.append(call)
        if flags & h2f.END_STREAM:
            self._finish(call, {})

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, "HEADERS on stream 0")
        fragment = h2f.unpad(flags, payload)
        if flags & h2f.END_HEADERS:
            self._on_header_block(flags, stream_id, fragment)
        else:
            self._block_stream_id, self._block_flags, self._block = stream_id, flags, bytearray(fragment)

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not self._block_stream_id or stream_id != self._block_stream_id:
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, "CONTINUATION not following HEADERS of its stream")
        self._block += payload
        if len(self._block) > self.config.header_block_bytes_max:
            raise h2f.ConnectionFailure(h2f.ENHANCE_YOUR_CALM,
                                        f"a header block over {self.config.header_block_bytes_max} bytes")
        if flags & h2f.END_HEADERS:
            block, self._block = bytes(self._block), bytearray()
            self._block_stream_id = 0
            self._on_header_block(self._block_flags, stream_id, block)

    def _on_header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        fields = self._header_decoder.decode(block)  # always: HPACK state is shared by every stream
        call = self._call_of(stream_id, "HEADERS")
        if call is None:
            return
        if call.got_headers:
            if not flags & h2f.END_STREAM:
                self._reset(call, h2f.PROTOCOL_ERROR, "INTERNAL", "the engine sent trailers that do not end the call")
                return
            self._finish(call, dict(fields))
            return
        headers = dict(fields)
        try:
            status = int(headers.get(b":status", b"0"))
        except ValueError:
            status = 0
        if 100 <= status < 200 and not flags & h2f.END_STREAM:
            return  # an informational answer: the real one follows
        call.got_headers = True
        call.headers = headers
        call.status = status
        if flags & h2f.END_STREAM:
            self._finish(call, {})  # trailers-only: the status is in these headers

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        increment = h2f.parse_u32(payload, "WINDOW_UPDATE") & h2f.WINDOW_BYTES_LIMIT
        if stream_id == 0:
            if increment == 0:
                raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 for the connection")
            self._send_window_bytes += increment
            if self._send_window_bytes > h2f.WINDOW_BYTES_LIMIT:
                raise h2f.ConnectionFailure(h2f.FLOW_CONTROL_ERROR, "the connection's window beyond 2^31-1")
        else:
            call = self._call_of(stream_id, "WINDOW_UPDATE")
            if call is None:
                return
            if increment == 0:
                self._reset(call, h2f.PROTOCOL_ERROR, "INTERNAL", "a WINDOW_UPDATE of 0 for the call")
                return
            call.send_window_bytes += increment
            if call.send_window_bytes > h2f.WINDOW_BYTES_LIMIT:
                self._reset(call, h2f.FLOW_CONTROL_ERROR, "INTERNAL", "the call's window beyond 2^31-1")
                return
        self._window_opened.set()

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & h2f.ACK:
            if payload:
                raise h2f.ConnectionFailure(h2f.FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        for key, value in h2f.parse_settings(payload):
            if key == h2f.MAX_CONCURRENT_STREAMS:
                self._peer_max_streams = value
            elif key == h2f.INITIAL_WINDOW_SIZE:
                change = value - self._peer_initial_window_bytes
                self._peer_initial_window_bytes = value
                for call in self.calls.values():
                    call.send_window_bytes += change
                    if call.send_window_bytes > h2f.WINDOW_BYTES_LIMIT:
                        raise h2f.ConnectionFailure(h2f.FLOW_CONTROL_ERROR, "a call's window beyond 2^31-1")
            elif key == h2f.MAX_FRAME_SIZE:
                self._peer_max_frame_bytes = value
        self._outbox += h2f.frame(h2f.SETTINGS, h2f.ACK, 0)
        self._window_opened.set()
        self._stream_closed.set()  # more streams may be allowed now

    def _on_reset(self, stream_id: int, payload: bytes) -> None:
        code = h2f.parse_u32(payload, "RST_STREAM")
        call = self._call_of(stream_id, "RST_STREAM")
        if call is not None:
            self._remove(call)
            call.fail(EngineCallError(_RESET_CODES.get(code, "INTERNAL"),
                                      f"the engine reset the call ({h2f.error_name(code)})"))

    def _on_goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, "GOAWAY on a stream")
        last_stream_id, code, debug = h2f.parse_goaway(payload)
        self.accepting = False
        for call in [call for stream_id, call in self.calls.items() if stream_id > last_stream_id]:
            self._remove(call)
            call.fail(EngineCallError("UNAVAILABLE", "the engine is going away (GOAWAY)"))
        if code != h2f.NO_ERROR:
            self.lost(f"GOAWAY {h2f.error_name(code)} {debug[:256].decode('utf-8', 'replace')}")

    # -- stream and window bookkeeping ---------------------------------------------

    def _remove(self, call: _Call) -> None:
        """The call's stream is closed: its share of the connection's window goes back."""
        self.calls.pop(call.stream_id, None)
        self._credit_connection(call.connection_debt_bytes)
        call.connection_debt_bytes = 0
        self._stream_closed.set()

    def _finish(self, call: _Call, trailers: dict[bytes, bytes]) -> None:
        self._remove(call)
        call.end(trailers)

    def _reset(self, call: _Call, code: int, grpc_code: str, message: str) -> None:
        """A stream error (RFC 9113 5.4.2): the stream is reset, the call fails, the connection lives on."""
        self._remove(call)
        self._outbox += h2f.rst_stream_frame(call.stream_id, code)
        call.fail(EngineCallError(grpc_code, message))

    def _credit_connection(self, size: int) -> None:
        self._credit_pending_bytes += size
        if self._credit_pending_bytes >= self._connection_credit_bytes:
            self._outbox += h2f.window_update_frame(0, self._credit_pending_bytes)
            self._received_uncredited_bytes -= self._credit_pending_bytes
            self._credit_pending_bytes = 0

    def lost(self, reason: str) -> None:
        """The connection is unusable: every open call fails as UNAVAILABLE (retryable)."""
        if not self.alive:
            return
        self.alive = False
        self.accepting = False
        self._keepalive_scope.cancel()
        for call in self.calls.values():
            call.fail(EngineCallError("UNAVAILABLE", f"connection to {self.target} lost: {reason}"))
        self.calls.clear()
        self._window_opened.set()
        self._stream_closed.set()

    async def keep_alive(self) -> None:
        """PING the engine when calls are open and nothing arrived for an interval; drop the connection
        when nothing arrives for the timeout after it (any frame counts, the PING's ACK among them).

        What this catches: an engine host gone without a FIN or RST (power, a cut link, a NAT or
        firewall forgetting the connection). Calls with deadlines would end anyway; a KV-event
        stream has none, and without health checks nothing else would notice. Costs nothing per
        frame: the read loop only counts bytes.
        """
        interval_s, timeout_s = self.config.keepalive_interval_s, self.config.keepalive_timeout_s
        if interval_s <= 0:
            return
        with self._keepalive_scope:
            seen = self.received_bytes
            while self.alive:
                await trio.sleep(interval_s)
                if not self.calls or self.received_bytes != seen:
                    seen = self.received_bytes
                    continue
                self.pings_sent += 1
                self._outbox += h2f.frame(h2f.PING, 0, 0, self.pings_sent.to_bytes(8, "big"))
                await self.flush()
                await trio.sleep(timeout_s)
                if self.received_bytes == seen:
                    self.lost(f"no answer to a keepalive PING within {timeout_s}s")
                    with trio.CancelScope(shield=True):
                        with contextlib.suppress(*_BROKEN):
                            await self.stream.aclose()  # the read loop, blocked on a dead socket, ends too
                    return
                seen = self.received_bytes

    async def aclose(self) -> None:
        """Close: GOAWAY first (no stream of the engine's was accepted: last stream id 0), then the socket."""
        if self.alive:
            self._outbox += h2f.goaway_frame(0, h2f.NO_ERROR)
            with contextlib.suppress(*_BROKEN):
                await self.flush()
        self.lost("closed")
        with trio.CancelScope(shield=True):
            with contextlib.suppress(*_BROKEN):
                await self.stream.aclose()

    # -- calls -------------------------------------------------------------------

    def _request_headers(self, path: str, timeout_s: float | None) -> bytes:
        prefix = self._request_header_prefixes.get(path)
        if prefix is None:
            prefix = b"".join((h2f.METHOD_POST, h2f.SCHEME_HTTP, h2f.literal_field(b":path", path.encode("ascii")),
                               h2f.literal_field(b":authority", self.target.encode("ascii")),
                               h2f.literal_field(b"content-type", b"application/grpc"),
                               h2f.literal_field(b"te", b"trailers"), h2f.literal_field(b"user-agent", b"smg-node")))
            self._request_header_prefixes[path] = prefix
        if timeout_s is None:
            return prefix
        return prefix + h2f.literal_field(b"grpc-timeout", _grpc_timeout(timeout_s))

    def _queue_headers(self, stream_id: int, block: bytes) -> None:
        size = self._peer_max_frame_bytes
        if len(block) <= size:
            self._outbox += h2f.frame(h2f.HEADERS, h2f.END_HEADERS, stream_id, block)
            return
        self._outbox += h2f.frame(h2f.HEADERS, 0, stream_id, block[:size])
        for at in range(size, len(block), size):
            last = at + size >= len(block)
            self._outbox += h2f.frame(h2f.CONTINUATION, h2f.END_HEADERS if last else 0, stream_id, block[at:at + size])

    async def start_call(self, path: str, payload: bytes, timeout_s: float | None) -> _Call:
        """Open a stream and send the request: HEADERS and as much DATA as the windows allow, one write."""
        if self._left:
            self._reset_overdue_left_calls()
        call = _Call()
        block = self._request_headers(path, timeout_s)
        body = memoryview(_FRAME.pack(0, len(payload)) + payload)
        while True:
            if not self.alive:
                raise EngineCallError("UNAVAILABLE", f"connection to {self.target} lost")
            # At most the engine's MAX_CONCURRENT_STREAMS at once: later calls wait for a stream to end.
            if len(self.calls) < self._peer_max_streams:
                if self._next_stream_id > h2f.STREAM_ID_LIMIT:
                    self.accepting = False  # ids used up: the next call opens a new connection
                    raise EngineCallError("UNAVAILABLE", f"stream ids to {self.target} used up")
                # Ids are taken and frames queued with no await in between, and the queue is written
                # in order: streams open on the wire in the order of their ids, as HTTP/2 requires.
                call.stream_id = self._next_stream_id
                self._next_stream_id += 2
                call.send_window_bytes = self._peer_initial_window_bytes
                self.calls[call.stream_id] = call
                self._queue_headers(call.stream_id, block)
                body = self._queue_body(call, body)
                window_opened = self._window_opened  # taken now: the reader sets this one
                await self.flush()
                break
            self._stream_closed = stream_closed = _renewed(self._stream_closed)
            await stream_closed.wait()
        try:
            while body:  # the rest waits for WINDOW_UPDATEs
                await window_opened.wait()
                if not self.alive:
                    raise EngineCallError("UNAVAILABLE", f"connection to {self.target} lost")
                if call.stream_id not in self.calls:
                    raise call.error or EngineCallError("CANCELLED", "the engine closed the call before its "
                                                        "request")
                body = self._queue_body(call, body)
                window_opened = self._window_opened
                await self.flush()
        except BaseException:  # the caller left (or the call failed) half-way: the stream must not stay open
            with trio.CancelScope(shield=True):
                await self.cancel(call)
            raise
        return call

    def _queue_body(self, call: _Call, body: memoryview) -> memoryview:
        """DATA frames for as much of the body as the windows allow; the rest is returned."""
        while body:
            size = min(self._send_window_bytes, call.send_window_bytes, self._peer_max_frame_bytes, len(body))
            if size <= 0:
                self._window_opened = _renewed(self._window_opened)  # set by the reader's next WINDOW_UPDATE
                return body
            self._send_window_bytes -= size
            call.send_window_bytes -= size
            self._outbox += h2f.frame(h2f.DATA, 0 if size < len(body) else h2f.END_STREAM, call.stream_id,
                                      body[:size])
            body = body[size:]
        return body

    async def consumed(self, call: _Call) -> None:
        """Give the engine back the window of what the caller took (back-pressure follows the reader)."""
        self.consumed_now(call)
        if self._outbox:
            await self.flush()

    def consumed_now(self, call: _Call) -> None:
        """``consumed`` without the write: the window updates wait in the queue for the next flush."""
        if call.connection_debt_bytes:
            self._credit_connection(call.connection_debt_bytes)
            call.connection_debt_bytes = 0
        if call.unacked_bytes >= self._stream_credit_bytes and call.stream_id in self.calls:
            self._outbox += h2f.window_update_frame(call.stream_id, call.unacked_bytes)
            call.unacked_bytes = 0

    def leave(self, call: _Call) -> None:
        """The caller is done with a call whose last message it read: the engine's end is all that is due."""
        if call.stream_id in self.calls:
            call.left_at = trio.current_time()
            self._left.append(call)

    def _reset_overdue_left_calls(self) -> None:
        """Calls left that the engine ended are forgotten; one not ended within the grace is reset."""
        left = self._left
        while left:
            call = left[0]
            if self.calls.get(call.stream_id) is call:
                if trio.current_time() - call.left_at < self.config.left_call_grace_s:
                    return
                self._remove(call)
                self._outbox += h2f.rst_stream_frame(call.stream_id, h2f.CANCEL)  # sent with the next call
            left.popleft()

    async def cancel(self, call: _Call) -> None:
        if call.stream_id in self.calls and self.alive:
            self._remove(call)
            self._outbox += h2f.rst_stream_frame(call.stream_id, h2f.CANCEL)
            await self.flush()


class H2GrpcClient:
    """gRPC to every engine target, from trio. Call ``aclose`` when done."""

    def __init__(self, nursery: trio.Nursery, tls: EngineTlsConfig = EngineTlsConfig(),
                 config: H2Config = H2Config()) -> None:
        self._nursery = nursery
        self.config = config
        self._connections: dict[str, _Connection] = {}
        self._connecting: dict[str, trio.Lock] = {}
        self._tls_config = tls
        self._tls_context: ssl.SSLContext | None = None  # made for the first grpcs:// target

    async def _connection(self, target: str) -> _Connection:
        connection = self._connections.get(target)
        if connection is not None and connection.accepting:
            return connection
        async with self._connecting.setdefault(target, trio.Lock()):
            connection = self._connections.get(target)
            if connection is not None and connection.accepting:
                return connection
            host, port, tls = split_target(target)
            try:
                with trio.fail_after(self.config.connect_timeout_s):
                    stream = await trio.open_tcp_stream(host, port)
                    if tls:
                        stream = await self._handshake(stream, host)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError) as e:
                detail = str(e) or str(e.__cause__ or "") or type(e).__name__  # trio wraps a handshake's SSLError
                raise EngineCallError("UNAVAILABLE", f"cannot connect to {target}: {detail}") from None
            connection = _Connection(target, stream, self.config)
            await connection.start()
            self._nursery.start_soon(connection.read_loop)
            self._nursery.start_soon(connection.keep_alive)
            self._connections[target] = connection
            return connection

    async def _handshake(self, stream: trio.SocketStream, host: str) -> trio.SSLStream:
        if self._tls_context is None:
            self._tls_context = client_context(self._tls_config, alpn=["h2"])  # gRPC needs h2 by ALPN
        tls = trio.SSLStream(stream, self._tls_context, server_hostname=host)
        try:
            await tls.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        if tls.selected_alpn_protocol() != "h2":
            await trio.aclose_forcefully(tls)
            raise OSError(f"the engine did not agree to HTTP/2 by ALPN (got {tls.selected_alpn_protocol()!r})")
        return tls

    async def unary(self, target: str, method: str, request: Any, response_type: Any,
                    timeout_s: float | None) -> Any:
        """One request, one response. Raises EngineCallError."""
        async with _OpenCall(self, target, method, request, timeout_s) as opened:
            call = opened.call
            while not call.finished:
                await call.changed.wait()
                call.changed = trio.Event()
        if call.error is not None:
            raise call.error
        if len(call.messages) != 1:
            raise EngineCallError("INTERNAL", f"a unary call answered {len(call.messages)} messages")
        return _parse(response_type, call.messages[0])

    def open_stream(self, target: str, method: str, request: Any, response_type: Any,
                    timeout_s: float | None, window_messages: int = 0,
                    last_message: "Callable[[Any], bool] | None" = None) -> "ServerStream":
        """A server stream: ``async with client.open_stream(...) as stream: async for batch in stream``.

        Batches are lists of messages that arrived together. Leaving the block before the stream
        ends cancels the call, unless the message read last is one ``last_message`` says ends
        the call: then the engine's own end is awaited.
        """
        return ServerStream(self, target, method, request, timeout_s, response_type, last_message)

    async def close_channel(self, target: str) -> None:
        connection = self._connections.pop(target, None)
        if connection is not None:
            await connection.aclose()

    async def aclose(self) -> None:
        for target in list(self._connections):
            await self.close_channel(target)


def _parse(response_type: Any, data: bytes) -> Any:
    try:
        return response_type.FromString(data)
    except Exception as e:  # protobuf's DecodeError, or anything a broken message raises
        raise EngineCallError("INTERNAL", f"cannot parse the engine's message: {e}") from None


class _OpenCall:
    """One call from its start to its end, as ``async with``: the block runs under the call's deadline.

    Leaving the block before the call ended cancels it (RST_STREAM) unless its last message
    was read (then it is left to end). The deadline surfaces as DEADLINE_EXCEEDED, and a
    connection that received nothing at all before it is dropped (half-open).

    A class rather than an ``asynccontextmanager`` generator: this is on every request's
    path, and a generator-based manager costs a generator, its wrapper and trio's
    async-generator hooks per use.
    """

    __slots__ = ("_client", "_target", "_method", "_request", "_timeout_s", "connection", "call", "_scope",
                 "_received_at_start")

    def __init__(self, client: H2GrpcClient, target: str, method: str, request: Any,
                 timeout_s: float | None) -> None:
        self._client = client
        self._target = target
        self._method = method
        self._request = request
        self._timeout_s = timeout_s
        self.call: _Call | None = None

    async def __aenter__(self) -> "_OpenCall":
        timeout_s = self._timeout_s
        deadline = trio.current_time() + timeout_s if timeout_s is not None else float("inf")
        connection = self.connection = await self._client._connection(self._target)
        self._received_at_start = connection.received_bytes
        # Entered by hand and closed in __aexit__, in this same task, as a ``with`` around the
        # caller's block would.
        self._scope = trio.CancelScope(deadline=deadline)
        self._scope.__enter__()
        try:
            self.call = await connection.start_call(self._method, self._request.SerializeToString(), timeout_s)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)  # raises DEADLINE_EXCEEDED if it is that
            raise
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> bool:
        call, connection = self.call, self.connection
        try:
            swallowed = self._scope.__exit__(exc_type, exc, traceback)
            if self._scope.cancelled_caught:
                if connection.received_bytes == self._received_at_start:
                    connection.lost("no answer at all before a call's deadline")  # half-open: start over
                raise EngineCallError("DEADLINE_EXCEEDED",
                                      f"no answer from {self._target} within {self._timeout_s}s") from None
            return swallowed
        finally:
            if call is not None:
                call.listener = None  # the caller is gone: nothing of the call is handed over any more
            if call is not None and not call.finished:
                if call.last_read:
                    connection.leave(call)
                else:
                    with trio.CancelScope(shield=True):
                        await connection.cancel(call)


class ServerStream(_OpenCall):
    """A call answered by a stream of messages, read as lists of those that arrived together."""

    __slots__ = ("_response_type", "_last_message")

    def __init__(self, client: H2GrpcClient, target: str, method: str, request: Any, timeout_s: float | None,
                 response_type: Any, last_message: "Callable[[Any], bool] | None") -> None:
        super().__init__(client, target, method, request, timeout_s)
        self._response_type = response_type
        self._last_message = last_message

    def __aiter__(self) -> "ServerStream":
        return self

    async def __anext__(self) -> list:
        call = self.call
        while True:
            if call.messages:
                call.nudged = False
                raw, call.messages = call.messages, []
                await self.connection.consumed(call)
                response_type = self._response_type
                batch = [_parse(response_type, data) for data in raw]
                if self._last_message is not None and self._last_message(batch[-1]):
                    call.last_read = True
                return batch
            if call.nudged:
                call.nudged = False
                return []
            if call.finished:
                if call.error is not None:
                    raise call.error
                raise StopAsyncIteration
            call.reader_waiting = True
            try:
                await call.changed.wait()
            finally:
                call.reader_waiting = False
            call.changed = trio.Event()

    def listen(self, listener: Callable[[], bool]) -> None:
        """Have the connection's reading task call ``listener()`` when messages arrive while this
        stream's reader awaits them (and only then: never while the reader is busy, so nothing
        overtakes it). The listener takes them with ``take_now`` and returns True when it handled
        everything; on False the reader is woken, and its next batch is [] if no message is left.
        It runs in the connection's task: it must not block, and what it raises fails its call only.
        """
        self.call.listener = listener

    def take_now(self) -> list | None:
        """The messages waiting, parsed, for the listener; None (they stay for the reader) when one
        cannot be parsed or the last one ends the call: the reader's errors and end are its own."""
        call = self.call
        raw = call.messages
        if not raw:
            return None
        try:
            batch = [self._response_type.FromString(data) for data in raw]
        except Exception:  # the reader parses it again and fails the call
            return None
        if self._last_message is not None and self._last_message(batch[-1]):
            return None
        call.messages = []
        self.connection.consumed_now(call)  # the reading task flushes the queue after its listeners
        return batch

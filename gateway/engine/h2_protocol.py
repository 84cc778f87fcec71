"""The HTTP/2 client side of gRPC, as a protocol object without I/O: bytes in, frames out, state.

``H2ClientProtocol`` parses what the engine sends (``receive``), keeps every
stream's state (``StreamState``, moved only by the ``STREAM_MOVES`` table), both
directions' flow-control windows, the HPACK decoder and the calls' received
messages, and queues the frames to send (``data_to_send``). It never reads a
socket, awaits, or reads a clock: time is passed in (``leave``,
``reset_overdue_left_calls``, ``KeepaliveRule``), and the events callers wait
on are made by a factory the driver passes (``trio.Event`` in
``h2grpc._Connection``, the driver; a plain flag in the tests, which run it
against ``h2``'s server in memory).

What it implements, and why each rule, is in ``h2grpc.py``'s docstring.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import struct
from collections.abc import Callable
from typing import Protocol
from urllib.parse import unquote

from . import http2_frames as h2f
from .errors import EngineCallError

log = logging.getLogger("gateway.engine")


class Event(Protocol):
    """What the protocol sets when something a caller may wait for happens (``trio.Event`` does)."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...


EventFactory = Callable[[], Event]


# Same bound as the bridge: any real context fits, an engine cannot make us hold more.
GRPC_MESSAGE_BYTES_MAX = 64 * 1024 * 1024

_DATA = h2f.DATA  # read for every frame received: a module global, not the other module's attribute


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
    # Engine connections read by a thread of the loop's own (off_loop.py) rather than a task each: a
    # message that arrives alone (a paced token) costs no pass of trio's scheduler (-24 % instructions for
    # a paced stream), but under a mix of 256 clients the time to first token's p99 was 10-20 ms worse
    # (BENCHMARKS, "Where a paced token's instructions go"): off by default. Plain gRPC only (TLS keeps
    # its task).
    read_thread: bool = False

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



# IntEnums: a move is a dict lookup on every call, and an Enum's hash is a Python function (hash of its
# name) where an IntEnum's is int's.
class StreamState(enum.IntEnum):
    """A stream's state as its client sees it (RFC 9113 5.1; we never receive pushed streams)."""

    IDLE = 0  # made, not on the wire yet
    OPEN = 1  # HEADERS sent; part of the request body may still wait for a window
    HALF_CLOSED_LOCAL = 2  # the request ended (END_STREAM sent): only receiving
    CLOSED = 3  # ended by the engine, reset by either side, or its connection lost


class StreamEvent(enum.IntEnum):
    HEADERS_SENT = 0
    END_SENT = 1
    END_RECEIVED = 2
    RESET = 3  # RST_STREAM sent or received, or refused by a GOAWAY


# Every move a stream makes. An engine may answer (and end the call) before our request's body has
# all gone out: OPEN + END_RECEIVED is CLOSED, and the rest of the body is never sent.
STREAM_MOVES: dict[tuple[StreamState, StreamEvent], StreamState] = {
    (StreamState.IDLE, StreamEvent.HEADERS_SENT): StreamState.OPEN,
    (StreamState.OPEN, StreamEvent.END_SENT): StreamState.HALF_CLOSED_LOCAL,
    (StreamState.OPEN, StreamEvent.END_RECEIVED): StreamState.CLOSED,
    (StreamState.OPEN, StreamEvent.RESET): StreamState.CLOSED,
    (StreamState.HALF_CLOSED_LOCAL, StreamEvent.END_RECEIVED): StreamState.CLOSED,
    (StreamState.HALF_CLOSED_LOCAL, StreamEvent.RESET): StreamState.CLOSED,
}


# The members as module globals for the code below: reading an enum member through its class costs
# ~70 ns (the metaclass's lookup), a global ~5 ns, and a call makes several moves.
_IDLE, _OPEN, _HALF_CLOSED_LOCAL, _CLOSED = StreamState
_HEADERS_SENT, _END_SENT, _END_RECEIVED, _RESET = StreamEvent
# The table as rows indexed by state then event (what the calls below read: no tuple to make and
# hash); a move the table does not have leaves the state as it was, which the tests rule out.
_NEXT: list[list[StreamState]] = [[STREAM_MOVES.get((state, event), state) for event in StreamEvent]
                                  for state in StreamState]


class KeepaliveAction(enum.Enum):
    NONE = "none"
    PING = "ping"
    DROP = "drop"


class KeepaliveRule:
    """When a connection is PINGed, and when it is given up, from its received-byte count on passed-in time.

    Checked every ``interval_s``: with calls open and nothing received since the last check, PING;
    then, ``timeout_s`` later, still nothing received: DROP. Any byte counts as life (the PING's
    ACK among them), so a busy connection is never PINGed, and an idle one (no calls) never is.
    """

    __slots__ = ("interval_s", "timeout_s", "next_check_at", "_seen_bytes", "_pinged")

    def __init__(self, interval_s: float, timeout_s: float, now: float) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.next_check_at = now + interval_s
        self._seen_bytes = 0
        self._pinged = False

    def check(self, now: float, received_bytes: int, calls_open: bool) -> KeepaliveAction:
        quiet = received_bytes == self._seen_bytes
        self._seen_bytes = received_bytes
        if self._pinged:
            self._pinged = False
            self.next_check_at = now + self.interval_s
            return KeepaliveAction.DROP if quiet else KeepaliveAction.NONE
        if quiet and calls_open:
            self._pinged = True
            self.next_check_at = now + self.timeout_s
            return KeepaliveAction.PING
        self.next_check_at = now + self.interval_s
        return KeepaliveAction.NONE


def grpc_timeout(timeout_s: float) -> bytes:
    # At most 8 digits (the spec): milliseconds up to ~27 hours, then seconds.
    ms = max(1, int(timeout_s * 1000))
    return b"%dm" % ms if ms < 100_000_000 else b"%dS" % min(int(timeout_s), 99_999_999)


class Call:
    """One call's received state, written by the connection's reader, read by the caller."""

    __slots__ = ("state", "stream_id", "buffer", "messages", "status", "headers", "got_headers", "error", "finished",
                 "changed", "unacked_bytes", "connection_debt_bytes", "send_window_bytes", "last_read", "left_at",
                 "listener", "listener_due", "reader_waiting", "nudged", "pending_body")

    def __init__(self, new_event: EventFactory) -> None:
        self.state = _IDLE
        self.stream_id = 0
        self.buffer = bytearray()  # bytes of a message not complete yet
        self.messages: list[bytes] = []
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.got_headers = False
        self.error: EngineCallError | None = None
        self.finished = False
        self.changed = new_event()  # set by wake(); the driver waits on it and renews it
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
        # (pending_body, the request's DATA still waiting for a window, is set by open_call)

    def wake(self) -> None:
        self.changed.set()

    def feed(self, data: bytes) -> None:
        buffer = self.buffer
        if buffer:
            buffer += data
            data = buffer
        # Without bytes waiting (the usual DATA frame: whole messages) they are cut straight from the frame.
        at, size = 0, len(data)
        while size - at >= 5:
            compressed, length = _FRAME.unpack_from(data, at)
            if length > GRPC_MESSAGE_BYTES_MAX:
                self.fail(EngineCallError("RESOURCE_EXHAUSTED", f"a message of {length} bytes exceeds the limit"))
                return
            end = at + 5 + length
            if end > size:
                break
            if compressed:
                self.fail(EngineCallError("INTERNAL", "the engine sent a compressed message (never asked for)"))
                return
            self.messages.append(bytes(data[at + 5:end]))
            at = end
        if data is buffer:
            del buffer[:at]
        elif at < size:
            buffer += memoryview(data)[at:]  # the start of a message still coming

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


class H2ClientProtocol:
    """One HTTP/2 connection to an engine and the calls open on it, without I/O.

    State changes synchronously; frames to send accumulate in ``_outbox`` (``data_to_send`` takes
    them) in the order they were made, so stream ids increase on the wire and a header block's
    frames stay together.
    """

    # Slots: more than 30 attributes would take instances off CPython's fast attribute path (shared
    # keys), and every frame reads a dozen of them (measured: +1 % instructions per streamed request).
    __slots__ = ("target", "config", "_new_event", "_stream_window_bytes", "_connection_window_bytes",
                 "_stream_credit_bytes", "_connection_credit_bytes", "pings_sent", "calls", "alive", "accepting",
                 "received_bytes", "_reader", "_header_decoder", "_outbox", "_window_opened", "_stream_closed",
                 "_left", "_arrived", "_next_stream_id", "_request_header_prefixes", "_peer_max_streams",
                 "_peer_initial_window_bytes", "_peer_max_frame_bytes", "_send_window_bytes",
                 "_received_uncredited_bytes", "_credit_pending_bytes", "_block_stream_id", "_block_flags", "_block")

    def __init__(self, target: str, config: H2Config, new_event: EventFactory) -> None:
        self.target = target
        self.config = config
        self._new_event = new_event
        # Read on every frame: plain attributes rather than the config's, one lookup each.
        self._stream_window_bytes = config.stream_window_bytes
        self._connection_window_bytes = config.connection_window_bytes
        self._stream_credit_bytes = config.stream_window_bytes // 4
        self._connection_credit_bytes = config.connection_window_bytes // 4
        self.pings_sent = 0
        self.calls: dict[int, Call] = {}
        self.alive = True
        self.accepting = True  # False after GOAWAY: running calls finish, new ones go elsewhere
        self.received_bytes = 0
        self._reader = h2f.FrameReader(config.receive_frame_bytes)
        self._header_decoder = h2f.HeaderBlockDecoder(config.header_list_bytes_max)
        self._outbox = bytearray()
        self._window_opened = new_event()  # set when a WINDOW_UPDATE or SETTINGS may let a body go on
        self._stream_closed = new_event()  # set when a stream closes: a call waiting for a slot may go
        self._left: collections.deque[Call] = collections.deque()  # calls left, their end still due
        self._arrived: list[Call] = []  # calls with listeners and new messages, in the read being parsed
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

    def start(self) -> None:
        """The connection preface: our SETTINGS and the connection window we grant."""
        self._outbox += h2f.PREFACE + h2f.settings_frame(self.config.settings())
        self._outbox += h2f.window_update_frame(0, self._connection_window_bytes - h2f.DEFAULT_WINDOW_BYTES)

    def data_to_send(self) -> bytes:
        data = bytes(self._outbox)
        self._outbox.clear()
        return data

    def _renewed(self, event: Event) -> Event:
        """The event to wait on: the same one while unset, so every waiter is woken by one ``set``."""
        return self._new_event() if event.is_set() else event

    def receive(self, data: bytes) -> str | None:
        """Bytes from the engine. Frames to send in answer are queued. A violation of the protocol
        queues GOAWAY with its error and returns why; the connection is then done for."""
        self.received_bytes += len(data)
        try:
            for kind, flags, stream_id, payload in self._reader.feed(data):
                if kind == _DATA and not self._block_stream_id:  # a token's frame: no dispatch call
                    self._on_data(flags, stream_id, payload)
                else:
                    self._on_frame(kind, flags, stream_id, payload)
        except h2f.ConnectionFailure as e:
            self._outbox += h2f.goaway_frame(0, e.code, str(e).encode()[:256])
            return f"HTTP/2 protocol error: {e}"
        if self._arrived:
            self._hand_to_listeners()
        return None

    def open_call(self, path: str, payload: bytes, timeout_s: float | None, metadata: bytes = b"") -> "Call | None":
        """Open a stream and queue the request: HEADERS and as much DATA as the windows allow (the rest
        waits in ``call.pending_body`` for ``send_more``). None while the engine's
        MAX_CONCURRENT_STREAMS are all open: wait for ``stream_closed`` and ask again.
        Raises EngineCallError when the connection cannot take calls any more."""
        if not self.alive:
            raise EngineCallError("UNAVAILABLE", f"connection to {self.target} lost")
        if len(self.calls) >= self._peer_max_streams:
            self._stream_closed = self._renewed(self._stream_closed)
            return None
        if self._next_stream_id > h2f.STREAM_ID_LIMIT:
            self.accepting = False  # ids used up: the next call opens a new connection
            raise EngineCallError("UNAVAILABLE", f"stream ids to {self.target} used up")
        call = Call(self._new_event)
        # Ids are taken and frames queued at once, and the queue is written in order: streams open on
        # the wire in the order of their ids, as HTTP/2 requires.
        call.stream_id = self._next_stream_id
        self._next_stream_id += 2
        call.send_window_bytes = self._peer_initial_window_bytes
        self.calls[call.stream_id] = call
        # ``metadata``: the call's own header fields, HPACK-encoded (a trace's traceparent)
        self._queue_headers(call.stream_id, self._request_headers(path, timeout_s) + metadata)
        call.state = _NEXT[call.state][_HEADERS_SENT]
        call.pending_body = self._queue_body(call, memoryview(_FRAME.pack(0, len(payload)) + payload))
        return call

    def send_more(self, call: "Call") -> None:
        """Queue more of a call's request body after a window opened. Raises EngineCallError when the
        connection was lost or the engine closed the call before its request."""
        if not self.alive:
            raise EngineCallError("UNAVAILABLE", f"connection to {self.target} lost")
        if call.stream_id not in self.calls:
            raise call.error or EngineCallError("CANCELLED", "the engine closed the call before its request")
        call.pending_body = self._queue_body(call, call.pending_body)

    def cancel(self, call: "Call") -> bool:
        """Reset a call the caller left before its end; True when a RST_STREAM was queued."""
        if call.stream_id in self.calls and self.alive:
            self._remove(call, _RESET)
            self._outbox += h2f.rst_stream_frame(call.stream_id, h2f.CANCEL)
            return True
        return False

    def ping(self) -> None:
        self.pings_sent += 1
        self._outbox += h2f.frame(h2f.PING, 0, 0, self.pings_sent.to_bytes(8, "big"))

    def goaway(self) -> None:
        """We are closing: GOAWAY, NO_ERROR (we accept no stream of the engine's: last stream id 0)."""
        if self.alive:
            self._outbox += h2f.goaway_frame(0, h2f.NO_ERROR)

    # -- frames from the engine ---------------------------------------------------------------------

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

    def _call_of(self, stream_id: int, what: str) -> Call | None:
        """The call of a stream the engine sends on; None for one we already left."""
        if stream_id == 0:
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, f"{what} on stream 0")
        call = self.calls.get(stream_id)
        if call is None and (stream_id % 2 == 0 or stream_id >= self._next_stream_id):
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, f"{what} on stream {stream_id}, which we never opened")
        return call

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        # Every streamed token comes in one of these: the open call found without _call_of's checks (they
        # tell a stream we left from one never opened), the payload unpadded only when it is padded.
        call = self.calls.get(stream_id) or self._call_of(stream_id, "DATA")
        size = len(payload)  # padding included: it counts against the windows
        self._received_uncredited_bytes += size
        if self._received_uncredited_bytes > self._connection_window_bytes:
            raise h2f.ConnectionFailure(h2f.FLOW_CONTROL_ERROR, "the engine sent beyond the connection's window")
        # A DATA frame has no priority fields (RFC 9113 6.1): only PADDED changes its payload.
        data = h2f.unpad(flags & ~h2f.PRIORITY_FLAG, payload) if flags & h2f.PADDED else payload
        if call is None:
            self._credit_connection(size)
            return
        if call.left_at is not None:  # nobody reads it any more: only its end matters
            self._credit_connection(size)
            if flags & h2f.END_STREAM:
                self._remove(call, _END_RECEIVED)
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
            self._remove(call, _RESET)
            call.fail(EngineCallError(_RESET_CODES.get(code, "INTERNAL"),
                                      f"the engine reset the call ({h2f.error_name(code)})"))

    def _on_goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2f.ConnectionFailure(h2f.PROTOCOL_ERROR, "GOAWAY on a stream")
        last_stream_id, code, debug = h2f.parse_goaway(payload)
        self.accepting = False
        for call in [call for stream_id, call in self.calls.items() if stream_id > last_stream_id]:
            self._remove(call, _RESET)
            call.fail(EngineCallError("UNAVAILABLE", "the engine is going away (GOAWAY)"))
        if code != h2f.NO_ERROR:
            self.lost(f"GOAWAY {h2f.error_name(code)} {debug[:256].decode('utf-8', 'replace')}")

    # -- stream and window bookkeeping ---------------------------------------------

    def _remove(self, call: Call, event: StreamEvent) -> None:
        """The call's stream is closed: its share of the connection's window goes back."""
        call.state = _NEXT[call.state][event]
        self.calls.pop(call.stream_id, None)
        self._credit_connection(call.connection_debt_bytes)
        call.connection_debt_bytes = 0
        self._stream_closed.set()

    def _finish(self, call: Call, trailers: dict[bytes, bytes]) -> None:
        self._remove(call, _END_RECEIVED)
        call.end(trailers)

    def _reset(self, call: Call, code: int, grpc_code: str, message: str) -> None:
        """A stream error (RFC 9113 5.4.2): the stream is reset, the call fails, the connection lives on."""
        self._remove(call, _RESET)
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
        for call in self.calls.values():
            call.state = _CLOSED
            call.fail(EngineCallError("UNAVAILABLE", f"connection to {self.target} lost: {reason}"))
        self.calls.clear()
        self._window_opened.set()
        self._stream_closed.set()

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
        return prefix + h2f.literal_field(b"grpc-timeout", grpc_timeout(timeout_s))

    def _queue_headers(self, stream_id: int, block: bytes) -> None:
        size = self._peer_max_frame_bytes
        if len(block) <= size:
            self._outbox += h2f.frame(h2f.HEADERS, h2f.END_HEADERS, stream_id, block)
            return
        self._outbox += h2f.frame(h2f.HEADERS, 0, stream_id, block[:size])
        for at in range(size, len(block), size):
            last = at + size >= len(block)
            self._outbox += h2f.frame(h2f.CONTINUATION, h2f.END_HEADERS if last else 0, stream_id, block[at:at + size])

    def _queue_body(self, call: Call, body: memoryview) -> memoryview:
        """DATA frames for as much of the body as the windows allow; the rest is returned."""
        while body:
            size = min(self._send_window_bytes, call.send_window_bytes, self._peer_max_frame_bytes, len(body))
            if size <= 0:
                self._window_opened = self._renewed(self._window_opened)  # set by the next WINDOW_UPDATE
                return body
            self._send_window_bytes -= size
            call.send_window_bytes -= size
            self._outbox += h2f.frame(h2f.DATA, 0 if size < len(body) else h2f.END_STREAM, call.stream_id,
                                      body[:size])
            body = body[size:]
        call.state = _NEXT[call.state][_END_SENT]
        return body

    def consumed_now(self, call: Call) -> None:
        """``consumed`` without the write: the window updates wait in the queue for the next flush."""
        if call.connection_debt_bytes:
            self._credit_connection(call.connection_debt_bytes)
            call.connection_debt_bytes = 0
        if call.unacked_bytes >= self._stream_credit_bytes and call.stream_id in self.calls:
            self._outbox += h2f.window_update_frame(call.stream_id, call.unacked_bytes)
            call.unacked_bytes = 0

    def leave(self, call: Call, now: float) -> None:
        """The caller is done with a call whose last message it read: the engine's end is all that is due."""
        if call.stream_id in self.calls:
            call.left_at = now
            self._left.append(call)

    def reset_overdue_left_calls(self, now: float) -> None:
        """Calls left that the engine ended are forgotten; one not ended within the grace is reset."""
        left = self._left
        while left:
            call = left[0]
            if self.calls.get(call.stream_id) is call:
                if now - call.left_at < self.config.left_call_grace_s:
                    return
                self._remove(call, _RESET)
                self._outbox += h2f.rst_stream_frame(call.stream_id, h2f.CANCEL)  # sent with the next call
            left.popleft()


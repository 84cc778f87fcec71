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

With ``H2Config.read_thread`` (``--engine-read-thread``) plain connections are
read not by a task but by the event loop's reader thread (``off_loop.py``), which runs the same
steps (``_on_readable``: the read, its frames, the listeners) while the loop
waits for I/O, so a message that arrives alone costs no pass of trio's
scheduler; a task per connection (``_tend``) does what needs one (a write the
kernel did not take at once, the close). TLS connections keep their task.

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

import contextlib
import logging
import os
import ssl
from collections.abc import Callable
from typing import Any

import trio

from ..net.fast_receive import receive_some
from ..net.fast_send import send_now
from .engine_tls import EngineTlsConfig, client_context, split_target
from .errors import EngineCallError
from . import http2_frames as h2f
from .h2_protocol import Call, H2ClientProtocol, H2Config, KeepaliveAction, KeepaliveRule
from .off_loop import OffLoopReader, supported as off_loop_supported
from ..base.options import Option

_READ_BYTES = 256 * 1024
_BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

log = logging.getLogger("gateway.engine")


class _Connection(H2ClientProtocol):
    """The driver of one connection's protocol (``h2_protocol.H2ClientProtocol``): its socket, the task
    that reads it, writes in order under a lock, the calls' waits, and keepalive on trio's clock."""

    __slots__ = ("stream", "tls", "_send_lock", "_keepalive_scope", "_off_loop", "_fd", "_tend_wanted", "_read_end")

    def __init__(self, target: str, stream: "trio.SocketStream | trio.SSLStream", config: H2Config) -> None:
        super().__init__(target, config, trio.Event)
        self.stream = stream
        # Over TLS (grpcs://) bytes go through the SSL object: the direct socket fast paths step aside.
        self.tls = isinstance(stream, trio.SSLStream)
        self._send_lock = trio.StrictFIFOLock()
        self._keepalive_scope = trio.CancelScope()
        self._off_loop: OffLoopReader | None = None  # read by the reader thread (read_off_loop), not a task
        self._fd = -1
        self._tend_wanted = trio.Event()
        self._read_end: tuple[str, bool] | None = None  # (why reading ended, a GOAWAY of ours is queued)

    async def start(self) -> None:
        super().start()
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

    # -- reading (one task per connection) ------------------------------------

    async def read_loop(self) -> None:
        reason = "the engine closed the connection"
        drained = False  # the last read found the socket emptied (fast_receive)
        try:
            while self.alive:
                data = await (self.stream.receive_some(_READ_BYTES) if self.tls
                              else receive_some(self.stream, _READ_BYTES, drained))
                if not data:
                    break
                drained = len(data) < _READ_BYTES
                failure = self.receive(data)
                if failure is not None:
                    reason = failure
                    await self.flush()  # the GOAWAY saying why
                    break
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

    # -- reading off the loop (``off_loop.py``): the same steps, run by the reader thread ---------------

    def read_off_loop(self, reader: OffLoopReader, nursery: trio.Nursery) -> None:
        """Have ``reader``'s thread read the connection (``_on_readable``, what ``read_loop`` does per read);
        a task of the nursery does what needs one (``_tend``: writes that wait, the close)."""
        self._off_loop = reader
        self._fd = self.stream.socket.fileno()
        reader.register(self._fd, self._on_readable)
        nursery.start_soon(self._tend)

    def _on_readable(self) -> None:
        """One read and its frames, in the reader thread while the loop waits (``read_loop``'s body)."""
        if self._read_end is not None:
            return
        try:
            data = os.read(self._fd, _READ_BYTES)
        except BlockingIOError:  # woken without data
            return
        except OSError as e:
            self.lost(f"read failed: {e}")  # the calls fail now, as the reading task's end failed them
            return
        if not data:
            self.lost("the engine closed the connection")
            return
        failure = self.receive(data)
        if failure is not None:  # the GOAWAY saying why goes first: _tend flushes it, then fails the calls
            self._off_loop.unregister(self._fd)
            self._read_end = (failure, True)
            self._tend_wanted.set()
            return
        if self._outbox:  # settings and ping acknowledgements, window updates, resets
            if not self._send_lock.locked():
                self._write_now()
            if self._outbox:
                self._tend_wanted.set()
        if not self.accepting and not self.calls:
            self.lost("drained after GOAWAY")

    async def _tend(self) -> None:
        """What reading off the loop leaves to a task: writes the kernel did not take at once, and the
        connection's end (the GOAWAY of a protocol error first, then the socket closed)."""
        reason = "closed"
        try:
            while True:
                await self._tend_wanted.wait()
                self._tend_wanted = trio.Event()
                if self._read_end is not None:
                    reason, flush_first = self._read_end
                    if flush_first:
                        await self.flush()
                    break
                if self._outbox:
                    await self.flush()
        finally:
            self._off_loop.unregister(self._fd)
            self.lost(reason)
            with trio.CancelScope(shield=True):
                with contextlib.suppress(*_BROKEN):
                    await self.stream.aclose()

    def lost(self, reason: str) -> None:
        super().lost(reason)
        self._keepalive_scope.cancel()
        if self._off_loop is not None and self._read_end is None:  # reading ends too, and _tend closes
            self._off_loop.unregister(self._fd)  # before the socket is closed (its number is reused)
            self._read_end = (reason, False)
            self._tend_wanted.set()

    async def keep_alive(self) -> None:
        """PING the engine when calls are open and nothing arrived for an interval; drop the connection
        when nothing arrives for the timeout after it (``KeepaliveRule``; any frame counts).

        What this catches: an engine host gone without a FIN or RST (power, a cut link, a NAT or
        firewall forgetting the connection). Calls with deadlines would end anyway; a KV-event
        stream has none, and without health checks nothing else would notice. Costs nothing per
        frame: the protocol already counts received bytes.
        """
        config = self.config
        if config.keepalive_interval_s <= 0:
            return
        rule = KeepaliveRule(config.keepalive_interval_s, config.keepalive_timeout_s, trio.current_time())
        with self._keepalive_scope:
            while self.alive:
                await trio.sleep_until(rule.next_check_at)
                action = rule.check(trio.current_time(), self.received_bytes, bool(self.calls))
                if action is KeepaliveAction.PING:
                    self.ping()
                    await self.flush()
                elif action is KeepaliveAction.DROP:
                    self.lost(f"no answer to a keepalive PING within {config.keepalive_timeout_s}s")
                    with trio.CancelScope(shield=True):
                        with contextlib.suppress(*_BROKEN):
                            await self.stream.aclose()  # the read loop, blocked on a dead socket, ends too
                    return

    async def aclose(self) -> None:
        """Close: GOAWAY first, then the socket."""
        self.goaway()
        with contextlib.suppress(*_BROKEN):
            await self.flush()
        self.lost("closed")
        with trio.CancelScope(shield=True):
            with contextlib.suppress(*_BROKEN):
                await self.stream.aclose()

    # -- calls -------------------------------------------------------------------

    async def start_call(self, path: str, payload: bytes, timeout_s: float | None, metadata: bytes = b"") -> Call:
        """Open a stream and send the request: HEADERS and as much DATA as the windows allow, one write;
        the rest as the engine's WINDOW_UPDATEs let it."""
        if self._left:
            self.reset_overdue_left_calls(trio.current_time())
        while True:
            call = self.open_call(path, payload, timeout_s, metadata)
            if call is not None:
                break
            # At most the engine's MAX_CONCURRENT_STREAMS at once: later calls wait for a stream to end.
            await self._stream_closed.wait()
        window_opened = self._window_opened  # taken now: the reader sets this one
        await self.flush()
        try:
            while call.pending_body:
                await window_opened.wait()
                self.send_more(call)
                window_opened = self._window_opened
                await self.flush()
        except BaseException:  # the caller left (or the call failed) half-way: the stream must not stay open
            with trio.CancelScope(shield=True):
                await self.cancel_call(call)
            raise
        return call

    async def consumed(self, call: Call) -> None:
        """Give the engine back the window of what the caller took (back-pressure follows the reader)."""
        self.consumed_now(call)
        if self._outbox:
            await self.flush()

    async def cancel_call(self, call: Call) -> None:
        if self.cancel(call):
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
        self._off_loop: OffLoopReader | None = None  # the reader thread, once a connection uses it

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
            reader = self._reader_thread() if not connection.tls else None
            if reader is not None:
                connection.read_off_loop(reader, self._nursery)
            else:
                self._nursery.start_soon(connection.read_loop)
            self._nursery.start_soon(connection.keep_alive)
            self._connections[target] = connection
            return connection

    def _reader_thread(self) -> "OffLoopReader | None":
        """The run's reader thread when engines are read off the loop (``H2Config.read_thread``)."""
        if self._off_loop is None and self.config.read_thread and off_loop_supported():
            self._off_loop = OffLoopReader.acquire()
        return self._off_loop

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
                    last_message: "Callable[[Any], bool] | None" = None,
                    metadata: "tuple[tuple[bytes, bytes], ...]" = (), merge_until_last: bool = False
                    ) -> "ServerStream":
        """A server stream: ``async with client.open_stream(...) as stream: async for batch in stream``.

        Batches are lists of messages that arrived together. Leaving the block before the stream
        ends cancels the call, unless the message read last is one ``last_message`` says ends
        the call: then the engine's own end is awaited. ``merge_until_last``: a batch's messages
        before its last are parsed as one message (protobuf reads concatenated messages as their
        merge: repeated fields appended, each scalar the last one set), for streams whose earlier
        messages add up that way.
        """
        fields = b"".join(h2f.literal_field(name, value) for name, value in metadata) if metadata else b""
        return ServerStream(self, target, method, request, timeout_s, response_type, last_message, fields,
                            merge_until_last)

    async def close_channel(self, target: str) -> None:
        connection = self._connections.pop(target, None)
        if connection is not None:
            await connection.aclose()

    async def aclose(self) -> None:
        for target in list(self._connections):
            await self.close_channel(target)
        if self._off_loop is not None:
            self._off_loop.release()
            self._off_loop = None


def _parse(response_type: Any, data: bytes) -> Any:
    try:
        return response_type.FromString(data)
    except Exception as e:  # protobuf's DecodeError, or anything a broken message raises
        raise EngineCallError("INTERNAL", f"cannot parse the engine's message: {e}") from None


def _parse_batch(response_type: Any, raw: "list[bytes]", merge_until_last: bool) -> list:
    """Messages that arrived together, parsed; with ``merge_until_last`` those before the last as one (a
    generation's token chunks when the gateway fell behind the engine: one parse and one event instead
    of one per token). Raises what FromString raises."""
    parse = response_type.FromString
    if merge_until_last and len(raw) > 2:
        return [parse(b"".join(raw[:-1])), parse(raw[-1])]
    return [parse(data) for data in raw]


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
                 "_received_at_start", "_metadata")

    def __init__(self, client: H2GrpcClient, target: str, method: str, request: Any,
                 timeout_s: float | None, metadata: bytes = b"") -> None:
        self._metadata = metadata
        self._client = client
        self._target = target
        self._method = method
        self._request = request
        self._timeout_s = timeout_s
        self.call: Call | None = None

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
            self.call = await connection.start_call(self._method, self._request.SerializeToString(), timeout_s,
                                                    self._metadata)
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
                    connection.leave(call, trio.current_time())
                else:
                    with trio.CancelScope(shield=True):
                        await connection.cancel_call(call)


class ServerStream(_OpenCall):
    """A call answered by a stream of messages, read as lists of those that arrived together."""

    __slots__ = ("_response_type", "_last_message", "_merge_until_last")

    def __init__(self, client: H2GrpcClient, target: str, method: str, request: Any, timeout_s: float | None,
                 response_type: Any, last_message: "Callable[[Any], bool] | None", metadata: bytes = b"",
                 merge_until_last: bool = False) -> None:
        super().__init__(client, target, method, request, timeout_s, metadata)
        self._response_type = response_type
        self._last_message = last_message
        self._merge_until_last = merge_until_last

    def __aiter__(self) -> "ServerStream":
        return self

    async def __anext__(self) -> list:
        call = self.call
        while True:
            if call.messages:
                call.nudged = False
                raw, call.messages = call.messages, []
                await self.connection.consumed(call)
                try:
                    batch = _parse_batch(self._response_type, raw, self._merge_until_last)
                except Exception:
                    batch = [_parse(self._response_type, data) for data in raw]  # raises, naming the bad one
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
            batch = _parse_batch(self._response_type, raw, self._merge_until_last)
        except Exception:  # the reader parses it again and fails the call
            return None
        if self._last_message is not None and self._last_message(batch[-1]):
            return None
        call.messages = []
        self.connection.consumed_now(call)  # the reading task flushes the queue after its listeners
        return batch


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--engine-keepalive-interval-secs", "engine_h2.keepalive_interval_s", float, "PING an engine connection "
           "with open calls after this long without a byte from it; 0 turns keepalive off", "engines"),
    Option("--engine-keepalive-timeout-secs", "engine_h2.keepalive_timeout_s", float, "drop the connection (its "
           "calls fail as retryable) when nothing answers the PING within this", "engines"),
    Option("--engine-read-thread", "engine_h2.read_thread", "bool", "read engine connections (plain gRPC) with "
           "one thread that runs while the event loop waits, instead of a task each: a token that arrives alone "
           "costs no pass of the loop's scheduler (paced streams at low concurrency)", "performance"),
)

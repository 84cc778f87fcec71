"""The one bridge between trio and grpcio. Nothing else in the gateway imports ``grpc``.

grpcio has no trio support; its async API (``grpc.aio``) is asyncio-only. A
thread per call costs ~3x the CPU per streamed message of native asyncio
(ARCHITECTURE.md, design notes), so the bridge runs one asyncio loop on one dedicated
thread, owns every channel there (one per engine target: connections are
reused), and trio tasks talk to it through two thread-safe hand-offs:

* trio -> asyncio: ``asyncio.run_coroutine_threadsafe`` / ``call_soon_threadsafe``;
* asyncio -> trio: ``TrioToken.run_sync_soon``.

Streams are batched across the hand-off: the asyncio side appends every
message it reads to a pending list and schedules at most one wake-up of the
trio side until the trio side has taken the list, so tokens that arrive
together cross together. Back-pressure: once ``window_messages`` messages sit
unconsumed, the asyncio side stops reading the call (gRPC flow control then
pushes back on the engine) until the trio side drains them.

Cancellation: leaving a stream's context early, or cancelling a trio task
waiting on a call, cancels the gRPC call on the asyncio side.

Errors: every failure of a call surfaces as ``EngineCallError`` with the gRPC
status code's name; mapping to HTTP happens at the API boundary, not here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import trio

from .engine_tls import EngineTlsConfig, grpc_credentials, split_target
from .errors import EngineCallError

# Prompts travel as token ids (4-5 bytes each on the wire): 64 MiB allows any
# context a real model has while still bounding what an engine can send us.
GRPC_MESSAGE_BYTES_MAX = 64 * 1024 * 1024
# Unconsumed messages per stream before the bridge stops reading the call.
STREAM_WINDOW_MESSAGES = 512

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
    # Notice a dead engine on an idle connection within ~30 s instead of at the next request.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # One TCP connection per engine, shared by every call (HTTP/2 multiplexes them).
    ("grpc.use_local_subchannel_pool", 1),
]


def _to_call_error(exc: BaseException) -> EngineCallError:
    if isinstance(exc, grpc.aio.AioRpcError):
        return EngineCallError(exc.code().name, exc.details() or "")
    if isinstance(exc, (asyncio.CancelledError, concurrent.futures.CancelledError)):
        return EngineCallError("CANCELLED", "call cancelled")
    return EngineCallError("INTERNAL", f"{type(exc).__name__}: {exc}")


class GrpcBridge:
    """One asyncio loop thread holding the gRPC channels of every engine."""

    def __init__(self, tls: EngineTlsConfig = EngineTlsConfig()) -> None:
        self._tls = tls
        self._loop = asyncio.new_event_loop()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._callables: dict[tuple[str, str, str], Any] = {}
        self._thread = threading.Thread(target=self._run_loop, name="grpc-bridge", daemon=True)
        self._thread.start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    # -- loop-thread helpers (only ever called on the bridge thread) ------

    def _channel(self, target: str) -> grpc.aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            host, port, tls = split_target(target)
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            channel = grpc.aio.secure_channel(address, grpc_credentials(self._tls), options=_CHANNEL_OPTIONS) \
                if tls else grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
            self._channels[target] = channel
        return channel

    def _multicallable(self, kind: str, target: str, method: str, response_type: Any) -> Any:
        key = (kind, target, method)
        fn = self._callables.get(key)
        if fn is None:
            channel = self._channel(target)
            factory = channel.unary_unary if kind == "unary" else channel.unary_stream
            fn = factory(method, request_serializer=_serialize, response_deserializer=response_type.FromString)
            self._callables[key] = fn
        return fn

    async def _close_channel(self, target: str) -> None:
        channel = self._channels.pop(target, None)
        for key in [k for k in self._callables if k[1] == target]:
            del self._callables[key]
        if channel is not None:
            await channel.close(grace=None)

    # -- trio-side API ---------------------------------------------------

    async def _await_on_loop(self, coro_fn: Callable[[], Any]) -> Any:
        """Run coro_fn() on the bridge loop and wait for it from trio, cancellably."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        future = asyncio.run_coroutine_threadsafe(coro_fn(), self._loop)

        def wake(_: concurrent.futures.Future) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future.add_done_callback(wake)
        try:
            await done.wait()
        except BaseException:
            future.cancel()  # thread-safe: cancels the asyncio task, which cancels the RPC
            raise
        try:
            return future.result()
        except EngineCallError:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure maps to one error type
            raise _to_call_error(exc) from None

    async def unary(self, target: str, method: str, request: Any, response_type: Any,
                    timeout_s: float | None) -> Any:
        """One request, one response. Raises EngineCallError."""

        async def call() -> Any:
            fn = self._multicallable("unary", target, method, response_type)
            return await fn(request, timeout=timeout_s)

        return await self._await_on_loop(call)

    @contextlib.asynccontextmanager
    async def open_stream(self, target: str, method: str, request: Any, response_type: Any,
                          timeout_s: float | None, window_messages: int = STREAM_WINDOW_MESSAGES,
                          last_message: "Callable[[Any], bool] | None" = None,
                          metadata: "tuple[tuple[bytes, bytes], ...]" = (), merge_until_last: bool = False
                          ) -> AsyncIterator["ServerStream"]:
        """A server stream whose batches are read with ``async for batch in stream``.

        Leaving the block before the stream ends cancels the call (``last_message`` and ``merge_until_last``
        are accepted for the H2 client's interface; grpcio decides itself what leaving a call sends, and
        hands over messages parsed one by one).
        """
        stream = ServerStream(self, window_messages)
        stream._start(target, method, request, response_type, timeout_s,
                      tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in metadata))
        try:
            yield stream
        finally:
            stream._cancel()

    async def close_channel(self, target: str) -> None:
        """Drop the connection to an engine that was removed."""
        await self._await_on_loop(lambda: self._close_channel(target))

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self.close)

    def close(self) -> None:
        """Close every channel and stop the loop thread. Blocking; call once at shutdown."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            for target in list(self._channels):
                await self._close_channel(target)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


class ServerStream:
    """The trio end of one server-streaming call. Iterate it for lists of messages."""

    def __init__(self, bridge: GrpcBridge, window_messages: int) -> None:
        self._bridge = bridge
        self._window = window_messages
        self._token = trio.lowlevel.current_trio_token()
        self._lock = threading.Lock()
        # Shared between the threads, guarded by _lock:
        self._pending: list[Any] = []
        self._finished = False
        self._error: EngineCallError | None = None
        self._wake_scheduled = False
        self._producer_waiting = False
        # trio side:
        self._ready = trio.Event()
        # asyncio side:
        self._credit: asyncio.Event | None = None
        self._future: concurrent.futures.Future | None = None

    # -- asyncio side ----------------------------------------------------

    def _start(self, target: str, method: str, request: Any, response_type: Any, timeout_s: float | None,
               metadata: "tuple[tuple[str, str], ...]" = ()) -> None:
        self._future = asyncio.run_coroutine_threadsafe(
            self._pump(target, method, request, response_type, timeout_s, metadata), self._bridge._loop)

    async def _pump(self, target: str, method: str, request: Any, response_type: Any, timeout_s: float | None,
                    metadata: "tuple[tuple[str, str], ...]" = ()) -> None:
        self._credit = asyncio.Event()
        call = None
        error: EngineCallError | None = None
        try:
            fn = self._bridge._multicallable("stream", target, method, response_type)
            call = fn(request, timeout=timeout_s, metadata=metadata or None)
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    break
                with self._lock:
                    self._pending.append(message)
                    schedule = not self._wake_scheduled
                    self._wake_scheduled = True
                    full = len(self._pending) >= self._window
                    if full:
                        self._producer_waiting = True
                        self._credit.clear()
                if schedule:
                    self._notify()
                if full:
                    await self._credit.wait()
        except asyncio.CancelledError:
            if call is not None:
                call.cancel()
            error = EngineCallError("CANCELLED", "stream cancelled")
        except BaseException as exc:  # noqa: BLE001 - every failure maps to one error type
            error = _to_call_error(exc)
        with self._lock:
            self._finished = True
            self._error = error
            schedule = not self._wake_scheduled
            self._wake_scheduled = True
        if schedule:
            self._notify()

    def _notify(self) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._set_ready)

    def _set_ready(self) -> None:
        # Runs on the trio thread, so it sets whichever event the reader waits on now.
        self._ready.set()

    # -- trio side -------------------------------------------------------

    def __aiter__(self) -> "ServerStream":
        return self

    async def __anext__(self) -> list[Any]:
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
                finished, error = self._finished, self._error
                self._wake_scheduled = False
                release = self._producer_waiting and bool(batch)
                self._producer_waiting = self._producer_waiting and not release
                if not batch and not finished:
                    self._ready = trio.Event()
            if release:
                self._bridge._loop.call_soon_threadsafe(self._credit.set)
            if batch:
                return batch
            if finished:
                if error is not None:
                    raise error
                raise StopAsyncIteration
            await self._ready.wait()

    def _cancel(self) -> None:
        with self._lock:
            finished = self._finished
        if not finished and self._future is not None:
            self._future.cancel()

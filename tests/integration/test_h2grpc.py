"""The h2 gRPC client against a real simulated engine (grpcio's server) and against misbehaving peers."""

from __future__ import annotations

import dataclasses
import gc
import threading

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
import pytest
import trio
import trio.testing
from smg_grpc_proto.generated import common_pb2, sglang_scheduler_pb2 as sg
from trio._core._run_context import GLOBAL_RUN_CONTEXT  # the loop's I/O manager, whose class the reader lends

from chaos.processes import EngineProcess
from gateway.engine import http2_frames as h2f
from gateway.engine.errors import EngineCallError
from gateway.engine.grpc_engine import GrpcEngineClient, SamplingOptions
from gateway.engine.engine_tls import EngineTlsConfig
from gateway.engine.h2grpc import H2Config, H2GrpcClient

SERVICE = "/sglang.grpc.scheduler.SglangScheduler"


@pytest.fixture(autouse=True, params=["task", "thread"])
def read_by(request, monkeypatch):
    """Every test twice: each connection read by a task of its own, and by the loop's reader thread
    (``H2Config.read_thread``, off_loop.py)."""
    make = H2GrpcClient.__init__

    def made_reading_by(self, nursery, tls=EngineTlsConfig(), config=H2Config()):
        make(self, nursery, tls, dataclasses.replace(config, read_thread=request.param == "thread"))

    monkeypatch.setattr(H2GrpcClient, "__init__", made_reading_by)
    return request.param


@pytest.fixture
def engine(log_dir):
    process = EngineProcess(["--zero-cost"], log_dir, "h2-engine")
    yield process
    process.stop()


async def test_calls_streams_errors_and_cancellation(engine, nursery):
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, engine.target, "sglang")
    info = await engine_client.model_info(5)
    assert info.served_model_name

    # A 30,000-token prompt is ~150 KB: more than HTTP/2's initial 64 KB window, so it crosses in
    # several windows.
    async with engine_client.generate("big", list(range(1000, 31000)), SamplingOptions(max_new_tokens=3),
                                      False, 30) as batches:
        events = []
        async for batch in batches:
            events += batch
    assert events[-1].prompt_tokens == 30000 and events[-1].completion_tokens == 3

    # Streamed: every token arrives, in order.
    async with engine_client.generate("s", [1, 2, 3], SamplingOptions(max_new_tokens=40, ignore_eos=True),
                                      True, 30) as batches:
        tokens: list[int] = []
        async for batch in batches:
            for event in batch:
                tokens += event.token_ids
    assert len(tokens) == 40

    # Leaving a stream early cancels it (RST_STREAM): nothing stays open on the connection.
    async with engine_client.generate("early", [1, 2, 3], SamplingOptions(max_new_tokens=10_000, ignore_eos=True),
                                      True, 30) as batches:
        async for _ in batches:
            break
    connection = client._connections[engine.target]
    assert not connection.calls and connection.alive

    with pytest.raises(EngineCallError) as error:
        await client.unary(engine.target, SERVICE + "/NoSuchMethod", common_pb2.KvEventBatch(),
                           sg.GetModelInfoResponse, 5)
    assert error.value.code == "UNIMPLEMENTED"
    assert (await engine_client.model_info(5)).served_model_name == info.served_model_name  # still usable
    await client.aclose()


async def test_engine_dying_mid_stream_fails_the_call_as_unavailable(engine, nursery):
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, engine.target, "sglang")
    with pytest.raises(EngineCallError) as error:
        async with engine_client.generate("long", [1, 2, 3], SamplingOptions(max_new_tokens=1_000_000,
                                                                             ignore_eos=True), True, 60) as batches:
            killed = False
            async for _ in batches:
                if not killed:
                    engine.kill()
                    killed = True
    assert error.value.code == "UNAVAILABLE" and error.value.retryable
    await client.aclose()


@pytest.fixture
def paced_engine(log_dir):
    """An engine that sends a token every 2 ms: its messages arrive while the caller waits for them."""
    process = EngineProcess(["--itl-base-s", "0.002", "--itl-per-running-s", "0"], log_dir, "h2-paced-engine")
    yield process
    process.stop()


async def _stream_tokens(engine_client, request_id, on_batch=None, listener_for=None):
    """Every token of a 60-token generation, in order, each with who handed it over; the last batch too."""
    seen: list[tuple[str, int]] = []
    last_batch = None
    async with engine_client.generate(request_id, [1, 2, 3], SamplingOptions(max_new_tokens=60, ignore_eos=True),
                                      True, 30) as batches:
        if listener_for is not None:
            assert batches.listen(listener_for(batches, seen))
        async for batch in batches:
            if on_batch is not None:
                on_batch(batch)
            seen += [("caller", token) for event in batch for token in event.token_ids]
            last_batch = batch or last_batch
    return seen, last_batch


def _taking_listener(answer=True):
    def make(batches, seen):
        def listener():
            events = batches.take_now()
            if events is None:
                return False
            seen.extend(("listener", token) for event in events for token in event.token_ids)
            return answer
        return listener
    return make


async def test_a_listener_takes_what_arrives_while_the_caller_waits_and_leaves_it_the_end(paced_engine, nursery):
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, paced_engine.target, "sglang")
    reference, _ = await _stream_tokens(engine_client, "plain")
    seen, last_batch = await _stream_tokens(engine_client, "heard", listener_for=_taking_listener())
    assert [token for _, token in seen] == [token for _, token in reference]  # the same tokens, in order
    # The first token arrives while the caller waits for it: the listener's, as are most after it.
    assert seen[0][0] == "listener"
    # The call's last message (its finish) is never the listener's: the caller reads the end itself.
    assert last_batch[-1].finish_reason == "length"
    connection = client._connections[paced_engine.target]
    assert not connection.calls and connection.alive
    await client.aclose()


async def test_read_by_the_thread_a_paced_token_is_handed_over_without_a_task(paced_engine, nursery, read_by):
    """Off the loop, the listener runs on the reader thread while the loop waits; the caller's task reads only
    the end. Closing the client stops the thread and gives the loop its own I/O manager back."""
    if read_by != "thread":
        pytest.skip("the reader thread's own behaviour")
    manager = GLOBAL_RUN_CONTEXT.runner.io_manager
    manager_class = type(manager)
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, paced_engine.target, "sglang")
    threads: set[str] = set()

    def noting_thread(batches, seen):
        listener = _taking_listener()(batches, seen)

        def on_arrival():
            threads.add(threading.current_thread().name)
            return listener()
        return on_arrival

    seen, last_batch = await _stream_tokens(engine_client, "threaded", listener_for=noting_thread)
    assert len(seen) == 60 and last_batch[-1].finish_reason == "length"
    assert threads == {"smg-engine-reader"}
    assert sum(who == "listener" for who, _ in seen) >= 30  # most tokens never reached the caller's task
    reader = client._off_loop
    assert reader.callbacks >= 30 and reader._handlers and type(manager) is not manager_class  # the loop lock
    await client.aclose()
    assert not reader._handlers and not reader._thread.is_alive()
    assert not any(thread.name == "smg-engine-reader" for thread in threading.enumerate())
    assert type(manager) is manager_class


async def test_a_listener_that_needs_the_caller_wakes_it_with_an_empty_batch(paced_engine, nursery):
    """Returning False after taking messages: the caller's next batch is [] (nothing left for it to
    read), then the call goes on as before."""
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, paced_engine.target, "sglang")
    reference, _ = await _stream_tokens(engine_client, "plain")
    empty_batches = []
    seen, _ = await _stream_tokens(engine_client, "nudging", on_batch=lambda b: empty_batches.append(not b),
                                   listener_for=_taking_listener(answer=False))
    assert [token for _, token in seen] == [token for _, token in reference]
    assert any(empty_batches) and any(who == "listener" for who, _ in seen)
    await client.aclose()


async def test_a_failing_listener_fails_only_its_own_call(paced_engine, nursery):
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, paced_engine.target, "sglang")

    def broken(batches, seen):
        def listener():
            raise RuntimeError("a bug in the caller's listener")
        return listener

    with pytest.raises(EngineCallError) as error:
        await _stream_tokens(engine_client, "broken", listener_for=broken)
    assert error.value.code == "INTERNAL"
    seen, last_batch = await _stream_tokens(engine_client, "after")  # the connection serves on
    assert len(seen) == 60 and last_batch[-1].finish_reason == "length"
    await client.aclose()


async def test_refused_and_silent_peers(nursery):
    client = H2GrpcClient(nursery)
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    silent_port = listener.socket.getsockname()[1]
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        refused_port = probe.getsockname()[1]  # bound, never listening: connections are refused

        with pytest.raises(EngineCallError) as error:
            await client.unary(f"127.0.0.1:{refused_port}", SERVICE + "/GetModelInfo",
                               sg.GetModelInfoRequest(), sg.GetModelInfoResponse, 5)
        assert error.value.code == "UNAVAILABLE"

    accepted = []

    async def accept_and_say_nothing():
        stream = await listener.accept()
        accepted.append(stream)
        while await stream.receive_some(65536):
            pass

    nursery.start_soon(accept_and_say_nothing)
    target = f"127.0.0.1:{silent_port}"
    with pytest.raises(EngineCallError) as error:
        await client.unary(target, SERVICE + "/GetModelInfo", sg.GetModelInfoRequest(), sg.GetModelInfoResponse,
                           0.3)
    assert error.value.code == "DEADLINE_EXCEEDED"
    # Nothing at all came back on that connection: it is dropped, the next call starts afresh.
    assert not client._connections[target].alive
    await client.aclose()
    await listener.aclose()


async def test_the_connection_window_is_given_back_for_every_call(engine, nursery):
    """Regression: bytes of a call's last frames and of unary answers were never credited back, so
    the connection's receive window ran dry after ~1,700 calls here (~800,000 with the 32 MiB
    window) and every later call waited for its deadline."""
    client = H2GrpcClient(nursery, config=H2Config(connection_window_bytes=70_000))  # credit: every 17,500 bytes
    engine_client = GrpcEngineClient(client, engine.target, "sglang")
    for i in range(2500):
        async with engine_client.generate(f"w{i}", [1, 2, 3], SamplingOptions(max_new_tokens=4, ignore_eos=True),
                                          i % 2 == 0, 5) as batches:
            async for _ in batches:
                pass
        if i % 100 == 0:
            await engine_client.model_info(5)
    connection = client._connections[engine.target]
    assert connection.alive and connection._received_uncredited_bytes <= 17_500
    await client.aclose()


async def test_two_large_prompts_waiting_for_the_same_window_both_go_through(engine, nursery):
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, engine.target, "sglang")
    done = []

    async def large(name):
        async with engine_client.generate(name, list(range(1000, 31000)), SamplingOptions(max_new_tokens=2), False,
                                          20) as batches:
            async for batch in batches:
                done.append((name, batch[-1].prompt_tokens))

    async with trio.open_nursery() as inner:
        for name in ("a", "b", "c"):
            inner.start_soon(large, name)
    assert sorted(done) == [("a", 30000), ("b", 30000), ("c", 30000)]
    await client.aclose()


# -- peers that are not grpcio: an independent HTTP/2 server (the h2 library) told how to answer -------------

def _grpc_message(message) -> bytes:
    data = message.SerializeToString()
    return b"\x00" + len(data).to_bytes(4, "big") + data


class ScriptedServer:
    """An HTTP/2 server written with h2 (not our framing) that answers each gRPC call with ``answer``.

    ``answer(connection, stream_id, serial)`` queues frames on the h2 connection and may return raw
    bytes to send after them (frames h2 would never make). ``serial`` counts calls across connections.
    """

    def __init__(self, answer, settings=None):
        self.answer = answer
        self.settings = settings or {}
        self.connections = 0
        self.calls = 0
        self.open_streams_max = 0
        self.received_errors: list[int] = []  # GOAWAY codes we were sent
        self.resets: list[tuple[int, int]] = []  # (stream id, error code) of each RST_STREAM we were sent
        self.pings_answered: list[bytes] = []
        self.pings_received = 0  # PINGs we were sent (h2 acknowledges them itself)

    async def serve(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        connection.initiate_connection()
        if self.settings:
            connection.update_settings(self.settings)
        await stream.send_all(connection.data_to_send())
        open_streams: set[int] = set()
        try:
            while data := await stream.receive_some(65536):
                raw = b""
                for event in connection.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        open_streams.add(event.stream_id)
                        self.open_streams_max = max(self.open_streams_max, len(open_streams))
                    elif isinstance(event, h2.events.DataReceived):
                        connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        self.calls += 1
                        raw += self.answer(connection, event.stream_id, self.calls) or b""
                        open_streams.discard(event.stream_id)
                    elif isinstance(event, h2.events.StreamReset):
                        open_streams.discard(event.stream_id)
                        self.resets.append((event.stream_id, event.error_code))
                    elif isinstance(event, h2.events.PingAckReceived):
                        self.pings_answered.append(event.ping_data)
                    elif isinstance(event, h2.events.PingReceived):
                        self.pings_received += 1
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        self.received_errors.append(event.error_code)
                await stream.send_all(connection.data_to_send() + raw)
        except (h2.exceptions.ProtocolError, trio.BrokenResourceError):
            pass

    async def __aenter__(self):
        self._listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.target = f"127.0.0.1:{self._listeners[0].socket.getsockname()[1]}"
        self._nursery_manager = trio.open_nursery()
        nursery = await self._nursery_manager.__aenter__()
        nursery.start_soon(trio.serve_listeners, self.serve, self._listeners)
        self._nursery = nursery
        return self

    async def __aexit__(self, *exc):
        self._nursery.cancel_scope.cancel()
        return await self._nursery_manager.__aexit__(*exc)


def _ok(connection, stream_id, message, pad=0, raw_trailers=False) -> bytes:
    connection.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    connection.send_data(stream_id, _grpc_message(message), pad_length=pad or None)
    if not raw_trailers:
        connection.send_headers(stream_id, [(b"grpc-status", b"0")], end_stream=True)
        return b""
    # Trailers in HEADERS + CONTINUATION (literal fields: h2's encoder table is left as it was).
    block = h2f.literal_field(b"grpc-status", b"0") + h2f.literal_field(b"x-note", b"n" * 40)
    connection._get_stream_by_id(stream_id).state_machine.process_input(h2.stream.StreamInputs.SEND_END_STREAM)
    return (h2f.frame(h2f.HEADERS, h2f.END_STREAM, stream_id, block[:10])  # END_STREAM rides on HEADERS
            + h2f.frame(h2f.CONTINUATION, 0, stream_id, block[10:30])
            + h2f.frame(h2f.CONTINUATION, h2f.END_HEADERS, stream_id, block[30:]))


INFO = sg.GetModelInfoResponse(served_model_name="scripted")


async def _info(client, target, timeout_s=5):
    return await client.unary(target, SERVICE + "/GetModelInfo", sg.GetModelInfoRequest(), sg.GetModelInfoResponse,
                              timeout_s)


async def test_what_other_servers_may_send_is_understood(nursery):
    """One stream at a time, a 100-byte window for our requests, pings, padding, split trailers."""
    def answer(connection, stream_id, serial):
        connection.ping(b"%08d" % serial)
        return _ok(connection, stream_id, INFO, pad=serial % 3 * 50, raw_trailers=serial % 2 == 0)

    settings = {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1, h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100}
    async with ScriptedServer(answer, settings) as server:
        client = H2GrpcClient(nursery)
        engine_client = GrpcEngineClient(client, server.target, "sglang")
        names = []

        async def one(i):
            if i % 2:
                names.append((await _info(client, server.target)).served_model_name)
            else:  # a request of ~4 KB through the 100-byte window (the server parses it as an empty request)
                request = engine_client.runtime.generate_request(f"r{i}", list(range(2000)), SamplingOptions(1),
                                                                 False)
                assert request.ByteSize() > 3000
                response = await client.unary(server.target, SERVICE + "/GetModelInfo", request,
                                              sg.GetModelInfoResponse, 5)
                names.append(response.served_model_name)

        async with trio.open_nursery() as inner:
            for i in range(6):
                inner.start_soon(one, i)
        assert names == ["scripted"] * 6
        assert server.open_streams_max == 1 and server.connections == 1
        await trio.testing.wait_all_tasks_blocked()  # the last acknowledgement may still be on its way
        assert sorted(server.pings_answered) == [b"%08d" % serial for serial in range(1, 7)]
        await client.aclose()


async def test_goaway_and_refused_streams_fail_calls_as_retryable(nursery):
    def answer(connection, stream_id, serial):
        if serial == 1:
            connection.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        elif serial == 2:
            _ok(connection, stream_id, INFO)
        elif serial == 3:
            connection.close_connection(last_stream_id=stream_id - 2)  # this call was not taken
        else:
            _ok(connection, stream_id, INFO)

    async with ScriptedServer(answer) as server:
        client = H2GrpcClient(nursery)
        for expected in ("UNAVAILABLE", None, "UNAVAILABLE", None):
            try:
                await _info(client, server.target)
                code = None
            except EngineCallError as e:
                code = e.code
                assert e.retryable
            assert code == expected
        assert server.connections == 2  # after GOAWAY, a new connection
        await client.aclose()


@pytest.mark.parametrize("violation", ["data on stream 0", "headers on a stream never opened", "oversized frame",
                                       "push promise", "not http/2"])
async def test_a_peer_breaking_the_protocol_gets_goaway_and_calls_fail_as_unavailable(nursery, violation):
    def answer(connection, stream_id, serial):
        if violation == "data on stream 0":
            return h2f.frame(h2f.DATA, 0, 0, b"x")
        if violation == "headers on a stream never opened":
            return h2f.frame(h2f.HEADERS, h2f.END_HEADERS, stream_id + 2, h2f.literal_field(b":status", b"200"))
        if violation == "oversized frame":
            return h2f.frame(h2f.DATA, 0, stream_id, b"x" * (H2Config().receive_frame_bytes + 1))
        return h2f.frame(h2f.PUSH_PROMISE, h2f.END_HEADERS, stream_id, b"\x00\x00\x00\x02\x82")

    if violation == "not http/2":
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]

        async def http1(stream):
            await stream.receive_some(65536)
            await stream.send_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            while await stream.receive_some(65536):  # open until the client leaves, as a server would be
                pass

        nursery.start_soon(trio.serve_listeners, http1, [listener])
        target = f"127.0.0.1:{listener.socket.getsockname()[1]}"
        client = H2GrpcClient(nursery)
        with pytest.raises(EngineCallError) as error:
            await _info(client, target)
        assert error.value.code == "UNAVAILABLE" and "HTTP/2" in str(error.value)
        return
    async with ScriptedServer(answer) as server:
        client = H2GrpcClient(nursery)
        with pytest.raises(EngineCallError) as error:
            await _info(client, server.target)
        assert error.value.code == "UNAVAILABLE"
        await trio.testing.wait_all_tasks_blocked()
        if violation != "oversized frame":  # (that server is still writing its frame when we close)
            assert server.received_errors and server.received_errors[0] != 0
        await client.aclose()


class _SpawnedTasks(trio.abc.Instrument):
    def __init__(self):
        self.names: list[str] = []

    def task_spawned(self, task):
        self.names.append(task.name)


async def test_leaving_a_stream_early_closes_its_generators_without_finalizer_tasks(engine, nursery):
    """trio finalizes an abandoned async generator by spawning a task: that cost two per streamed request."""
    client = H2GrpcClient(nursery)
    engine_client = GrpcEngineClient(client, engine.target, "sglang")
    await engine_client.model_info(5)  # the connection and its reader exist before we count
    spawned = _SpawnedTasks()
    trio.lowlevel.add_instrument(spawned)
    try:
        for i in range(5):
            async with engine_client.generate(f"e{i}", [1, 2, 3], SamplingOptions(max_new_tokens=50, ignore_eos=True),
                                              True, 10) as batches:
                async for _ in batches:
                    break  # as a request that matched a stop string does
        gc.collect()
        await trio.testing.wait_all_tasks_blocked()
    finally:
        trio.lowlevel.remove_instrument(spawned)
    assert not [name for name in spawned.names if "asyncgen" in name], spawned.names
    await client.aclose()


COMPLETE = sg.GenerateResponse(complete=sg.GenerateComplete(output_ids=[5, 6], finish_reason="stop"))


def _last_message_then(trailers_when):
    """Generate calls get their last message at once and their trailers when ``trailers_when(serial)``
    says so, at a later call's arrival (a pending end is sent before that call's answer), or never."""
    pending: list[int] = []

    def answer(connection, stream_id, serial):
        for waiting in [w for w in pending if trailers_when(serial)]:
            connection.send_headers(waiting, [(b"grpc-status", b"0")], end_stream=True)
            pending.remove(waiting)
        if serial % 2:  # odd calls are generations
            connection.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
            connection.send_data(stream_id, _grpc_message(COMPLETE))
            pending.append(stream_id)
        else:
            _ok(connection, stream_id, INFO)

    return answer


async def _generate_and_leave(engine_client, name):
    async with engine_client.generate(name, [1, 2, 3], SamplingOptions(max_new_tokens=2), False, 10) as batches:
        async for events in batches:
            assert events[-1].finish_reason == "stop"
            break  # as the gateway does once the last event is in


async def test_a_call_left_after_its_last_message_is_ended_by_the_engine_not_reset(nursery):
    """A reset after the answer is complete would run a real engine's cancellation path for nothing."""
    async with ScriptedServer(_last_message_then(lambda serial: True)) as server:
        client = H2GrpcClient(nursery)
        engine_client = GrpcEngineClient(client, server.target, "sglang")
        for i in range(3):
            await _generate_and_leave(engine_client, f"g{i}")  # its trailers are held back...
            connection = client._connections[server.target]
            assert len(connection.calls) == 1  # ...so the stream is still open, left
            assert (await _info(client, server.target)).served_model_name == "scripted"  # ...until now
            await trio.testing.wait_all_tasks_blocked()
            assert not connection.calls
        assert server.resets == []
        await client.aclose()


async def test_a_left_call_the_engine_never_ends_is_reset_after_the_grace(nursery):
    async with ScriptedServer(_last_message_then(lambda serial: False)) as server:
        client = H2GrpcClient(nursery, config=H2Config(left_call_grace_s=0.0))
        engine_client = GrpcEngineClient(client, server.target, "sglang")
        await _generate_and_leave(engine_client, "g")
        assert server.resets == []
        assert (await _info(client, server.target)).served_model_name == "scripted"  # the next call resets it
        await trio.testing.wait_all_tasks_blocked()
        assert server.resets == [(1, h2.errors.ErrorCodes.CANCEL)]
        assert not client._connections[server.target].calls
        await client.aclose()


async def test_a_call_left_before_its_last_message_is_reset_at_once(nursery):
    def answer(connection, stream_id, serial):
        connection.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        chunk = sg.GenerateResponse(chunk=sg.GenerateStreamChunk(token_ids=[5]))
        connection.send_data(stream_id, _grpc_message(chunk))  # more would follow: the engine is generating

    async with ScriptedServer(answer) as server:
        client = H2GrpcClient(nursery)
        engine_client = GrpcEngineClient(client, server.target, "sglang")
        async with engine_client.generate("g", [1, 2, 3], SamplingOptions(max_new_tokens=50), True, 10) as batches:
            async for _ in batches:
                break  # as a request that matched a stop string does
        await trio.testing.wait_all_tasks_blocked()  # the reset was written as the block was left
        assert server.resets == [(1, h2.errors.ErrorCodes.CANCEL)]
        await client.aclose()


# -- keepalive and closing -------------------------------------------------------------------------

KEEPALIVE = H2Config(keepalive_interval_s=0.2, keepalive_timeout_s=0.3)


async def _open_silent_stream(client, target):
    """A server stream with no deadline (as SubscribeKvEvents is): it waits for as long as nothing comes."""
    async with client.open_stream(target, SERVICE + "/SubscribeKvEvents", sg.GetModelInfoRequest(),
                                  common_pb2.KvEventBatch, None) as stream:
        async for _ in stream:
            pass


async def test_a_half_open_connection_is_found_by_keepalive_and_its_calls_fail_as_retryable(nursery):
    """The engine's host vanishes without a FIN or RST: nothing more arrives, not even PING ACKs."""
    async def black_hole(stream):
        with trio.CancelScope() as scope:
            while await stream.receive_some(65536):
                pass  # read everything, answer nothing
            scope.cancel()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, black_hole, listeners)
    target = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    client = H2GrpcClient(nursery, config=KEEPALIVE)
    started = trio.current_time()
    with trio.fail_after(10), pytest.raises(EngineCallError) as error:
        await _open_silent_stream(client, target)
    assert error.value.code == "UNAVAILABLE" and error.value.retryable and "keepalive" in error.value.details
    assert trio.current_time() - started >= KEEPALIVE.keepalive_interval_s + KEEPALIVE.keepalive_timeout_s
    await client.aclose()


async def test_a_silent_but_live_engine_answers_the_pings_and_the_call_stays_open(nursery):
    def headers_only(connection, stream_id, serial):
        connection.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])

    async with ScriptedServer(headers_only) as server:
        client = H2GrpcClient(nursery, config=KEEPALIVE)
        with trio.move_on_after(1.5) as waited:
            await _open_silent_stream(client, server.target)
        assert waited.cancelled_caught, "the call stayed open until we left it"
        assert server.pings_received >= 2
        assert client._connections[server.target].alive
        await client.aclose()


async def test_no_pings_while_no_call_is_open(nursery):
    async with ScriptedServer(lambda connection, stream_id, serial: _ok(connection, stream_id, INFO)) as server:
        client = H2GrpcClient(nursery, config=KEEPALIVE)
        assert (await _info(client, server.target)).served_model_name == "scripted"
        await trio.sleep(1.0)
        assert server.pings_received == 0 and client._connections[server.target].alive
        await client.aclose()


async def test_closing_says_goaway_first(nursery):
    async with ScriptedServer(lambda connection, stream_id, serial: _ok(connection, stream_id, INFO)) as server:
        client = H2GrpcClient(nursery)
        assert (await _info(client, server.target)).served_model_name == "scripted"
        await client.aclose()
        with trio.fail_after(5):
            while not server.received_errors:
                await trio.sleep(0.01)
        assert server.received_errors == [h2.errors.ErrorCodes.NO_ERROR]

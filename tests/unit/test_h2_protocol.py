"""The HTTP/2 client protocol (gateway/engine/h2_protocol.py) in memory, against h2's server, on passed-in time.

No socket, no event loop: the client's queued frames go to an ``h2.connection.H2Connection`` in
server mode, its answers come back through ``receive``, and time is a number the test chooses.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

from gateway.engine import http2_frames as h2f
from gateway.engine.h2_protocol import (
    GRPC_MESSAGE_BYTES_MAX,
    STREAM_MOVES,
    Call,
    H2ClientProtocol,
    H2Config,
    KeepaliveAction,
    KeepaliveRule,
    StreamEvent,
    StreamState,
)

PATH = "/sglang.grpc.scheduler.SglangScheduler/Generate"


class Flag:
    """A stand-in for trio.Event: the protocol only sets and reads it."""

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True

    def is_set(self) -> bool:
        return self.value


def grpc_message(data: bytes) -> bytes:
    return b"\x00" + len(data).to_bytes(4, "big") + data


class Pair:
    """A client protocol and h2's server, wired in memory."""

    def __init__(self, config: H2Config = H2Config(), server_settings: "dict | None" = None) -> None:
        self.client = H2ClientProtocol("engine:1", config, Flag)
        self.server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.server.initiate_connection()
        if server_settings:
            self.server.update_settings(server_settings)
        self.client.start()
        self.events: list = []
        self.exchange()

    def exchange(self) -> list:
        """Deliver what each side queued until both are quiet; the server's events, in order."""
        new: list = []
        while True:
            to_server = self.client.data_to_send()
            if to_server:
                new += self.server.receive_data(to_server)
            to_client = self.server.data_to_send()
            if to_client:
                assert self.client.receive(to_client) is None
            if not to_server and not to_client:
                break
        self.events += new
        return new

    def request(self, stream_id: int) -> tuple[dict, bytes]:
        headers = next(dict(e.headers) for e in self.events if isinstance(e, h2.events.RequestReceived)
                       and e.stream_id == stream_id)
        body = b"".join(e.data for e in self.events if isinstance(e, h2.events.DataReceived) and e.stream_id == stream_id)
        return headers, body

    def answer(self, stream_id: int, messages: "list[bytes]", status: int = 0, message: bytes = b"") -> None:
        self.server.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        for m in messages:
            self.server.send_data(stream_id, grpc_message(m))
        trailers = [(b"grpc-status", str(status).encode())] + ([(b"grpc-message", message)] if message else [])
        self.server.send_headers(stream_id, trailers, end_stream=True)
        self.exchange()


def test_a_unary_call_end_to_end_and_its_stream_states():
    pair = Pair()
    call = pair.client.open_call(PATH, b"request", 5.0)
    assert call.state is StreamState.HALF_CLOSED_LOCAL  # the whole request went out with END_STREAM
    pair.exchange()
    headers, body = pair.request(call.stream_id)
    assert headers[b":path"] == PATH.encode() and headers[b"content-type"] == b"application/grpc"
    assert headers[b"te"] == b"trailers" and headers[b"grpc-timeout"] == b"5000m"
    assert body == grpc_message(b"request")
    pair.answer(call.stream_id, [b"one", b"two"])
    assert call.finished and call.error is None and call.messages == [b"one", b"two"]
    assert call.state is StreamState.CLOSED and not pair.client.calls and call.changed.is_set()


def test_an_error_status_becomes_the_engines_error():
    pair = Pair()
    call = pair.client.open_call(PATH, b"x", None)
    pair.exchange()
    pair.answer(call.stream_id, [], status=5, message=b"no%20such%20model")
    assert call.error.code == "NOT_FOUND" and call.error.details == "no such model"


def test_a_large_request_waits_for_the_engines_window_then_goes_on():
    pair = Pair(server_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10_000})
    payload = b"p" * 30_000
    call = pair.client.open_call(PATH, payload, None)
    assert call.state is StreamState.OPEN and len(call.pending_body) == 30_005 - 10_000
    pair.exchange()
    received = sum(len(e.data) for e in pair.events if isinstance(e, h2.events.DataReceived))
    assert received == 10_000
    window_opened = pair.client._window_opened
    for e in pair.events:
        if isinstance(e, h2.events.DataReceived):
            pair.server.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
    pair.exchange()
    assert window_opened.is_set()  # a WINDOW_UPDATE arrived: the driver would wake and send more
    while call.pending_body:
        pair.client.send_more(call)
        pair.exchange()
        for e in [e for e in pair.events if isinstance(e, h2.events.DataReceived) and not getattr(e, "acked", 0)]:
            e.acked = 1
            pair.server.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        pair.exchange()
    assert pair.request(call.stream_id)[1] == grpc_message(payload) and call.state is StreamState.HALF_CLOSED_LOCAL


def test_the_engines_reset_fails_the_call_and_its_ping_is_acknowledged():
    pair = Pair()
    call = pair.client.open_call(PATH, b"x", None)
    pair.exchange()
    pair.server.reset_stream(call.stream_id, h2.errors.ErrorCodes.CANCEL)
    pair.server.ping(b"12345678")
    new = pair.exchange()
    assert call.error.code == "CANCELLED" and call.state is StreamState.CLOSED and not pair.client.calls
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678" for e in new)


def test_goaway_fails_the_calls_it_did_not_take_and_keeps_the_others():
    pair = Pair()
    first = pair.client.open_call(PATH, b"a", None)
    second = pair.client.open_call(PATH, b"b", None)
    pair.exchange()
    pair.server.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=first.stream_id)
    pair.exchange()
    assert not pair.client.accepting and pair.client.alive
    assert second.error.code == "UNAVAILABLE" and second.error.retryable and second.state is StreamState.CLOSED
    assert not first.finished and first.state is StreamState.HALF_CLOSED_LOCAL


def test_a_protocol_violation_is_answered_with_goaway_and_named():
    pair = Pair()
    reason = pair.client.receive(h2f.frame(h2f.DATA, 0, 2, b"x"))  # a stream the engine may not use
    assert reason is not None and "never opened" in reason
    events = pair.server.receive_data(pair.client.data_to_send())
    terminated = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert terminated and terminated[0].error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR


def test_a_call_left_after_its_last_message_is_reset_only_after_the_grace():
    pair = Pair(H2Config(left_call_grace_s=5.0))
    call = pair.client.open_call(PATH, b"x", None)
    pair.exchange()
    pair.client.leave(call, now=100.0)
    pair.client.reset_overdue_left_calls(now=104.9)
    assert not pair.exchange() and call.stream_id in pair.client.calls
    pair.client.reset_overdue_left_calls(now=105.0)
    resets = [e for e in pair.exchange() if isinstance(e, h2.events.StreamReset)]
    assert [(r.stream_id, r.error_code) for r in resets] == [(call.stream_id, h2.errors.ErrorCodes.CANCEL)]
    assert call.state is StreamState.CLOSED


def test_closing_sends_goaway_no_error():
    pair = Pair()
    pair.client.goaway()
    terminated = [e for e in pair.exchange() if isinstance(e, h2.events.ConnectionTerminated)]
    assert [(t.error_code, t.last_stream_id) for t in terminated] == [(h2.errors.ErrorCodes.NO_ERROR, 0)]


def test_more_calls_than_the_engine_allows_wait_for_a_stream_to_close():
    pair = Pair(server_settings={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1})
    first = pair.client.open_call(PATH, b"a", None)
    assert pair.client.open_call(PATH, b"b", None) is None
    stream_closed = pair.client._stream_closed
    pair.exchange()
    pair.answer(first.stream_id, [b"ok"])
    assert stream_closed.is_set() and pair.client.open_call(PATH, b"b", None) is not None


@pytest.mark.parametrize("cut", ["one frame", "a frame each", "split in three", "byte by byte"])
def test_a_calls_messages_are_the_same_however_data_frames_cut_them(cut):
    """DATA frames holding whole messages are cut straight from the frame; a message across frames waits in
    the buffer: both give the messages, in order, as bytes."""
    messages = [b"", b"a", b"x" * 300, b"tail"]
    wire = b"".join(grpc_message(m) for m in messages)
    if cut == "one frame":
        frames = [wire]
    elif cut == "a frame each":
        frames = [grpc_message(m) for m in messages]
    elif cut == "split in three":  # a frame ends inside a header, one inside a body, then the rest
        frames = [wire[:3], wire[3:100], wire[100:]]
    else:
        frames = [wire[i:i + 1] for i in range(len(wire))]
    call = Call(Flag)
    for frame in frames:
        call.feed(frame)
    assert call.messages == messages and all(type(m) is bytes for m in call.messages)
    assert not call.buffer and call.error is None


def test_a_message_over_the_bound_or_compressed_fails_the_call_on_either_path():
    for buffered in (False, True):
        too_large = Call(Flag)
        if buffered:
            too_large.feed(b"\x00")
        too_large.feed((b"" if buffered else b"\x00") + (GRPC_MESSAGE_BYTES_MAX + 1).to_bytes(4, "big"))
        assert too_large.error is not None and too_large.error.code == "RESOURCE_EXHAUSTED"
        compressed = Call(Flag)
        if buffered:
            compressed.feed(b"\x01\x00")
        compressed.feed((b"" if buffered else b"\x01\x00") + b"\x00\x00\x01x")
        assert compressed.error is not None and compressed.error.code == "INTERNAL" and not compressed.messages


def test_every_stream_move_is_in_the_table():
    assert STREAM_MOVES[StreamState.IDLE, StreamEvent.HEADERS_SENT] is StreamState.OPEN
    reachable = {StreamState.IDLE} | set(STREAM_MOVES.values())
    assert reachable == set(StreamState)
    assert all(state is not StreamState.CLOSED for state, _ in STREAM_MOVES)  # nothing leaves CLOSED


@pytest.mark.parametrize("received, calls_open, expected", [
    ((0, 0), True, [KeepaliveAction.PING, KeepaliveAction.DROP]),  # silent with a call open: PING, then give up
    ((0, 17), True, [KeepaliveAction.PING, KeepaliveAction.NONE]),  # the ACK (any byte) arrived in time
    ((5, 9), True, [KeepaliveAction.NONE, KeepaliveAction.NONE]),  # busy: never PINGed
    ((0, 0), False, [KeepaliveAction.NONE, KeepaliveAction.NONE]),  # no call open: never PINGed
])
def test_keepalive_on_passed_in_time(received, calls_open, expected):
    rule = KeepaliveRule(interval_s=30.0, timeout_s=20.0, now=0.0)
    assert rule.next_check_at == 30.0
    first = rule.check(30.0, received[0], calls_open)
    second_at = rule.next_check_at
    second = rule.check(second_at, received[1], calls_open)
    assert [first, second] == expected
    assert second_at == (50.0 if first is KeepaliveAction.PING else 60.0)


def test_data_frames_padded_on_stream_zero_and_on_a_stream_left_take_their_paths():
    """_on_data finds an open call straight from the calls it holds and unpads only a padded frame; the rest still
    goes through the checks: DATA on stream 0 is a connection error, on a stream we left it is credited."""
    pair = Pair()
    call = pair.client.open_call(PATH, b"q", None)
    pair.exchange()
    pair.server.send_headers(call.stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    pair.exchange()
    message = grpc_message(b"token")
    padded = bytes([4]) + message + b"\x00" * 4  # pad length 4 (RFC 9113 6.1)
    assert pair.client.receive(h2f.frame(h2f.DATA, h2f.PADDED, call.stream_id, padded)) is None
    # 0x20 means nothing on DATA (no priority fields there): the payload is taken as it is.
    assert pair.client.receive(h2f.frame(h2f.DATA, h2f.PRIORITY_FLAG, call.stream_id, message)) is None
    assert call.messages == [b"token", b"token"] and call.error is None
    left = pair.client.open_call(PATH, b"r", None)
    pair.exchange()
    pair.client.cancel(left)
    assert pair.client.receive(h2f.frame(h2f.DATA, 0, left.stream_id, message)) is None  # credited, dropped
    assert left.messages == []
    reason = pair.client.receive(h2f.frame(h2f.DATA, 0, 0, message))
    assert reason is not None and "stream 0" in reason

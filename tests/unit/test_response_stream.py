"""A background response's stream (gateway/api/responses/stream_log.py): what its log stores and publishes, and a
resume served from the store, on virtual time, through a real ``Request`` over an ASGI send that records."""

from __future__ import annotations

import orjson
import pytest
import trio

from gateway.api.errors import BadRequest
from gateway.api.http import Request
from gateway.api.responses.stream_log import (RESUME_POLL_S, RESUME_READ_FAILURES_MAX, StreamLog, follow_log,
                                         follow_store, starting_after)
from gateway.history import StoredResponse, StoreUnavailable


def frame(kind: str, sequence: int, **fields) -> bytes:
    data = {"type": kind, "sequence_number": sequence, **fields}
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def test_the_stored_events_keep_a_prefix_within_their_bound_and_the_terminal_one():
    log = StreamLog(stored_bytes_max=3 * len(frame("response.output_text.delta", 0)))
    for n in range(6):
        log.append(n, "response.output_text.delta", frame("response.output_text.delta", n))
    log.append(6, "response.completed", frame("response.completed", 6))
    assert [sequence for sequence, _ in log.stored_events()] == [0, 1, 2, 6]  # the gap: 3-5
    assert not log.dirty and log.published == 6 and not log.ended  # the terminal event waits for end()
    log.end()
    assert log.published == 7 and log.ended
    with pytest.raises(ValueError):
        log.append(9, "response.output_text.delta", b"")


def test_starting_after():
    assert starting_after({}) == -1 and starting_after({"starting_after": "7"}) == 7
    for bad in ("-2", "x", "1.5"):
        with pytest.raises(BadRequest):
            starting_after({"starting_after": bad})


class Client:
    """The ASGI side of one request: what the gateway sent, and a connection that stays open."""

    def __init__(self) -> None:
        self.body = b""
        self.ended = False

    async def receive(self):
        await trio.sleep_forever()

    async def send(self, message) -> None:
        if message["type"] == "http.response.body":
            self.body += message["body"]
            self.ended = not message["more_body"]

    def sequence_numbers(self) -> list[tuple[str, int]]:
        events = [orjson.loads(part.split(b"data: ", 1)[1]) for part in self.body.split(b"\n\n") if part]
        return [(e["type"], e["sequence_number"]) for e in events]


def request(client: Client, nursery: trio.Nursery) -> Request:
    scope = {"method": "GET", "path": "/v1/responses/resp_1", "headers": []}
    return Request(scope, client.receive, client.send, "req-1", 1024, nursery)


def record(status: str, events: "list[tuple[int, bytes]]") -> StoredResponse:
    return StoredResponse("resp_1", "a", {"id": "resp_1", "status": status}, (), (),
                          events=tuple((n, f.decode()) for n, f in events))


DELTAS = [(n, frame("response.output_text.delta", n)) for n in range(6)]


async def test_a_resume_from_the_store_follows_it_to_the_end(autojump_clock):
    reads = iter([record("in_progress", DELTAS[:4]), record("in_progress", DELTAS[:4]),
                  record("completed", [*DELTAS, (6, frame("response.completed", 6))])])
    client = Client()
    async with trio.open_nursery() as nursery:
        started = trio.current_time()
        await follow_store(request(client, nursery), lambda: _next(reads), record("queued", DELTAS[:2]), 0)
        nursery.cancel_scope.cancel()
    assert client.sequence_numbers() == [("response.output_text.delta", n) for n in range(1, 6)] + \
        [("response.completed", 6)]
    assert client.ended and trio.current_time() - started == pytest.approx(3 * RESUME_POLL_S)


async def test_a_resume_of_an_abandoned_response_ends_with_response_failed(autojump_clock):
    # The generating node stopped: the record is shown failed, its stored events end without a terminal one.
    client = Client()
    async with trio.open_nursery() as nursery:
        await follow_store(request(client, nursery), None, record("failed", DELTAS[:3]), 1)
        nursery.cancel_scope.cancel()
    assert client.sequence_numbers() == [("response.output_text.delta", 2), ("response.failed", 3)]


async def test_a_store_that_stays_away_ends_the_resume_with_an_error_event(autojump_clock):
    async def unavailable():
        raise StoreUnavailable("peers away")

    client = Client()
    async with trio.open_nursery() as nursery:
        await follow_store(request(client, nursery), unavailable, record("in_progress", DELTAS[:2]), -1)
        nursery.cancel_scope.cancel()
    assert client.sequence_numbers() == [("response.output_text.delta", 0), ("response.output_text.delta", 1),
                                         ("error", 2)]
    assert trio.current_time() == pytest.approx(RESUME_READ_FAILURES_MAX * RESUME_POLL_S)


async def test_a_live_follower_gets_the_terminal_event_only_once_the_log_ends(autojump_clock):
    log = StreamLog(10_000)
    client = Client()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow_log, request(client, nursery), log, -1)
        for n, f in DELTAS:
            log.append(n, "response.output_text.delta", f)
            await trio.sleep(0.01)
        log.append(6, "response.completed", frame("response.completed", 6))
        await trio.sleep(1)
        assert client.sequence_numbers()[-1] == ("response.output_text.delta", 5) and not client.ended
        log.end()
        await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert client.sequence_numbers()[-1] == ("response.completed", 6) and client.ended


async def _next(reads):
    return next(reads)

"""A background response's stream (``background: true`` with ``stream: true``), kept so that a client that
drops can resume it on any node: ``GET /v1/responses/{id}?stream=true&starting_after=N``.

The node generating the response writes each event into the response's ``StreamLog``. The request that
created it, and a resume that reaches the same node, follow the log as it grows. The log's events are
stored with the response (``StoredResponse.events``) at each state change (queued, in progress, the end)
and, while the answer streams, at most ``FLUSH_INTERVAL_S`` apart: a resume on another node, or after
the generating node stopped, replays what the store holds and reads it again until the response ends.

Bounded: the stored events take at most a third of one stored record (``--history-record-max-bytes``;
a frame grows when stored as a JSON string). Past that a stream keeps its first events and its terminal
one, which carries the whole response: a resume inside the gap gets the terminal event only. The
generating node holds every event in memory while it runs (the answer bound limits them), for the
streams that follow it live.
"""

from __future__ import annotations

from typing import Any

import orjson
import trio

from ...base.errors import GatewayError
from ...history import StoredResponse
from ..errors import BadRequest
from ..http import SSE_HEADERS, Request

# The events that end a stream: their response is the final one.
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# New events reach the store at most this late while the answer streams: how far a resume on another
# node can lag the generating node, and what a node that stops loses of a stream (not of the answer).
FLUSH_INTERVAL_S = 0.5
# How often a resume served from the store reads it again for new events.
RESUME_POLL_S = 0.25
# Reads of the store that may fail in a row (about 5 s) before a resume ends with an error event.
RESUME_READ_FAILURES_MAX = 20
FINISHED = frozenset({"completed", "incomplete", "failed", "cancelled"})


def stored_events_bytes_max(record_bytes_max: int) -> int:
    return record_bytes_max // 3


class StreamLog:
    """One background response's events, in order (``frames[n]`` has sequence number n), and the part of
    them that is stored (within ``stored_bytes_max``, and the terminal event).

    The terminal event is published (``published``: what followers may send) only at ``end()``, once the
    final response is stored: a client that saw response.completed finds the response completed."""

    __slots__ = ("frames", "published", "stored_bytes_max", "_stored", "_stored_bytes", "_cut", "ended", "dirty",
                 "_changed")

    def __init__(self, stored_bytes_max: int) -> None:
        self.frames: list[bytes] = []
        self.published = 0
        self.stored_bytes_max = stored_bytes_max
        self._stored: list[tuple[int, str]] = []
        self._stored_bytes = 0
        self._cut = False  # an event was left out of the stored ones: only the terminal one joins them now
        self.ended = False
        self.dirty = False  # events not stored yet
        self._changed = trio.Event()

    def append(self, sequence: int, kind: str, frame: bytes) -> None:
        if sequence != len(self.frames):
            raise ValueError(f"event {sequence} after {len(self.frames)} events")
        self.frames.append(frame)
        terminal = kind in TERMINAL_EVENTS
        if terminal or (not self._cut and self._stored_bytes + len(frame) <= self.stored_bytes_max):
            self._stored.append((sequence, frame.decode()))
            self._stored_bytes += len(frame)
        else:
            self._cut = True
        self.dirty = True
        if not terminal:
            self.published = len(self.frames)
            self._wake()

    def end(self) -> None:
        """No more events: the final response is stored (or the response was cancelled, or its generation
        stopped). The terminal event, if any, goes out now."""
        self.published = len(self.frames)
        self.ended = True
        self._wake()

    def changed(self) -> trio.Event:
        """Set at the next event or at the end: take it before reading ``frames`` and nothing is missed."""
        return self._changed

    def stored_events(self) -> tuple[tuple[int, str], ...]:
        self.dirty = False
        return tuple(self._stored)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


def starting_after(query: dict[str, str]) -> int:
    """The ``starting_after`` of a resume: the sequence number after which to stream (-1: from the start)."""
    raw = query.get("starting_after")
    if raw is None or raw == "":
        return -1
    try:
        value = int(raw)
    except ValueError:
        value = -2
    if value < -1:
        raise BadRequest(f"Invalid 'starting_after': {raw[:40]!r}; expected a sequence number (an integer from 0)",
                         param="starting_after", code="invalid_value")
    return value


async def follow_log(request: Request, log: StreamLog, after: int) -> None:
    """Stream the log's events after sequence number ``after`` as they come, until its end or the client's."""
    sent = after + 1  # the next frame's index
    async with request.cancel_on_disconnect():
        await request.start_stream(200, SSE_HEADERS)
        while True:
            changed = log.changed()
            published = log.published
            if published > sent:
                chunk, sent = b"".join(log.frames[sent:published]), published
                await request.send_chunk(chunk)
                continue
            if log.ended:
                break
            await changed.wait()
    if not request.disconnected:
        await request.end_stream()


async def follow_store(request: Request, read: Any, first: StoredResponse, after: int) -> None:
    """Stream the stored events after ``after``, reading the store (``read()``: the record, or None once it
    is deleted) every RESUME_POLL_S until the response is over: what a node that does not generate the
    response, or one started after the generating node stopped, can serve."""
    record: StoredResponse | None = first
    sent, failures = after, 0
    async with request.cancel_on_disconnect():
        await request.start_stream(200, SSE_HEADERS)
        while record is not None:
            fresh = [(sequence, frame) for sequence, frame in record.events or () if sequence > sent]
            if fresh:
                sent = fresh[-1][0]
                await request.send_chunk("".join(frame for _, frame in fresh).encode())
            status = record.response.get("status")
            if status in FINISHED:
                last = (record.events or ((-1, ""),))[-1]
                if status == "failed" and _kind(last[1]) != "response.failed":
                    # The generating node stopped (the record is shown failed past its bound): say it.
                    await request.send_chunk(failed_event(record.response, max(sent, last[0]) + 1))
                break
            await trio.sleep(RESUME_POLL_S)
            try:
                record = await read()
                failures = 0
            except GatewayError as e:
                failures += 1
                if failures >= RESUME_READ_FAILURES_MAX:
                    await request.send_chunk(_event("error", sent + 1, code=e.code or "history_unavailable",
                                                    message=str(e), param=None))
                    break
    if not request.disconnected:
        await request.end_stream()


def failed_event(response: dict[str, Any], sequence: int) -> bytes:
    return _event("response.failed", sequence, response=response)


def _event(kind: str, sequence: int, **fields: Any) -> bytes:
    data = {"type": kind, "sequence_number": sequence, **fields}
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _kind(frame: str) -> str:
    """An SSE frame's event type (its first line: ``event: <type>``)."""
    return frame.partition("\n")[0].removeprefix("event: ")

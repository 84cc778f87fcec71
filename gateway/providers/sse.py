"""Server-sent events read as they arrive, within a bound (WHATWG HTML, "Interpreting an event stream").

OpenAI, Anthropic and Gemini (``alt=sse``) stream their answers this way. ``SseDecoder.feed`` takes the body's
pieces as the HTTP client hands them over (an event may be cut anywhere, even inside a UTF-8 character or between
``\\r`` and ``\\n``) and returns the events they complete, as ``(event name, data)``; comments (``:``) are skipped,
``id`` and ``retry`` are not needed by a client that never reconnects. An event (its lines so far) longer than
``event_bytes_max`` is a ``ProviderError``: a provider's event is a delta or, at most, a whole answer, and an
unbounded one is a server that would take the node's memory.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from .base import SERVER, ProviderError

# The largest event a provider sends is its last (Anthropic's message_stop is small; OpenAI's final chunk with
# usage, Gemini's whole candidate) or a tool call's arguments in one piece: a few KiB to hundreds. 8 MiB is far
# above any of them and far below what hurts a node.
EVENT_BYTES_MAX = 8 * 1024 * 1024

# Whole events of an event line and a data line each (Anthropic's), and their data.
_NAMED_EVENTS = re.compile(rb"(?:event: [^\n]*\ndata: [^\n]*\n\n)+")
_NAMED_DATA = re.compile(rb"\ndata: ([^\n]*)\n\n")


class SseDecoder:
    __slots__ = ("_buffer", "_limit", "_cr")

    def __init__(self, event_bytes_max: int = EVENT_BYTES_MAX) -> None:
        self._buffer = b""  # an event not ended yet (by a blank line)
        self._limit = event_bytes_max
        self._cr = False  # the last piece ended with \r: a \n that starts the next belongs to it

    def feed(self, data: bytes) -> "list[tuple[str, str]]":
        """The events ``data`` completes: (name, data), ``message`` when unnamed."""
        return [(name or "message", value.decode("utf-8", "replace")) for name, value in self.raw(data)]

    def raw(self, data: bytes) -> "list[tuple[str, bytes]]":
        """The events ``data`` completes: (name, or "" when unnamed; data as bytes)."""
        if self._cr and data.startswith(b"\n"):
            data = data[1:]
        self._cr = data.endswith(b"\r")
        buffer = self._buffer + data if self._buffer else data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        blocks = buffer.split(b"\n\n")  # events end at a blank line
        self._buffer = blocks.pop()
        if len(self._buffer) > self._limit:
            raise ProviderError(SERVER, 502, f"a streamed event is larger than {self._limit} bytes")
        events: list[tuple[str, bytes]] = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:  # the usual event: one data line
                events.append(("", block[6:]))
            elif block:
                event = self._event(block)
                if event is not None:
                    events.append(event)
        return events

    @staticmethod
    def _event(block: bytes) -> "tuple[str, bytes] | None":
        """An event of several lines: its name, its data lines joined, comments (keep-alives) skipped."""
        name, data = "", []
        for line in block.split(b"\n"):
            if not line or line[0] == 58:  # ":" a comment
                continue
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value.decode("utf-8", "replace")
        if not data and not name:
            return None
        return name, b"\n".join(data)

    def payloads(self, data: bytes) -> "list[bytes]":
        """The data of each event ``data`` completes, as bytes (OpenAI's last, ``[DONE]``, left out). The usual
        pieces, whole events of one ``data:`` line each (OpenAI, Gemini) or of an ``event:`` line and a ``data:``
        line (Anthropic), are cut with a few passes in C rather than a loop over their lines: no JSON value holds a
        raw newline, so when the newlines are exactly the events' separators there is no other field, comment or
        line to read."""
        if not self._buffer and not self._cr and data[-2:] == b"\n\n" and b"\r" not in data:
            if data[:6] == b"data: ":
                payloads = data[6:-2].split(b"\n\ndata: ")
                if b"\n" not in b"".join(payloads):  # (a copy and a memchr: cheaper than counting the newlines)
                    if b"[DONE]" in payloads:
                        return [payload for payload in payloads if payload != b"[DONE]"]
                    return payloads
            elif data[:7] == b"event: " and _NAMED_EVENTS.fullmatch(data) is not None:
                payloads = _NAMED_DATA.findall(data)  # (a name never holds a newline: one data line each)
                if b"[DONE]" in payloads:
                    return [payload for payload in payloads if payload != b"[DONE]"]
                return payloads
        return [value for _, value in self.raw(data) if value != b"[DONE]"]

    def whole_events(self, data: bytes) -> bool:
        """``data`` is whole events: nothing of an event is held from before it, and it ends with a blank line (and
        has no ``\\r``, so a newline is all that ends a line): ``event_at`` reads its events at their places."""
        return not self._buffer and not self._cr and data[-2:] == b"\n\n" and b"\r" not in data

    def objects(self, data: bytes) -> "list[dict]":
        """The JSON objects the events ``data`` completes carry (every provider's events are JSON objects; OpenAI's
        last, ``[DONE]``, and anything else that is not an object, are skipped); an event that is not JSON at all is
        a ProviderError. The events of one piece are read as one JSON array: one parse instead of one an event."""
        return json_objects(self.payloads(data))

    def finish(self) -> "list[tuple[str, str]]":
        """The body ended: an event not closed by a blank line is dropped, as the standard says."""
        return []


def event_at(data: bytes, pos: int) -> "tuple[bytes, int] | None":
    """The data of the event at ``pos`` in whole events (``SseDecoder.whole_events``) and where the next begins, when
    it is one ``data:`` line, or an ``event:`` line and one ``data:`` line; None for any other (a comment, an id,
    several data lines, a field without its space), which the decoder's general reading reads."""
    end = data.find(b"\n\n", pos)
    if data.startswith(b"data: ", pos):
        start = pos + 6
    elif data.startswith(b"event: ", pos):
        start = data.find(b"\n", pos) + 1
        if not data.startswith(b"data: ", start):
            return None
        start += 6
    else:
        return None
    if data.find(b"\n", start, end) >= 0:
        return None
    return data[start:end], end + 2


def json_objects(payloads: "list[bytes]") -> "list[dict]":
    """The objects among events' JSON values (read as one array when they can be: one parse for them all); an
    event that is not one JSON value is a ProviderError."""
    if not payloads:
        return []
    try:
        values = orjson.loads(b"[" + b",".join(payloads) + b"]")
    except orjson.JSONDecodeError:
        values = None
    if values is None or len(values) != len(payloads):  # one is not JSON, or spelled several values ("1, 2")
        values = [json_value(payload) for payload in payloads]
    return [value for value in values if type(value) is dict]


def json_value(payload: bytes) -> Any:
    """One event's JSON value; a ProviderError when it is not one."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise ProviderError(SERVER, 502, "the provider streamed an event that is not JSON") from None


def json_object(payload: bytes) -> "dict | None":
    """One event's JSON value when it is an object (None for any other value); a ProviderError when it is not
    JSON."""
    value = json_value(payload)
    return value if type(value) is dict else None

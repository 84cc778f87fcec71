"""Server-sent events read as they arrive, within a bound (WHATWG HTML, "Interpreting an event stream").

OpenAI, Anthropic and Gemini (``alt=sse``) stream their answers this way. ``SseDecoder.feed`` takes the body's
pieces as the HTTP client hands them over (an event may be cut anywhere, even inside a UTF-8 character or between
``\\r`` and ``\\n``) and returns the events they complete, as ``(event name, data)``; comments (``:``) are skipped,
``id`` and ``retry`` are not needed by a client that never reconnects. An event (its lines so far) longer than
``event_bytes_max`` is a ``ProviderError``: a provider's event is a delta or, at most, a whole answer, and an
unbounded one is a server that would take the node's memory.
"""

from __future__ import annotations

import orjson

from .base import SERVER, ProviderError

# The largest event a provider sends is its last (Anthropic's message_stop is small; OpenAI's final chunk with
# usage, Gemini's whole candidate) or a tool call's arguments in one piece: a few KiB to hundreds. 8 MiB is far
# above any of them and far below what hurts a node.
EVENT_BYTES_MAX = 8 * 1024 * 1024


class SseDecoder:
    __slots__ = ("_buffer", "_event", "_data", "_size", "_limit", "_cr")

    def __init__(self, event_bytes_max: int = EVENT_BYTES_MAX) -> None:
        self._buffer = b""  # a line not ended yet
        self._event = ""
        self._data: list[bytes] = []
        self._size = 0  # the event's bytes so far
        self._limit = event_bytes_max
        self._cr = False  # the last piece ended with \r: a \n that starts the next belongs to it

    def feed(self, data: bytes) -> "list[tuple[str, str]]":
        if self._cr and data.startswith(b"\n"):
            data = data[1:]
        self._cr = data.endswith(b"\r")
        buffer = self._buffer + data if self._buffer else data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()
        if len(self._buffer) + self._size > self._limit:
            raise ProviderError(SERVER, 502, f"a streamed event is larger than {self._limit} bytes")
        events: list[tuple[str, str]] = []
        for line in lines:
            if not line:
                if self._data or self._event:
                    events.append((self._event or "message", b"\n".join(self._data).decode("utf-8", "replace")))
                self._event, self._data, self._size = "", [], 0
                continue
            self._size += len(line)
            if self._size > self._limit:
                raise ProviderError(SERVER, 502, f"a streamed event is larger than {self._limit} bytes")
            if line[0] == 58:  # ":" a comment (keep-alives)
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
        return events

    def objects(self, data: bytes) -> "list[dict]":
        """The JSON objects the events ``data`` completes carry (every provider's events are JSON objects; OpenAI's
        last, ``[DONE]``, and anything else that is not an object, are skipped); an event that is not JSON at all is
        a ProviderError."""
        out = []
        for _, text in self.feed(data):
            if text == "[DONE]":
                continue
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise ProviderError(SERVER, 502, "the provider streamed an event that is not JSON") from None
            if isinstance(value, dict):
                out.append(value)
        return out

    def finish(self) -> "list[tuple[str, str]]":
        """The body ended: an event not closed by a blank line is dropped, as the standard says."""
        return []

"""A stream's text events read from their bytes: most of a provider's streamed events are the same JSON object
but for one string (OpenAI's chat chunk ``{"id":..,"choices":[{"index":0,"delta":{"content":"Hi"},
"finish_reason":null}]}``, the same id, model and time in each). Once one such event has been parsed, the bytes
before and after its string are that shape; a later event made of the same bytes around another JSON string is the
same object with that string, so its text is read without building the object. A JSON string holds no raw newline
or quote, so the string cannot swallow any of the shape's bytes: substituting one string token for another keeps
the rest of the document as it was parsed. An event of any other shape (a finish, usage, a tool call, a field that
differs per event, such as OpenAI's ``obfuscation``) is parsed as before; the reader only saves work.

Where a piece of the body holds whole events (as a fast provider's does: many text events in one read),
``TextEvents`` reads them at their places in the piece, and a run of consecutive text events of the shape at once:
their strings are found between the shape's fixed bytes and read with one parse (``TextShape.run``).

Pure: no I/O. Measured on the provider relay benchmark (tests/bench/provider_bench.py, 16 text events): BENCHMARKS.
"""

from __future__ import annotations

import re
from typing import Iterator

import orjson

from .sse import SseDecoder, event_at

# A JSON string without escapes or control characters (most text): its bytes between the quotes are its UTF-8.
_PLAIN_STRING = re.compile(rb'"[^"\\\x00-\x1f]*"')
# What makes a JSON string's bytes (between its quotes) other than its text: an escape or a control character.
_ESCAPE_OR_CONTROL = re.compile(rb"[\\\x00-\x1f]")
# A JSON string token from its opening quote (escapes included).
_STRING_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
# How many text events of a stream a shape is learned from before the stream is read by parsing alone.
LEARN_TRIES = 3


class TextShape:
    """The bytes around one string of a parsed event (``learn``); ``text`` reads that string from another event's
    data, ``run`` the strings of consecutive framed events in a piece of the body."""

    __slots__ = ("_before", "_after", "_before_len", "_after_len", "_min_len", "head", "_head_len", "_tail",
                 "_tail_len", "_next", "_next_len")

    def __init__(self, before: bytes, after: bytes, frame: bytes = b"data: ") -> None:
        self._before = before
        self._after = after
        self._before_len = len(before)
        self._after_len = len(after)
        self._min_len = len(before) + len(after) + 2  # and the string's two quotes
        # The event framed in the body (its event line, ``data: ``, then the data and the blank line that ends it):
        # ``head`` up to the string's first byte, ``_tail`` from its closing quote to the event's end, ``_next`` a
        # tail followed by the next event's head (a run goes on).
        self.head = frame + before + b'"'
        self._head_len = len(self.head)
        self._tail = b'"' + after + b"\n\n"
        self._tail_len = len(self._tail)
        self._next = self._tail + self.head
        self._next_len = len(self._next)

    @classmethod
    def learn(cls, payload: bytes, key: bytes, text: str, frame: bytes = b"data: ") -> "TextShape | None":
        """The shape of ``payload`` (an event's JSON, already parsed) around the value of its only ``key`` member,
        whose value parsed as ``text``; ``frame`` is what comes before the data in the body (``run``). None when
        the key is spelled more than once in it (another member of that name elsewhere: which one is the text
        cannot be told from the bytes), the value is not found as a string, or the data spans lines (in the body
        its lines are framed apart)."""
        name = b'"' + key + b'":'
        at = payload.find(name)
        if at < 0 or payload.find(name, at + 1) >= 0 or b"\n" in payload or b"\r" in payload:
            return None
        start = at + len(name)
        while payload[start:start + 1] in (b" ", b"\t"):
            start += 1
        token = _PLAIN_STRING.match(payload, start)  # most texts (a character class: cheaper than the next)
        if token is not None:
            if token.group()[1:-1] != text.encode():
                return None
        else:
            token = _STRING_TOKEN.match(payload, start)
            if token is None:
                return None
            try:
                if orjson.loads(token.group()) != text:
                    return None
            except orjson.JSONDecodeError:
                return None
        return cls(payload[:start], payload[token.end():], frame)

    def text(self, payload: bytes) -> "str | None":
        """The string of ``payload`` when it is this shape around a JSON string; None when it is anything else
        (the caller parses it)."""
        if len(payload) < self._min_len or not payload.startswith(self._before) \
                or not payload.endswith(self._after):
            return None
        token = payload[self._before_len:len(payload) - self._after_len]
        if _PLAIN_STRING.fullmatch(token) is not None:
            try:
                return token[1:-1].decode()
            except UnicodeDecodeError:
                return None
        if token[:1] != b'"':
            return None
        try:
            value = orjson.loads(token)
        except orjson.JSONDecodeError:
            return None
        return value if type(value) is str else None

    def run(self, data: bytes, pos: int) -> "tuple[int, str | None]":
        """The events of this shape one after the other in ``data`` from ``pos`` (where one begins with ``head``,
        in a piece of whole events): where the last of them ends, and their strings joined; the text is None when
        they must be read one at a time (an escape the bytes cannot vouch for, or one is not JSON), and the end
        ``pos`` when not even the first is one whose string ends at a quote followed by the shape's bytes.

        Each string is the bytes from the head to the next quote; it is one of the run's when the shape's bytes
        follow that quote. The strings are then read as one JSON array: as none holds a quote, and none ends with
        a backslash that would escape the quote after it, each element is one event's string, read as parsing
        that event would read it (its escapes, UTF-8 and control characters checked alike)."""
        find, following, following_len = data.find, self._next, self._next_len
        start = pos + self._head_len
        strings: list[bytes] = []
        while True:  # (slices compared rather than startswith: its arguments are parsed the slow way)
            quote = find(b'"', start)
            if data[quote:quote + following_len] == following and quote >= 0:
                strings.append(data[start:quote])
                start = quote + following_len
                continue
            if quote >= 0 and data[quote:quote + self._tail_len] == self._tail:
                strings.append(data[start:quote])
                end = quote + self._tail_len
            else:  # the run ends before this event
                end = start - self._head_len
            break
        if not strings:
            return pos, None
        joined = b"".join(strings)
        if joined.isascii() and _ESCAPE_OR_CONTROL.search(joined) is None:  # most text: its bytes are it
            return end, joined.decode("ascii")
        array = b'["' + b'","'.join(strings) + b'"]'
        if b'\\"' in array:  # a string ending with a backslash: it would escape its closing quote
            return end, None
        try:
            texts = orjson.loads(array)
        except orjson.JSONDecodeError:
            return end, None
        return end, "".join(texts)


class ShapeMemory:
    """The last text shape streams of one kind learned, for the next such stream to start with: where a wire's text
    events are the same bytes in every stream (Anthropic's content_block_delta names no id or time), even a stream's
    first text events are then read by their shape. Safe to share between streams and targets: a shape says only
    that its bytes around any JSON string parse as that event with that string (the module's docstring), whichever
    stream it was learned from; one that does not fit a stream is replaced by the shape that stream learns."""

    __slots__ = ("shape",)

    def __init__(self) -> None:
        self.shape: TextShape | None = None


class TextEvents(SseDecoder):
    """A provider stream's SSE events, its text events read by their shape once ``learn`` has one: ``items``
    gives, in order, each event's data to be parsed (bytes) and the texts of the events of the shape (str, never
    empty; consecutive ones may come joined). ``key`` names the text's member, ``frame`` what precedes the text
    events' data in the body (``data: ``, or Anthropic's event line first); ``memory``, where given, is the shape
    the stream starts with and keeps the one it learns."""

    __slots__ = ("shape", "_key", "_frame", "_tries", "_memory", "learned")

    def __init__(self, key: bytes, frame: bytes = b"data: ", memory: ShapeMemory | None = None) -> None:
        super().__init__()
        self.shape: TextShape | None = memory.shape if memory is not None else None
        self._key = key
        self._frame = frame
        self._tries = 0
        self._memory = memory
        self.learned = False  # a shape learned from this stream (not one it started with)

    def learn(self, payload: bytes, text: str) -> None:
        """``payload``, just parsed, is a text event whose text is ``text``: its shape, for the next ones, unless
        this stream learned one already. A stream whose text events cannot give one (each names its key twice, as
        OpenAI's with logprobs) stops being asked after ``LEARN_TRIES``: each try costs more than parsing the
        event."""
        if self.learned or self._tries >= LEARN_TRIES:
            return
        self._tries += 1
        shape = TextShape.learn(payload, self._key, text, self._frame)
        if shape is not None:
            self.shape = shape
            self.learned = True
            if self._memory is not None:
                self._memory.shape = shape

    def items(self, data: bytes) -> "Iterator[bytes | str]":
        """The events ``data`` completes (OpenAI's ``[DONE]`` left out), texts where the shape reads them."""
        if not self.whole_events(data):
            yield from self._one_at_a_time(self.payloads(data))
            return
        # Whole events: read at their places, runs of the shape at once.
        pos, size = 0, len(data)
        single_until = 0  # a run found before that must be read one event at a time
        while pos < size:
            shape = self.shape
            if shape is not None and pos >= single_until and data.startswith(shape.head, pos):
                end, text = shape.run(data, pos)
                if text is not None:
                    pos = end
                    if text:
                        yield text
                    continue
                single_until = end
            event = event_at(data, pos)
            if event is None:  # another kind of event (comments, several data lines): the general reading
                yield from self._one_at_a_time(self.payloads(data[pos:]))
                return
            payload, pos = event
            if payload != b"[DONE]":
                item = self._read(payload)
                if item is not None:
                    yield item

    def _one_at_a_time(self, payloads: "list[bytes]") -> "Iterator[bytes | str]":
        for payload in payloads:
            item = self._read(payload)
            if item is not None:
                yield item

    def _read(self, payload: bytes) -> "bytes | str | None":
        """One event's text when it is of the shape (None when empty), else its data."""
        shape = self.shape
        if shape is not None:
            text = shape.text(payload)
            if text is not None:
                return text or None
        return payload

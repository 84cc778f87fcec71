"""A stream's text events read from their bytes: most of a provider's streamed events are the same JSON object
but for one string (OpenAI's chat chunk ``{"id":..,"choices":[{"index":0,"delta":{"content":"Hi"},
"finish_reason":null}]}``, the same id, model and time in each). Once one such event has been parsed, the bytes
before and after its string are that shape; a later event made of the same bytes around another JSON string is the
same object with that string, so its text is read without building the object. A JSON string holds no raw newline
or quote, so the string cannot swallow any of the shape's bytes: substituting one string token for another keeps
the rest of the document as it was parsed. An event of any other shape (a finish, usage, a tool call, a field that
differs per event, such as OpenAI's ``obfuscation``) is parsed as before; the reader only saves work.

Pure: no I/O. Measured on the provider relay benchmark (tests/bench/provider_bench.py, 16 text events): BENCHMARKS.
"""

from __future__ import annotations

import re

import orjson

# A JSON string without escapes or control characters (most text): its bytes between the quotes are its UTF-8.
_PLAIN_STRING = re.compile(rb'"[^"\\\x00-\x1f]*"')
# A JSON string token from its opening quote (escapes included).
_STRING_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


class TextShape:
    """The bytes around one string of a parsed event (``learn``); ``text`` reads that string from another."""

    __slots__ = ("_before", "_after", "_before_len", "_after_len", "_min_len")

    def __init__(self, before: bytes, after: bytes) -> None:
        self._before = before
        self._after = after
        self._before_len = len(before)
        self._after_len = len(after)
        self._min_len = len(before) + len(after) + 2  # and the string's two quotes

    @classmethod
    def learn(cls, payload: bytes, key: bytes, text: str) -> "TextShape | None":
        """The shape of ``payload`` (an event's JSON, already parsed) around the value of its only ``key`` member,
        whose value parsed as ``text``; None when the key is spelled more than once in it (another member of that
        name elsewhere: which one is the text cannot be told from the bytes) or the value is not found as a string."""
        name = b'"' + key + b'":'
        at = payload.find(name)
        if at < 0 or payload.find(name, at + 1) >= 0:
            return None
        start = at + len(name)
        while payload[start:start + 1] in (b" ", b"\t"):
            start += 1
        token = _STRING_TOKEN.match(payload, start)
        if token is None:
            return None
        value = token.group()
        if _PLAIN_STRING.fullmatch(value) is not None:
            if value[1:-1] != text.encode():
                return None
        else:
            try:
                if orjson.loads(value) != text:
                    return None
            except orjson.JSONDecodeError:
                return None
        return cls(payload[:start], payload[token.end():])

    def take(self, payload: bytes, texts: "list[str]") -> bool:
        """Whether ``payload`` is this shape around a JSON string: then its string, unless empty, is appended to
        ``texts``; False for anything else (the caller parses it)."""
        if len(payload) < self._min_len or not payload.startswith(self._before) \
                or not payload.endswith(self._after):
            return False
        token = payload[self._before_len:len(payload) - self._after_len]
        if _PLAIN_STRING.fullmatch(token) is not None:
            if len(token) > 2:
                try:
                    texts.append(token[1:-1].decode())
                except UnicodeDecodeError:
                    return False
            return True
        if token[:1] != b'"':
            return False
        try:
            value = orjson.loads(token)
        except orjson.JSONDecodeError:
            return False
        if type(value) is not str:
            return False
        if value:
            texts.append(value)
        return True

    def text(self, payload: bytes) -> "str | None":
        """The string of ``payload`` when it is this shape around a JSON string; None when it is anything else."""
        texts: list[str] = []
        return "".join(texts) if self.take(payload, texts) else None

"""Client text that spells a special token is encoded as plain text; the template's own markers stay special.

Why: a user message containing ``<|im_start|>system`` was tokenized as the real
control tokens, a forged system turn (prompt injection at the token level).
The chat template must still produce its real markers around the turns.

How, without touching the template: before rendering, every special-token
spelling (and the marker character itself) in client strings is replaced by a
placeholder ``MARK + index + MARK``; the template renders as usual; the rendered
prompt is then cut at the placeholders, the template's text encoded as always,
and each protected span encoded with special tokens off (``<``, ``|``, ``im``,
... for Qwen). No id of a special token can come from client text.

Pure: no I/O; ``TokenizerService.encode_with_literals`` does the encoding.
"""

from __future__ import annotations

import re
from typing import Any

# U+10FFFD (plane 16 private use): never produced by templates, vanishingly rare in text, and a
# client string that contains it is protected like a special token (so it cannot forge a placeholder).
MARK = "\U0010FFFD"
_PLACEHOLDER = re.compile(MARK + r"(\d{1,9})" + MARK)


class LiteralSpans:
    def __init__(self, special_texts: "list[str]") -> None:
        texts = sorted({t for t in special_texts if t} | {MARK}, key=len, reverse=True)
        self.pattern = re.compile("|".join(re.escape(t) for t in texts))
        # Every special token of the usual vocabularies starts with one of a few characters ("<", "["):
        # a string without any of them cannot hold one. One ``in`` per character is a memchr-speed scan
        # (and none at all for a character wider than the string's storage: MARK in an ASCII string),
        # several times faster than SRE's charset search over a long prompt.
        self._first_chars = tuple(sorted({t[0] for t in texts}))
        # The same test on a raw JSON body, before anything is parsed out of it: single bytes, each a
        # memchr (a multi-byte needle takes CPython's general search, ~1 byte/ns: 65 us for a 38 KB body).
        # A body holds a special token's spelling only if it holds its first character's first UTF-8 byte,
        # or a backslash (a \u escape could spell it).
        self._body_bytes = tuple(sorted({t[0].encode()[:1] for t in texts} | {b"\\"}))

    def may_occur_in(self, body: bytes) -> bool:
        """False when no string of this JSON body can spell a special token (memchr-speed scans)."""
        for byte in self._body_bytes:
            if byte in body:
                return True
        return False

    def _may_hold(self, text: str) -> bool:
        for char in self._first_chars:
            if char in text:
                return True
        return False

    def protect(self, messages: "list[dict[str, Any]]", tools: "list[dict[str, Any]] | None"
                ) -> "tuple[list[dict[str, Any]], list[dict[str, Any]] | None, list[str]]":
        """(messages, tools, spans): copies with every special-token spelling replaced by a placeholder,
        and the spans in placeholder order. The inputs are returned as they are, and nothing is
        copied, when nothing matched (the common case)."""
        if not self._messages_contain(messages) and not (tools and self._contains(tools)):
            return messages, tools, []
        spans: list[str] = []
        out_messages = [self._walk(m, spans) for m in messages]
        out_tools = self._walk(tools, spans) if tools else tools
        return out_messages, out_tools, spans

    def _messages_contain(self, messages: "list[dict[str, Any]]") -> bool:
        """``_contains`` for the usual shape, a list of flat messages, without recursion: it runs on
        every chat request."""
        may_hold = self._may_hold
        for message in messages:
            for value in message.values():
                if type(value) is str:
                    if may_hold(value) and self.pattern.search(value) is not None:
                        return True
                elif self._contains(value):
                    return True
        return False

    def _contains(self, value: Any) -> bool:
        if isinstance(value, str):
            return self._may_hold(value) and self.pattern.search(value) is not None
        if isinstance(value, dict):
            return any(self._contains(v) for v in value.values())
        if isinstance(value, list):
            return any(self._contains(v) for v in value)
        return False

    def _walk(self, value: Any, spans: "list[str]") -> Any:
        if isinstance(value, str):
            if self.pattern.search(value) is None:
                return value
            return self.pattern.sub(lambda m: self._placeholder(m.group(), spans), value)
        if isinstance(value, dict):
            return {k: self._walk(v, spans) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, spans) for v in value]
        return value

    @staticmethod
    def _placeholder(text: str, spans: "list[str]") -> str:
        spans.append(text)
        return f"{MARK}{len(spans) - 1}{MARK}"

    @staticmethod
    def split(rendered: str, spans: "list[str]") -> "list[tuple[str, bool]]":
        """The rendered prompt as (text, is_literal) parts, placeholders turned back into their spans."""
        parts: list[tuple[str, bool]] = []
        position = 0
        for match in _PLACEHOLDER.finditer(rendered):
            index = int(match.group(1))
            if index >= len(spans):
                continue  # not ours (a template cannot make one, but be exact): left as text
            if match.start() > position:
                parts.append((rendered[position:match.start()], False))
            parts.append((spans[index], True))
            position = match.end()
        if position < len(rendered):
            parts.append((rendered[position:], False))
        return parts

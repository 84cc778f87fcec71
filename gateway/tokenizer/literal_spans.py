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
        alternatives = [re.escape(t) for t in sorted(set(special_texts), key=len, reverse=True) if t]
        self.pattern = re.compile("|".join([*alternatives, re.escape(MARK)]))

    def protect(self, messages: "list[dict[str, Any]]", tools: "list[dict[str, Any]] | None"
                ) -> "tuple[list[dict[str, Any]], list[dict[str, Any]] | None, list[str]]":
        """(messages, tools, spans): copies with every special-token spelling replaced by a placeholder,
        and the spans in placeholder order. The inputs are returned as they are when nothing matched
        (the common case: one regex search per string)."""
        spans: list[str] = []
        out_messages = [self._walk(m, spans) for m in messages]
        out_tools = self._walk(tools, spans) if tools else tools
        if not spans:
            return messages, tools, spans
        return out_messages, out_tools, spans

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

"""Tool calls in a model's output, parsed as the text streams.

A parser is fed the decoded text (special tokens kept) piece by piece and returns, for each piece,
the content that is surely not part of a call and the calls completed in it. A call is returned
only once it is whole and valid: a name half received is never sent, and text between markers
that does not parse (invalid JSON, a function the request did not offer) is content, not a call.
``finish`` flushes what was held: a call whose end marker never came (the generation ended) is
still a call when its body parses, and a held partial marker is content.

Formats (the names are smg's; vLLM's and SGLang's are aliases):

    qwen, qwen25, hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, several in a row
                           (Hermes 2 Pro, Qwen2.5, Qwen3)

More families join ``TOOL_CALL_PARSERS`` as they are written.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any

from .markers import held_back


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments


@dataclasses.dataclass(slots=True)
class ToolCallResult:
    content: str = ""
    calls: list[ToolCall] = dataclasses.field(default_factory=list)

    def extend(self, other: "ToolCallResult") -> None:
        self.content += other.content
        self.calls += other.calls


class ToolCallParser:
    """The streaming interface every format implements."""

    def feed(self, text: str) -> ToolCallResult:
        raise NotImplementedError

    def finish(self) -> ToolCallResult:
        raise NotImplementedError

    def parse(self, text: str) -> ToolCallResult:
        """A whole text at once: the same as feeding it in any pieces, then finishing."""
        result = self.feed(text)
        result.extend(self.finish())
        return result


def _arguments_text(arguments: Any) -> str | None:
    """OpenAI's arguments string: an object serialized, or a string that already is one; None if neither."""
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    if isinstance(arguments, str):
        try:
            return arguments if isinstance(json.loads(arguments), dict) else None
        except ValueError:
            return None
    return None


def calls_from_json(value: Any, tool_names: "frozenset[str] | None") -> list[ToolCall] | None:
    """Calls from a decoded JSON value: {"name", "arguments"|"parameters"} or a list of those; None when
    anything in it is not a call (or names a function the request did not offer)."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        text = _arguments_text(arguments)
        if text is None or (tool_names is not None and item["name"] not in tool_names):
            return None
        calls.append(ToolCall(item["name"], text))
    return calls or None


class TaggedJsonParser(ToolCallParser):
    """Calls as JSON between a start and an end marker (``<tool_call>`` ... ``</tool_call>``)."""

    def __init__(self, tool_names: "Iterable[str] | None" = None, start: str = "<tool_call>",
                 end: str = "</tool_call>") -> None:
        self.tool_names = frozenset(tool_names) if tool_names is not None else None
        self.start, self.end = start, end
        self._buffer = ""
        self._inside = False

    def feed(self, text: str) -> ToolCallResult:
        result = ToolCallResult()
        buffer = self._buffer + text
        while True:
            if not self._inside:
                at = buffer.find(self.start)
                if at < 0:
                    keep = held_back(buffer, self.start)
                    result.content += buffer[:len(buffer) - keep]
                    buffer = buffer[len(buffer) - keep:]
                    break
                result.content += buffer[:at]
                buffer = buffer[at + len(self.start):]
                self._inside = True
            at = buffer.find(self.end)
            if at < 0:
                break  # the call's body is still arriving
            self._close(buffer[:at], result, ended=True)
            buffer = buffer[at + len(self.end):]
        self._buffer = buffer
        return result

    def finish(self) -> ToolCallResult:
        result = ToolCallResult()
        if self._inside:
            self._close(self._buffer, result, ended=False)  # the generation ended inside a call
        else:
            result.content += self._buffer
        self._buffer = ""
        return result

    def _close(self, body: str, result: ToolCallResult, ended: bool) -> None:
        self._inside = False
        try:
            calls = calls_from_json(json.loads(body), self.tool_names)
        except ValueError:
            calls = None
        if calls is None:  # not a call after all: the text stays what the model wrote
            result.content += self.start + body + (self.end if ended else "")
        else:
            result.calls += calls


TOOL_CALL_PARSERS: dict[str, Callable[["Iterable[str] | None"], ToolCallParser]] = {
    "qwen": TaggedJsonParser,
    "qwen25": TaggedJsonParser,  # SGLang
    "hermes": TaggedJsonParser,  # vLLM
}


def tool_call_parser(name: str, tool_names: "Iterable[str] | None" = None) -> ToolCallParser:
    """A new parser (one per generation) of the format ``name``; KeyError for a name we do not know."""
    return TOOL_CALL_PARSERS[name](tool_names)

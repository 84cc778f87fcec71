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
    llama, llama3_json     {"name": ..., "parameters": {...}} as the whole answer, optionally after
                           <|python_tag|>, several joined by ";" (Llama 3.1-3.3)
    mistral                [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...], or the newer
                           [TOOL_CALLS]name[ARGS]{...} (and [TOOL_CALLS]name{...}) repeated
    pythonic               [f(a=1, b="x"), g()] as Python literals, anywhere in the text, optionally
                           between <|python_start|> and <|python_end|> (Llama 4, Llama 3.2 pythonic)
    json                   the whole answer a JSON call or array of calls (constrained output:
                           tool_choice "required"; a named tool_choice's answer is its arguments,
                           ``NamedArgumentsParser``)
    qwen_coder, qwen_xml   <tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>
                           (Qwen3-Coder, Qwen3.5), values typed by the tool's schema
    deepseek (v3)          <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
                           ```json {...} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
    deepseek31             the same section, <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
    kimik2, kimi_k2        <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
                           <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>
    glm45_moe, glm47_moe   <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>,
                           values typed by the tool's schema
    minimax_m2, step3,     <invoke name=NAME><parameter name=K>V</parameter></invoke> in their sections
    deepseek32             (MiniMax-M2, Step-3, DeepSeek V3.2's DSML), see ``InvokeParser``
    cohere                 <|START_ACTION|>[{"tool_name": ..., "parameters": {...}}]<|END_ACTION|>

Formats whose calls run to the end of the answer (all but the tagged one) stream the text before
their marker as content and hold the rest until ``finish``, where it is parsed whole: calls when
it parses, the text itself when it does not.
"""

from __future__ import annotations

import abc
import ast
import dataclasses
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from ..base.registry import Registry
from .markers import held_back


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments


class ToolCallResult:
    """What a piece of an answer came to: content text, whole calls, and (formats that carry it: harmony.py)
    reasoning. Content is kept in pieces until it is read: appending to an attribute's string copies the whole
    string each time (CPython joins in place only a local's), which was quadratic over an answer parsed whole
    in many small pieces (0.8 s for 200,000 characters of ``{[``, 10 s for 800,000)."""

    __slots__ = ("_content", "calls", "reasoning")

    def __init__(self, content: str = "", calls: "list[ToolCall] | None" = None, reasoning: str = "") -> None:
        self._content = [content] if content else []
        self.calls = calls if calls is not None else []
        self.reasoning = reasoning

    @property
    def content(self) -> str:
        parts = self._content
        if not parts:
            return ""
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
        return parts[0]

    @content.setter
    def content(self, value: str) -> None:
        self._content = [value] if value else []

    def add_content(self, text: str) -> None:
        self._content.append(text)

    def extend(self, other: "ToolCallResult") -> None:
        self._content += other._content
        self.calls += other.calls
        self.reasoning += other.reasoning

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolCallResult):
            return NotImplemented
        return (self.content, self.calls, self.reasoning) == (other.content, other.calls, other.reasoning)

    def __repr__(self) -> str:
        return f"ToolCallResult(content={self.content!r}, calls={self.calls!r}, reasoning={self.reasoning!r})"


@dataclasses.dataclass(frozen=True)
class ToolSet:
    """The functions a request offers: their names, and each one's parameters schema (for formats whose
    values come untyped, as text, and are typed by the schema)."""

    names: frozenset[str]
    schemas: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, tools: "Iterable[str] | Iterable[dict[str, Any]] | ToolSet | None") -> "ToolSet | None":
        """From names, or from OpenAI tool objects ({"type": "function", "function": {...}})."""
        if tools is None or isinstance(tools, ToolSet):
            return tools
        names, schemas = set(), {}
        for tool in tools:
            if isinstance(tool, str):
                names.add(tool)
            else:
                function = tool.get("function", tool)
                names.add(function["name"])
                if isinstance(function.get("parameters"), dict):
                    schemas[function["name"]] = function["parameters"]
        return cls(frozenset(names), schemas)


# A call's body longer than this is not a call (what came is content): no decoder looks at more in one step.
# Far above real calls (a whole file written through a tool is ~100 KB).
CALL_BODY_CHARS_MAX = 1024 * 1024


class ToolCallParser(abc.ABC):
    """The streaming interface every format implements."""

    # True for a format that carries the reasoning too (gpt-oss's harmony): it takes the reasoning
    # parser's part, and says the reasoning in ToolCallResult.reasoning.
    handles_reasoning = False

    # The markers the format writes: tokenizers often hold them as special tokens, which the
    # detokenizer drops unless told to keep these (GenerationPlan.kept_special).
    spellings: tuple[str, ...] = ()

    @abc.abstractmethod
    def feed(self, text: str) -> ToolCallResult:
        """The content and the calls this piece of text completes."""

    @abc.abstractmethod
    def finish(self) -> ToolCallResult:
        """What was held back, at the end of the answer."""

    def parse(self, text: str) -> ToolCallResult:
        """A whole text at once: the same as feeding it in any pieces, then finishing."""
        result = self.feed(text)
        result.extend(self.finish())
        return result


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


class _ModelJsonDecoder(json.JSONDecoder):
    """JSON as a model writes it, read strictly: NaN and Infinity are not JSON (json.loads takes them, the
    clients' parsers do not), and nesting past Python's recursion limit is text that is not JSON (a
    ValueError, as any other), not a RecursionError out of the parser ("[" * 200000 under tool_choice
    "required" ended the request)."""

    def __init__(self) -> None:
        super().__init__(parse_constant=_not_json)

    def raw_decode(self, s: str, idx: int = 0) -> tuple[Any, int]:
        try:
            return super().raw_decode(s, idx)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None


_JSON = _ModelJsonDecoder()


def _arguments_text(arguments: Any) -> str | None:
    """OpenAI's arguments string: an object serialized, or a string that already is one; None if neither."""
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    if isinstance(arguments, str):
        try:
            return arguments if isinstance(_JSON.decode(arguments), dict) else None
        except ValueError:
            return None
    return None


def calls_from_json(value: Any) -> list[ToolCall] | None:
    """Calls from a decoded JSON value: {"name", "arguments"|"parameters"} or a list of those; None when
    anything in it is not a call. (Whether the request offered the functions is the parser's check.)"""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        text = _arguments_text(arguments)
        if text is None:
            return None
        calls.append(ToolCall(item["name"], text))
    return calls or None


class TaggedParser(ToolCallParser):
    """Calls between a start and an end marker, several in a row; ``decode_body`` reads what is between
    (JSON here: ``<tool_call>`` {...} ``</tool_call>``)."""

    start = "<tool_call>"
    end = "</tool_call>"
    spellings = ("<tool_call>", "</tool_call>")

    def __init__(self, tools: "Iterable[str] | Iterable[dict[str, Any]] | ToolSet | None" = None) -> None:
        self.tools = ToolSet.of(tools)
        self.tool_names = self.tools.names if self.tools is not None else None
        self._buffer = ""
        self._inside = False
        self._after_call = False  # only whitespace since the last call: dropped if another call follows
        self._ends_space = True  # the content so far ends with whitespace (or there is none yet)
        self._body_parts: list[str] = []  # the body of the call being read, as it arrived
        self._body_chars = 0
        self._tail = ""  # its last characters, where an end marker split between pieces may begin

    def decode_body(self, body: str) -> "list[ToolCall] | None":
        return _json_calls(body)

    def feed(self, text: str) -> ToolCallResult:
        result = ToolCallResult()
        buffer, pos = self._buffer + text, 0  # _buffer: only a partial start marker, or layout after a call
        self._buffer = ""
        while pos < len(buffer) or (not self._inside and self._after_call):
            if self._inside:
                after = self._take_body(buffer, pos, result)
                if after is None:
                    return result  # the call's body is still arriving
                pos = after
                continue
            if self._after_call:
                rest = len(buffer) - len(buffer[pos:].lstrip())
                if buffer.startswith(self.start, rest):
                    pos = rest  # the whitespace between two calls is layout, not content
                elif rest == len(buffer) or self.start.startswith(buffer[rest:]):
                    self._buffer = buffer[pos:]  # whitespace, or the next start marker still arriving: wait
                    return result
                elif self._ends_space:
                    # Text after a removed call: the text before it ended with its own whitespace, so the
                    # whitespace after the call's end marker is the markers' layout (GLM-4.5 wrote "\n\n"
                    # around a call, and the text around it came out "\n\n\n\n").
                    pos = rest
                self._after_call = False
            at = buffer.find(self.start, pos)
            if at < 0:
                keep = held_back(buffer, self.start)
                self._emit(result, buffer[pos:len(buffer) - keep])
                self._buffer = buffer[len(buffer) - keep:]
                return result
            self._emit(result, buffer[pos:at])
            pos = at + len(self.start)
            self._inside = True
        return result

    def _emit(self, result: ToolCallResult, text: str) -> None:
        if text:
            result.add_content(text)
            self._ends_space = text[-1].isspace()

    def _take_body(self, buffer: str, pos: int, result: ToolCallResult) -> int | None:
        """Reads a call's body from ``buffer[pos:]``: where the text goes on after its end marker (the call
        closed), or None when the body goes on. Each character is looked at a bounded number of times: the
        body so far is kept in parts, and only the marker's length of it is searched again (a body
        re-scanned whole at every piece was quadratic: 3 s for 248 KB streamed)."""
        end = self.end
        if self._body_parts:  # the end marker may straddle what came before and this piece
            tail = self._tail
            window = tail + buffer[pos:pos + len(end) - 1]
            j = window.find(end)
            if 0 <= j < len(tail):
                body = "".join(self._body_parts)
                self._close_body(body[:len(body) - len(tail) + j], result)
                return pos + j + len(end) - len(tail)
        at = buffer.find(end, pos)
        if at < 0:
            piece = buffer[pos:]
            self._body_parts.append(piece)
            self._body_chars += len(piece)
            self._tail = (self._tail + piece[-(len(end) - 1):])[-(len(end) - 1):]
            if self._body_chars > CALL_BODY_CHARS_MAX:
                # Longer than any call: not one. What came is content, and so is what follows.
                self._emit(result, self.start + "".join(self._body_parts))
                self._inside, self._body_parts, self._body_chars, self._tail = False, [], 0, ""
                return len(buffer)
            return None
        self._close_body("".join(self._body_parts) + buffer[pos:at], result)
        return at + len(end)

    def _close_body(self, body: str, result: ToolCallResult) -> None:
        self._body_parts, self._body_chars, self._tail = [], 0, ""
        self._close(body, result, ended=True)

    def finish(self) -> ToolCallResult:
        result = ToolCallResult()
        if self._inside:  # the generation ended inside a call
            body = "".join(self._body_parts)
            self._body_parts, self._body_chars, self._tail = [], 0, ""
            self._close(body, result, ended=False)
        elif not (self._after_call and self._ends_space and not self._buffer.strip()):
            self._emit(result, self._buffer)  # (whitespace after a last removed call is layout, as above)
        self._buffer = ""
        return result

    def _close(self, body: str, result: ToolCallResult, ended: bool) -> None:
        self._inside = False
        calls = self.decode_body(body)
        if calls is not None and self.tool_names is not None and any(c.name not in self.tool_names for c in calls):
            calls = None
        self._after_call = calls is not None
        if calls is None:  # not a call after all: the text stays what the model wrote
            self._emit(result, self.start + body + (self.end if ended else ""))
        else:
            result.calls += calls


class TrailingCallsParser(ToolCallParser):
    """Calls that, once they start, run to the end of the answer.

    They start at one of ``markers`` anywhere in the text, or at one of ``openers`` when that is
    the answer's first non-space text. Text before is content as it streams; from the start on,
    everything is held and parsed at ``finish`` by ``decode`` (the held text, markers removed) into
    calls, or kept as the text it was when it is not calls.
    """

    markers: tuple[str, ...] = ()
    openers: tuple[str, ...] = ()

    def __init__(self, tools: "Iterable[str] | Iterable[dict[str, Any]] | ToolSet | None" = None) -> None:
        self.tools = ToolSet.of(tools)
        self.tool_names = self.tools.names if self.tools is not None else None
        self._buffer = ""
        self._held: list[str] = []  # from the start of the calls on, as it arrived
        self._started = False
        self._seen_text = False  # something other than whitespace went out as content

    def feed(self, text: str) -> ToolCallResult:
        if self._started:
            self._held.append(text)  # joined once at the end: += on a growing string is quadratic
            return ToolCallResult()
        buffer = self._buffer + text
        at = min((i for i in (buffer.find(m) for m in self.markers) if i >= 0), default=-1)
        if at < 0 and not self._seen_text and self.openers:
            stripped = buffer.lstrip()
            if any(stripped.startswith(o) for o in self.openers):
                at = len(buffer) - len(stripped)
            elif any(o.startswith(stripped) for o in self.openers):
                self._buffer = buffer  # only whitespace, or an opener still arriving
                return ToolCallResult()
        if at >= 0:
            self._started = True
            self._held = [buffer[at:]]
            self._buffer = ""
            return ToolCallResult(content=buffer[:at])
        keep = max((held_back(buffer, m) for m in self.markers), default=0)
        content = buffer[:len(buffer) - keep]
        self._buffer = buffer[len(buffer) - keep:]
        self._seen_text = self._seen_text or bool(content.strip())
        return ToolCallResult(content=content)

    def finish(self) -> ToolCallResult:
        held, self._buffer = "".join(self._held) if self._started else self._buffer, ""
        self._held = []
        if not self._started:
            return ToolCallResult(content=held)
        calls = self.decode(held)
        if calls is None or (self.tool_names is not None and any(c.name not in self.tool_names for c in calls)):
            return ToolCallResult(content=held)
        return ToolCallResult(calls=calls)

    @abc.abstractmethod
    def decode(self, held: str) -> "list[ToolCall] | None":
        """The calls in the held text (its marker included), or None when it is not calls."""


def _json_calls(text: str) -> "list[ToolCall] | None":
    try:
        return calls_from_json(_JSON.decode(text))
    except ValueError:
        return None


class LlamaJsonParser(TrailingCallsParser):
    markers = spellings = ("<|python_tag|>",)
    openers = ("{",)

    def decode(self, held: str) -> "list[ToolCall] | None":
        body = held.removeprefix("<|python_tag|>").strip()
        calls: list[ToolCall] = []
        for part in _split_top_level(body, ";"):
            found = _json_calls(part)
            if found is None:
                return None
            calls += found
        return calls or None


class MistralParser(TrailingCallsParser):
    markers = ("[TOOL_CALLS]",)
    spellings = ("[TOOL_CALLS]", "[ARGS]")

    # [TOOL_CALLS]name[ARGS]{...} or [TOOL_CALLS]name{...}: the newer tokenizers' form.
    _NAMED = re.compile(r"\s*([A-Za-z0-9_.:-]{1,64})\s*(?:\[ARGS\])?\s*(?=[{])")

    def decode(self, held: str) -> "list[ToolCall] | None":
        parts = [p for p in held.split("[TOOL_CALLS]") if p.strip()]
        calls: list[ToolCall] = []
        for part in parts:
            stripped = part.strip()
            if stripped.startswith("["):
                found = _json_calls(stripped)
            else:
                found = self._named_calls(stripped)
            if found is None:
                return None
            calls += found
        return calls or None

    def _named_calls(self, text: str) -> "list[ToolCall] | None":
        calls = []
        decoder = _JSON
        at = 0
        while at < len(text):
            match = self._NAMED.match(text, at)
            if match is None:
                return None
            try:
                arguments, end = decoder.raw_decode(text, match.end())
            except ValueError:
                return None
            if not isinstance(arguments, dict):
                return None
            calls.append(ToolCall(match.group(1), json.dumps(arguments, ensure_ascii=False)))
            at = end
            while at < len(text) and text[at] in " \n\t,":
                at += 1
        return calls or None


def _pythonic_calls(text: str) -> "list[ToolCall] | None":
    """``[f(a=1, b="x"), g()]``: calls with keyword arguments of Python literals; None when it is not that."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
            # Literals JSON has no word for ({1, 2}, b"x", 1j, 1e999) make it not a call: they raised
            # out of the parser before (a TypeError for a set, an unhashable key).
            text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
        if len(arguments) != len(node.keywords):
            return None  # **kwargs
        calls.append(ToolCall(node.func.id, text))
    return calls


class PythonicParser(TaggedParser):
    """Llama 4's calls: ``<|python_start|>[f(a=1)]<|python_end|>`` anywhere in the text (the text around them is
    content, the markers never are), and bare ``[f(a=1), g()]`` lists anywhere in the text too (Llama 3.2
    pythonic writes only those; Llama 4 writes them without markers as well, between sentences: smg's and
    SGLang's parsers take them, vLLM's only at the answer's start).

    A bare list is held from its ``[`` only while it may be one: ``[`` then a name then ``(``; then to the
    ``]`` that balances it (brackets inside strings do not count), where it is calls or, when it does not
    parse as calls of offered functions, the text it was. Each character is looked at once."""

    start = "<|python_start|>"
    end = "<|python_end|>"
    spellings = (start, end)
    # What may still open a call list, and what surely does.
    _MAY_OPEN = re.compile(r"\[\s*(?:[A-Za-z_]\w*\s*)?")
    _OPENS = re.compile(r"\[\s*[A-Za-z_]\w*\s*\(")
    _OPENER_CHARS_MAX = 256  # "[", whitespace, a name: no call list opens with more
    _SIGNIFICANT = re.compile(r"[][(){}'\"\\]")

    def __init__(self, tools: "Iterable[str] | Iterable[dict[str, Any]] | ToolSet | None" = None) -> None:
        super().__init__(tools)
        self._pending = ""  # a "[" at the end of the text that may still open a list (< _OPENER_CHARS_MAX)
        self._list: list[str] | None = None  # the list being read, from its "[", as it arrived
        self._list_chars = 0
        self._depth = 0
        self._quote = ""  # the quote character of the string the list is in, if any
        self._escaped = False
        self._after_list = False  # only whitespace since a removed list
        self._layout = ""  # that whitespace: the list's layout when the text before it ended with a space

    def _emit(self, result: ToolCallResult, text: str) -> None:
        """Content from the marker scan: bare lists in it are calls too."""
        if self._pending:
            text, self._pending = self._pending + text, ""
        pos = 0
        while pos < len(text):
            if self._list is not None:
                pos = self._read_list(text, pos, result)
                continue
            if self._after_list:
                rest = len(text) - len(text[pos:].lstrip())
                self._layout += text[pos:rest]
                if rest == len(text):
                    return  # only whitespace yet: whether it is layout depends on what follows
                pos, layout, self._layout, self._after_list = rest, self._layout, "", False
                if not (self._ends_space or text[pos] == "["):
                    super()._emit(result, layout)
            at = text.find("[", pos)
            if at < 0:
                super()._emit(result, text[pos:])
                return
            super()._emit(result, text[pos:at])
            head = text[at:at + self._OPENER_CHARS_MAX]
            if self._OPENS.match(head):
                self._list, self._list_chars, self._depth, self._quote, self._escaped = [], 0, 0, "", False
                pos = at
            elif len(head) < self._OPENER_CHARS_MAX and self._MAY_OPEN.fullmatch(head):
                self._pending = head  # the text ended where it may still become a list: wait
                return
            else:
                super()._emit(result, "[")  # not a call list: its "[" is text, what follows is scanned
                pos = at + 1

    def _read_list(self, text: str, pos: int, result: ToolCallResult) -> int:
        """Reads the list from ``text[pos:]`` to the bracket that balances its "["; where the text goes on."""
        assert self._list is not None
        end = self._balancing(text, pos)
        piece = text[pos:] if end < 0 else text[pos:end + 1]
        self._list.append(piece)
        self._list_chars += len(piece)
        if end >= 0:
            self._close_list(result)
            return end + 1
        if self._list_chars > CALL_BODY_CHARS_MAX:  # longer than any call: text
            held, self._list = "".join(self._list), None
            super()._emit(result, held)
        return len(text)

    def _balancing(self, text: str, pos: int) -> int:
        """The index in ``text`` of the bracket that closes the list, or -1; brackets in strings do not count."""
        for match in self._SIGNIFICANT.finditer(text, pos):
            char = match.group()
            if self._escaped:
                self._escaped = False
            elif self._quote:
                if char == "\\":
                    self._escaped = True
                elif char == self._quote:
                    self._quote = ""
            elif char in "'\"":
                self._quote = char
            elif char in "[({":
                self._depth += 1
            elif char in "])}":
                self._depth -= 1
                if self._depth == 0:
                    return match.start()
        return -1

    def _close_list(self, result: ToolCallResult) -> None:
        held, self._list = "".join(self._list or ()), None
        calls = _pythonic_calls(held)
        if calls is None or (self.tool_names is not None and any(c.name not in self.tool_names for c in calls)):
            super()._emit(result, held)  # not calls: the text the model wrote
            return
        result.calls += calls
        self._after_list = True

    def finish(self) -> ToolCallResult:
        result = super().finish()
        held = self._pending + "".join(self._list or ())
        if held:  # cut short: what came is text (a list that never closed is not calls)
            super()._emit(result, held)
        elif self._after_list and not self._ends_space:
            super()._emit(result, self._layout)
        self._pending, self._list, self._layout, self._after_list = "", None, "", False
        return result

    def decode_body(self, body: str) -> "list[ToolCall] | None":
        return _pythonic_calls(body)


class JsonParser(TrailingCallsParser):
    openers = ("{", "[")

    def decode(self, held: str) -> "list[ToolCall] | None":
        return _json_calls(held.strip())


class RequiredCallsParser(JsonParser):
    """The answer to ``tool_choice: "required"``: constrained decoding made it a JSON array of calls. Cut short
    (max_tokens), the array does not parse: the calls it completed are returned, and never the array's text as
    content (issue 34: the raw JSON came back as the message's content)."""

    def finish(self) -> ToolCallResult:
        held = "".join(self._held) if self._started else self._buffer
        result = super().finish()
        if result.calls or not held.strip():
            return result
        calls = [c for c in _complete_array_calls(held) if self.tool_names is None or c.name in self.tool_names]
        return ToolCallResult(calls=calls)


def _complete_array_calls(text: str) -> list[ToolCall]:
    """The whole call objects at the start of a JSON array that was cut short."""
    decoder, calls = _JSON, []
    at = text.find("[") + 1
    while at:
        while at < len(text) and text[at] in " \n\t\r,":
            at += 1
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            break
        found = calls_from_json(value)
        if found is None:
            break
        calls += found
    return calls


class NamedArgumentsParser(TrailingCallsParser):
    """The answer to a named ``tool_choice``: constrained decoding made it the function's arguments
    object, so the whole answer is one call of that function. Cut short, it is no call and no content: the
    constraint's half-written object is not text the model meant (finish_reason says length)."""

    openers = ("{",)

    def __init__(self, name: str) -> None:
        super().__init__([name])
        self.name = name

    def decode(self, held: str) -> "list[ToolCall] | None":
        arguments = _arguments_json(held.strip())
        return None if arguments is None else [ToolCall(self.name, arguments)]

    def finish(self) -> ToolCallResult:
        result = super().finish()
        return result if result.calls else ToolCallResult()


def _arguments_json(text: str) -> "str | None":
    """Arguments given as a JSON object's text: normalized, or None when they are not one."""
    try:
        value = _JSON.decode(text)
    except ValueError:
        return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


_SPACES = re.compile(r"\s*")

# Python's spelling of JSON's words: GLM writes them in its values (SGLang and smg read them as these too).
_PYTHON_WORDS: dict[str, Any] = {"True": True, "False": False, "None": None}


def _typed(value: str, schema: "dict[str, Any] | None") -> Any:
    """A parameter's value, written as text by the model, typed by its JSON Schema: a string stays the
    text; numbers, booleans, null, objects and arrays are read as JSON (the text when that fails). With
    no schema, JSON when it reads as JSON and the text otherwise. True, False and None are JSON's words
    unless the value is a string."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return value
    word = value.strip()
    if word in _PYTHON_WORDS:
        return _PYTHON_WORDS[word]
    if kind == "boolean" and word.lower() in ("true", "false"):
        return word.lower() == "true"
    try:
        return _JSON.decode(value)
    except ValueError:
        return value


class DeepSeekV3Parser(TaggedParser):
    """<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>
    ... <｜tool▁calls▁end｜> (DeepSeek V3)."""

    start = "<｜tool▁calls▁begin｜>"
    end = "<｜tool▁calls▁end｜>"
    spellings = (start, end, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>")
    # One call, up to (not including) its end marker, whitespace around it allowed.
    _CALL = re.compile(r"\s*<｜tool▁call▁begin｜>\s*(?:\w+)?\s*<｜tool▁sep｜>\s*(?P<name>[^\n`]+?)\s*\n"
                       r"```(?:json)?\s*\n?(?P<args>.*?)\s*```\s*", re.S)
    _CALL_END = "<｜tool▁call▁end｜>"

    def decode_body(self, body: str) -> "list[ToolCall] | None":
        return _regex_calls(self._CALL, body, self._CALL_END)


class DeepSeekV31Parser(DeepSeekV3Parser):
    """<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜> in the same section (DeepSeek V3.1, V3.2-Exp)."""

    _CALL = re.compile(r"\s*<｜tool▁call▁begin｜>\s*(?P<name>[^<]+?)\s*<｜tool▁sep｜>\s*(?P<args>.*?)\s*", re.S)


class KimiK2Parser(TaggedParser):
    """<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}
    <|tool_call_end|>...<|tool_calls_section_end|> (Kimi K2; NAME may hold hyphens and dots)."""

    start = "<|tool_calls_section_begin|>"
    end = "<|tool_calls_section_end|>"
    spellings = (start, end, "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
    _CALL = re.compile(r"<\|tool_call_begin\|>\s*(?P<id>[^<\s]+?)\s*<\|tool_call_argument_begin\|>\s*"
                       r"(?P<args>.*?)\s*", re.S)

    def decode_body(self, body: str) -> "list[ToolCall] | None":
        calls = []
        # Each call ends at its marker: cut there first, then one anchored match per piece (linear, as
        # _regex_calls); what is around the calls is ignored, as the format's own parsers do.
        for piece in body.split("<|tool_call_end|>")[:-1]:
            begin = piece.find("<|tool_call_begin|>")
            match = self._CALL.fullmatch(piece, begin) if begin >= 0 else None
            if match is None:
                continue
            call_id = match.group("id")  # functions.get_weather:0
            name = call_id.rsplit(":", 1)[0].removeprefix("functions.")
            arguments = _arguments_json(match.group("args"))
            if not name or arguments is None:
                return None
            calls.append(ToolCall(name, arguments))
        return calls or None


class Glm45Parser(TaggedParser):
    """<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>, with or without
    newlines between the parts (GLM-4.5, GLM-4.6, GLM-4.7); values typed by the tool's schema."""

    spellings = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    _NAME = re.compile(r"\s*([^<\s]+)\s*")

    def decode_body(self, body: str) -> "list[ToolCall] | None":
        """The name, then ``<arg_key>K</arg_key><arg_value>V</arg_value>`` pairs, read by finding each marker
        from where the last one ended: linear. (A regex with two lazy groups backtracked over every later
        </arg_key>: 8.6 s for 248 KB of unclosed values.)"""
        match = self._NAME.match(body)
        if match is None:
            return None
        name, at, arguments = match.group(1), match.end(), {}
        properties = self._properties(name)
        while at < len(body):
            key_start = _after_marker(body, at, "<arg_key>")
            key_end = body.find("</arg_key>", key_start) if key_start >= 0 else -1
            value_start = _after_marker(body, key_end + len("</arg_key>"), "<arg_value>") if key_end >= 0 else -1
            value_end = self._value_end(body, value_start) if value_start >= 0 else -1
            if value_end < 0:
                return None
            key = body[key_start:key_end].strip()
            arguments[key] = _typed(body[value_start:value_end], properties.get(key))
            at = value_end + len("</arg_value>")
            while at < len(body) and body[at].isspace():
                at += 1
        return [ToolCall(name, json.dumps(arguments, ensure_ascii=False))]

    @staticmethod
    def _value_end(body: str, start: int) -> int:
        """Where the value from ``start`` ends: at the ``</arg_value>`` followed by the next key or the end
        of the call, so a value that writes the marker itself ("use </arg_value> in docs") stays whole, as
        smg reads it. Each search goes on from the last: linear."""
        at = body.find("</arg_value>", start)
        while at >= 0:
            after = at + len("</arg_value>")
            next_at = _SPACES.match(body, after).end()  # type: ignore[union-attr]
            if next_at == len(body) or body.startswith("<arg_key>", next_at):
                return at
            at = body.find("</arg_value>", after)
        return -1

    def _properties(self, name: str) -> dict[str, Any]:
        schema = self.tools.schemas.get(name, {}) if self.tools is not None else {}
        properties = schema.get("properties")
        return properties if isinstance(properties, dict) else {}

    def _xml_calls(self, body: str, function_re: "re.Pattern[str]", param_re: "re.Pattern[str]"
                   ) -> "list[ToolCall] | None":
        """Calls written as XML-like elements, one after the other: ``function_re`` matches one (groups
        name, params), ``param_re`` one parameter in it (groups key, value, and optionally string: "true"
        for a value that is text as it is, "false" for JSON). Anything else between them: not calls."""
        calls, at = [], 0
        while at < len(body):
            function = function_re.match(body, at)
            if function is None:
                return None if body[at:].strip() else calls or None
            name, params, arguments = function.group("name").strip(), function.group("params"), {}
            properties = self._properties(name)
            inner = 0
            while inner < len(params):
                param = param_re.match(params, inner)
                if param is None:
                    if params[inner:].strip():
                        return None
                    break
                key, value, string = param.group("key").strip(), param.group("value"), param.groupdict().get("string")
                arguments[key] = value if string == "true" else _typed(value, None if string else properties.get(key))
                inner = param.end()
            calls.append(ToolCall(name, json.dumps(arguments, ensure_ascii=False)))
            at = function.end()
        return calls or None


class QwenXmlParser(Glm45Parser):
    """<tool_call><function=NAME><parameter=K>V</parameter>...</function></tool_call> (Qwen3-Coder, Qwen3.5);
    values typed by the tool's schema, the newline the model writes around a value not part of it."""

    spellings = TaggedParser.spellings
    _FUNCTION = re.compile(r"\s*<function=(?P<name>[^>]+)>(?P<params>.*?)</function>\s*", re.S)
    _PARAM = re.compile(r"\s*<parameter=(?P<key>[^>]+)>\n?(?P<value>.*?)\n?</parameter>\s*", re.S)

    def decode_body(self, body: str) -> "list[ToolCall] | None":
        return self._xml_calls(body, self._FUNCTION, self._PARAM)


class InvokeParser(Glm45Parser):
    """Calls written as ``<invoke name="NAME"><parameter name="K">V</parameter>...</invoke>`` between a
    section's markers, several per section; values typed by the tool's schema (``_typed``).

    minimax_m2    <minimax:tool_call><invoke name=..><parameter name=..>V</parameter></invoke>...</minimax:tool_call>
    step3         <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=..>
                  <steptml:parameter name=..>V</steptml:parameter></steptml:invoke><｜tool_call_end｜>...<｜tool_calls_end｜>
    deepseek32    <｜DSML｜function_calls><｜DSML｜invoke name=..><｜DSML｜parameter name=.. string="true|false">V
                  </｜DSML｜parameter></｜DSML｜invoke>...</｜DSML｜function_calls> (string="false": V is JSON)
    """

    start = "<minimax:tool_call>"
    end = "</minimax:tool_call>"
    spellings = (start, end)
    prefix = ""  # of the invoke and parameter tags
    wrappers: tuple[str, ...] = ()  # per-call markers around an invoke, dropped

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._compile()

    @classmethod
    def _compile(cls) -> None:
        p = re.escape(cls.prefix)
        cls._INVOKE = re.compile(rf'\s*<{p}invoke name="(?P<name>[^"]+)">(?P<params>.*?)</{p}invoke>\s*', re.S)
        cls._PARAM = re.compile(rf'\s*<{p}parameter name="(?P<key>[^"]+)"(?:\s+string="(?P<string>true|false)")?>'
                                rf'\n?(?P<value>.*?)\n?</{p}parameter>\s*', re.S)

    def decode_body(self, body: str) -> "list[ToolCall] | None":
        for wrapper in self.wrappers:
            body = body.replace(wrapper, "")
        return self._xml_calls(body, self._INVOKE, self._PARAM)


InvokeParser._compile()


class Step3Parser(InvokeParser):
    start = "<｜tool_calls_begin｜>"
    end = "<｜tool_calls_end｜>"
    spellings = (start, end, "<｜tool_call_begin｜>", "<｜tool_call_end｜>", "<｜tool_sep｜>")
    prefix = "steptml:"
    wrappers = ("<｜tool_call_begin｜>function<｜tool_sep｜>", "<｜tool_call_begin｜>", "<｜tool_call_end｜>")


class DeepSeekV32Parser(InvokeParser):
    start = "<｜DSML｜function_calls>"
    end = "</｜DSML｜function_calls>"
    spellings = (start, end)
    prefix = "｜DSML｜"


class CohereParser(TaggedParser):
    """<|START_ACTION|>[{"tool_call_id": "0", "tool_name": NAME, "parameters": {...}}, ...]<|END_ACTION|>
    (Cohere Command R7B, Command A)."""

    start = "<|START_ACTION|>"
    end = "<|END_ACTION|>"
    spellings = (start, end)

    def decode_body(self, body: str) -> "list[ToolCall] | None":
        try:
            items = _JSON.decode(body)
        except ValueError:
            return None
        if isinstance(items, dict):
            items = [items]
        if not isinstance(items, list):
            return None
        renamed = [{"name": i.get("tool_name"), "arguments": i.get("parameters", {})} if isinstance(i, dict) else i
                   for i in items]
        return calls_from_json(renamed)


def _after_marker(text: str, at: int, marker: str) -> int:
    """Where ``text`` goes on after ``marker``, when only whitespace comes before it from ``at``; else -1."""
    while at < len(text) and text[at].isspace():
        at += 1
    return at + len(marker) if text.startswith(marker, at) else -1


def _regex_calls(pattern: "re.Pattern[str]", body: str, call_end: str) -> "list[ToolCall] | None":
    """Calls one after the other, each ending at ``call_end``: the body is cut at those markers first (one
    pass), and each piece must be one whole call (``pattern.fullmatch``, which looks at that piece alone). A
    pattern searched over the whole body retried every later marker from each call's start: quadratic."""
    pieces = body.split(call_end)
    if pieces.pop().strip():
        return None  # something after the last call that is not a call
    calls = []
    for piece in pieces:
        match = pattern.fullmatch(piece)
        if match is None:
            return None
        arguments = _arguments_json(match.group("args"))
        if arguments is None:
            return None
        calls.append(ToolCall(match.group("name").strip(), arguments))
    return calls or None


def _split_top_level(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` where it is outside strings, objects and arrays."""
    parts, depth, in_string, escaped, start = [], 0, False, False, 0
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


# The formats, by smg's names (vLLM's and SGLang's as aliases). Each says its format and the models that write it
# (docs/apis.md), and which models get it when the operator names none (choice.py): model ids containing one of its
# ``ids`` (lower case; the longest match of any parser wins), else an engine-reported ``architectures`` entry.
TOOL_CALL_PARSERS: Registry[Callable[..., ToolCallParser]] = Registry("tool-call parser", off=("passthrough", "none"))
TOOL_CALL_PARSERS.add("qwen", TaggedParser, "`<tool_call>{json}</tool_call>`", aliases=("qwen25", "hermes"),
                      models="Qwen2.5, Qwen3, QwQ, Hermes", ids=("qwen", "qwq", "hermes"),
                      architectures=("qwen2forcausallm", "qwen3forcausallm", "qwen3moeforcausallm"))
TOOL_CALL_PARSERS.add("qwen_coder", QwenXmlParser, "`<function=NAME><parameter=K>V</parameter>`",
                      aliases=("qwen_xml", "qwen3_coder"), models="Qwen3-Coder, Qwen3.5", ids=("qwen3-coder", "qwen3.5"))
TOOL_CALL_PARSERS.add("llama", LlamaJsonParser, "`{\"name\", \"parameters\"}`, `<\\|python_tag\\|>`",
                      aliases=("llama3", "llama3_json"), models="Llama 3.1-3.3", ids=("llama-3", "llama3"),
                      architectures=("llamaforcausallm",))
TOOL_CALL_PARSERS.add("pythonic", PythonicParser, "`[f(a=1), g()]` anywhere in the text, bare or between "
                      "`<\\|python_start\\|>` and `<\\|python_end\\|>`", models="Llama 4, Llama 3.2 pythonic",
                      ids=("llama-4", "llama4"), architectures=("llama4forconditionalgeneration",))
TOOL_CALL_PARSERS.add("mistral", MistralParser, "`[TOOL_CALLS] [...]`, `[TOOL_CALLS]name[ARGS]{...}`",
                      models="Mistral, Mixtral", ids=("mistral", "mixtral"), architectures=("mistralforcausallm",))
TOOL_CALL_PARSERS.add("deepseek", DeepSeekV3Parser, "`<｜tool▁calls▁begin｜>` sections, a fenced JSON body",
                      aliases=("deepseekv3", "deepseek_v3"), models="DeepSeek V3, R1", ids=("deepseek-v3", "deepseek-r1"),
                      architectures=("deepseekv3forcausallm",))
TOOL_CALL_PARSERS.add("deepseek31", DeepSeekV31Parser, "`<｜tool▁calls▁begin｜>` sections, NAME`<｜tool▁sep｜>`{json}",
                      aliases=("deepseekv31", "deepseek_v31"), models="DeepSeek V3.1", ids=("deepseek-v3.1",))
TOOL_CALL_PARSERS.add("kimik2", KimiK2Parser, "`<\\|tool_calls_section_begin\\|>`", aliases=("kimi_k2",),
                      models="Kimi K2", ids=("kimi-k2",))
TOOL_CALL_PARSERS.add("glm45_moe", Glm45Parser, "`<arg_key>`/`<arg_value>`", aliases=("glm45", "glm"),
                      models="GLM-4.5, GLM-4.6", ids=("glm-4.5", "glm-4.6"), architectures=("glm4moeforcausallm",))
TOOL_CALL_PARSERS.add("glm47_moe", Glm45Parser, "`<arg_key>`/`<arg_value>`", models="GLM-4.7", ids=("glm-4.7",))
TOOL_CALL_PARSERS.add("minimax_m2", InvokeParser, "`<minimax:tool_call><invoke name=..><parameter name=..>`",
                      aliases=("minimax",), models="MiniMax-M2", ids=("minimax-m2",),
                      architectures=("minimaxm2forcausallm",))
TOOL_CALL_PARSERS.add("step3", Step3Parser, "`<｜tool_calls_begin｜>` + `<steptml:invoke>`", models="Step-3",
                      ids=("step3", "step-3"), architectures=("step3vlforconditionalgeneration",))
TOOL_CALL_PARSERS.add("deepseek32", DeepSeekV32Parser, "`<｜DSML｜function_calls>` (DSML)",
                      aliases=("deepseekv32", "deepseek_v32"), models="DeepSeek V3.2", ids=("deepseek-v3.2",),
                      architectures=("deepseekv32forcausallm",))
TOOL_CALL_PARSERS.add("cohere", CohereParser, "`<\\|START_ACTION\\|>[{\"tool_name\", \"parameters\"}]`",
                      models="Command R7B, Command A", ids=("command-r", "command-a"), architectures=("cohere2forcausallm",))
TOOL_CALL_PARSERS.add("json", JsonParser, "the whole answer a JSON call", models="constrained output")
# gpt-oss's harmony format registers itself in harmony.py.


def tool_call_parser(name: str, tools: "Iterable[str] | Iterable[dict[str, Any]] | ToolSet | None" = None
                     ) -> ToolCallParser:
    """A new parser (one per generation) of the format ``name``, for the functions ``tools`` offers (names or
    OpenAI tool objects; None: any name); KeyError for a name we do not know."""
    return TOOL_CALL_PARSERS[name](tools)

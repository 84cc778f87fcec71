"""A chat answer through its model's parsers: reasoning apart, tool calls out, in OpenAI's shape.

Only when a parser applies to the request (the model has a reasoning parser and the request
does not turn separation off, the request offers tools with ``tool_choice`` auto and the
model has a tool-call parser, or ``tool_choice`` is ``required`` or a named function, whose
constrained answer is JSON); otherwise the answer is the text as it is, on the usual path.

Non-streamed: ``message`` with ``content``, ``reasoning_content`` (the name DeepSeek, SGLang and
smg use; vLLM's newer ``reasoning`` is not added, which would double every reasoning delta) and ``tool_calls`` (ids ``call_`` + 24 hex digits, unique per response). Streamed:
the same as deltas, in order; a call is sent once whole, as two deltas (index, id, type and
name first, then its arguments). Content that is only whitespace is ``null`` when calls were
made; streamed, such whitespace is held until other content comes, and dropped if none does,
so the assembled stream equals the non-streamed answer. ``finish_reason`` is ``tool_calls``
when calls were made and the engine stopped by itself (``stop`` for a named ``tool_choice``, as
OpenAI answers a forced function).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from ..generation import GenerationResult
from ..tracing.context import CURRENT, step
from ..parsers import (
    HarmonyParser,
    NamedArgumentsParser,
    ReasoningParser,
    RequiredCallsParser,
    ToolCall,
    ToolCallParser,
    is_harmony,
    thinks,
    reasoning_parser,
    tool_call_parser,
)
from .http import sse_event


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class ChatOutput:
    def __init__(self, shape: Any, tools: ToolCallParser | None, reasoning: ReasoningParser | None,
                 calls_finish: str = "tool_calls", stream_reasoning: bool = True,
                 count_tokens: "Callable[[str], int] | None" = None, reasoning_end_id: int | None = None) -> None:
        self.shape = shape
        self.tools = tools
        self.reasoning = reasoning
        self.stream_reasoning = stream_reasoning
        self._held_reasoning = ""  # reasoning not streamed yet (stream_reasoning false)
        # usage.completion_tokens_details.reasoning_tokens: the output tokens up to the end marker's id
        # when it is one token, else the reasoning text counted by the tokenizer (kept for that).
        self.reasoning_end_id = reasoning_end_id
        self.count_tokens = count_tokens
        self._reasoning_text: "list[str] | None" = [] if reasoning_end_id is None and count_tokens else None
        # The tool-call parser says the reasoning too (harmony): reasoning_content comes from it.
        self.reasoning_in_tools = tools is not None and tools.handles_reasoning
        self.logprobs: Any = None  # a LogprobShape when the request asks for logprobs (api/logprobs.py)
        self.index = 0  # which of the request's answers (n > 1)
        self._last_reasoning = ""  # the reasoning of the last whole answer (reasoning_tokens)
        self.calls_finish = calls_finish  # the finish_reason of an answer with calls that stopped by itself
        # The parsers' markers, kept by the detokenizer even where they are special tokens.
        self.kept_special = frozenset((tools.spellings if tools is not None else ()) +
                                      (reasoning.spellings if reasoning is not None else ()))
        self._calls = 0
        self._content_seen = False  # content other than whitespace went out
        self._pending_space = ""  # whitespace-only content held (streamed)
        # Inside a traced request, a stream's parsing as [first ns, last ns, ns spent, pieces]; False untraced;
        # None until the first piece says which.
        self._parse_trace: "list[int] | bool | None" = None

    @classmethod
    def for_request(cls, shape: Any, entry: Any, chat: Any) -> "ChatOutput | None":
        tools, calls_finish = None, "tool_calls"
        if chat.tool_choice == "required":  # constrained to a JSON array of calls (api/structured.py)
            tools = RequiredCallsParser(chat.tools)
        elif chat.tool_choice == "named":  # constrained to the function's arguments; OpenAI says "stop"
            tools, calls_finish = NamedArgumentsParser(chat.tool_name), "stop"
        elif (entry.tool_call_parser or entry.reasoning_parser) and (
                is_harmony(entry.tool_call_parser) or is_harmony(entry.reasoning_parser)):
            # gpt-oss: every answer is harmony messages, tools or not; calls only of offered functions
            tools = HarmonyParser(chat.tools if chat.tool_choice == "auto" and chat.tools else (),
                                  separate_reasoning=chat.separate_reasoning and chat.thinking)
        elif chat.tools and chat.tool_choice == "auto" and entry.tool_call_parser is not None:
            tools = tool_call_parser(entry.tool_call_parser, chat.tools)
        reasoning = None
        if (entry.reasoning_parser is not None and chat.separate_reasoning and chat.thinking
                and thinks(entry.reasoning_parser, chat.template_kwargs)
                and not (tools is not None and tools.handles_reasoning)):
            reasoning = reasoning_parser(entry.reasoning_parser)
        if tools is None and reasoning is None:
            return None
        count_tokens = end_id = None
        if reasoning is not None and entry.tokenizer is not None:
            end_id = entry.tokenizer.token_to_id(reasoning.end)
            count_tokens = entry.tokenizer.count_tokens
        elif tools is not None and tools.handles_reasoning and entry.tokenizer is not None:
            count_tokens = entry.tokenizer.count_tokens
        return cls(shape, tools, reasoning, calls_finish, chat.stream_reasoning, count_tokens, end_id)

    # -- one answer ----------------------------------------------------------------------

    def full(self, text: str, result: GenerationResult) -> dict[str, Any]:
        with step("parse"):  # (a span only inside a traced request)
            reasoning_text, text, calls = self._parsed(text)
        message: dict[str, Any] = {"role": "assistant", "content": None if calls and not text.strip() else text}
        if self.reasoning is not None or self.reasoning_in_tools:
            message["reasoning_content"] = reasoning_text
        if calls:
            message["tool_calls"] = [{"id": new_call_id(), "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        body = self.shape.full(text, result)
        self._last_reasoning = reasoning_text or ""
        self._add_reasoning_tokens(body["usage"], result, reasoning_text or "")
        choice = body["choices"][0]
        choice["message"] = message
        choice["finish_reason"] = self._finish_reason(result, bool(calls))
        return body

    def _parsed(self, text: str) -> "tuple[str | None, str, list[ToolCall]]":
        """(reasoning, content, calls) of a whole answer, through the parsers that apply."""
        reasoning_text = None
        if self.reasoning is not None:
            parsed = self.reasoning.parse(text)
            reasoning_text, text = parsed.reasoning or None, parsed.content
        calls: list[ToolCall] = []
        if self.tools is not None:
            found = self.tools.parse(text)
            text, calls = found.content, found.calls
            if self.reasoning_in_tools:
                reasoning_text = found.reasoning or None
        return reasoning_text, text, calls

    # -- a stream ------------------------------------------------------------------------

    def text_event(self, text: str, first: bool) -> bytes:
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}] if first else []
        self._step(text, deltas, final=False)
        return self._events(deltas)

    def deltas(self, text: str, final: bool) -> "list[dict[str, Any]]":
        """The chat deltas a piece of text decides (the last piece with ``final``): for shapers of other
        APIs (anthropic.py), in the order a chat stream would send them."""
        deltas: list[dict[str, Any]] = []
        self._step(text, deltas, final)
        if final:
            if self._pending_space and (self._content_seen or not self._calls):
                deltas.append({"content": self._pending_space})
            self._pending_space = ""
        return deltas

    def final_events(self, result: GenerationResult, include_usage: bool) -> bytes:
        deltas = self.deltas("", final=True)
        finish = self.shape.chunk(None, self._finish_reason(result, bool(self._calls)), index=self.index)
        if self.logprobs is not None:
            finish["choices"][0]["logprobs"] = self.logprobs.unsent()
        out = self._events(deltas) + sse_event(finish)
        if not include_usage:
            return out
        usage = self.shape.usage_chunk(result)
        self._add_reasoning_tokens(usage["usage"], result, "".join(self._reasoning_text or ()))
        return out + sse_event(usage)

    def _step(self, text: str, deltas: "list[dict[str, Any]]", final: bool) -> None:
        if self._parse_trace is None:
            self._parse_trace = CURRENT.get() is not None and [0, 0, 0, 0]  # first ns, last ns, total ns, pieces
        if not self._parse_trace:
            self._parse(text, deltas, final)
            return
        started = time.perf_counter_ns()
        self._parse(text, deltas, final)
        ended = time.perf_counter_ns()
        timing = self._parse_trace
        timing[0] = timing[0] or time.time_ns() - (ended - started)
        timing[1], timing[2], timing[3] = time.time_ns(), timing[2] + ended - started, timing[3] + 1
        if final:  # a streamed answer's parsing: one span over its pieces (a whole answer's is a step, full())
            CURRENT.get().record("parse", timing[0], timing[1], {"smg.parse_s": timing[2] / 1e9,
                                                                 "smg.parse_pieces": timing[3]})

    def _parse(self, text: str, deltas: "list[dict[str, Any]]", final: bool) -> None:
        content = text
        if self.reasoning is not None:
            parsed = self.reasoning.feed(text)
            if final:
                parsed.extend(self.reasoning.finish())
            self._reasoning_delta(parsed.reasoning, parsed.content, final, deltas)
            content = parsed.content
        calls: list[ToolCall] = []
        if self.tools is not None:
            found = self.tools.feed(content)
            if final:
                found.extend(self.tools.finish())
            content, calls = found.content, found.calls
            if self.reasoning_in_tools:
                self._reasoning_delta(found.reasoning, content or calls, final, deltas)
        if content:
            if content.strip() or self.tools is None:
                deltas.append({"content": self._pending_space + content})
                self._pending_space = ""
                self._content_seen = True
            else:
                self._pending_space += content
        for call in calls:
            index = self._calls
            self._calls += 1
            deltas.append({"tool_calls": [{"index": index, "id": new_call_id(), "type": "function",
                                           "function": {"name": call.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})

    def _reasoning_delta(self, reasoning: str, after: Any, final: bool, deltas: "list[dict[str, Any]]") -> None:
        """Reasoning as it comes, or held (stream_reasoning false) until what comes ``after`` it (content,
        calls) or the end, then sent whole."""
        if reasoning:
            if self._reasoning_text is not None:
                self._reasoning_text.append(reasoning)
            if self.stream_reasoning:
                deltas.append({"reasoning_content": reasoning})
            else:
                self._held_reasoning += reasoning
        if self._held_reasoning and (after or final):
            deltas.append({"reasoning_content": self._held_reasoning})
            self._held_reasoning = ""

    def reasoning_tokens(self, result: GenerationResult) -> int:
        """The answer's reasoning tokens (0 without a reasoning parser), once it has been parsed whole or streamed."""
        usage: dict[str, Any] = {}
        self._add_reasoning_tokens(usage, result, self._last_reasoning if self._reasoning_text is None
                                   else "".join(self._reasoning_text))
        return (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)

    def _add_reasoning_tokens(self, usage: dict[str, Any], result: GenerationResult, reasoning_text: str) -> None:
        if self.reasoning_in_tools:
            count = self.count_tokens(reasoning_text) if self.count_tokens is not None and reasoning_text else 0
            usage["completion_tokens_details"] = {"reasoning_tokens": min(count, len(result.output_ids))}
            return
        if self.reasoning is None:
            return
        count = 0
        if self.reasoning.reasoned:
            ids = result.output_ids
            if self.reasoning_end_id is not None:
                count = ids.index(self.reasoning_end_id) + 1 if self.reasoning_end_id in ids else len(ids)
            elif self.count_tokens is not None:
                count = min(len(ids), self.count_tokens(reasoning_text))
        usage["completion_tokens_details"] = {"reasoning_tokens": count}

    def _events(self, deltas: "list[dict[str, Any]]") -> bytes:
        chunks = [self.shape.delta_chunk(delta, self.index) for delta in deltas]
        if chunks and self.logprobs is not None:  # the tokens since the last chunk, with the last of these
            chunks[-1]["choices"][0]["logprobs"] = self.logprobs.unsent()
        return b"".join(sse_event(chunk) for chunk in chunks)

    def _finish_reason(self, result: GenerationResult, called: bool) -> str:
        return self.calls_finish if called and result.finish_reason == "stop" else result.finish_reason

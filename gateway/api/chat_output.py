"""A chat answer through its model's parsers, as typed deltas and a typed final answer.

Only when a parser applies to the request (the model has a reasoning parser and the request
does not turn separation off, the request offers tools with ``tool_choice`` auto and the
model has a tool-call parser, or ``tool_choice`` is ``required`` or a named function, whose
constrained answer is JSON); otherwise the answer is the text as it is (``plain_answer``), on the
usual path. No API's shape is known here: OpenAI chat, the Responses API and Anthropic's Messages
render these deltas and answers their own way (``pipeline.ChatRenderer``).

A stream is ``Reasoning``, ``Content`` and ``Call`` deltas, in order; a call comes once, whole
(ids ``call_`` + 24 hex digits, unique per response). Content that is only whitespace is dropped
when calls were made (``content`` None in the whole answer); streamed, such whitespace is held
until other content comes, and dropped if none does, so the assembled stream equals the whole
answer. The final ``finish_reason`` is ``tool_calls`` when calls were made and the engine stopped
by itself (``stop`` for a named ``tool_choice``, as OpenAI answers a forced function).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..serving.chat import Call, ChatAnswer, Content, Delta, Reasoning, new_call_id
from ..serving.generation import GenerationResult
from ..parsers import (HarmonyParser, NamedArgumentsParser, ReasoningParser, RequiredCallsParser, ToolCall,
                       ToolCallParser, is_harmony, reasoning_parser, thinks, tool_call_parser)
from ..tracing.context import CURRENT, step


class ChatOutput:
    def __init__(self, tools: ToolCallParser | None, reasoning: ReasoningParser | None,
                 calls_finish: str = "tool_calls", stream_reasoning: bool = True,
                 count_tokens: "Callable[[str], int] | None" = None, reasoning_end_id: int | None = None) -> None:
        self.tools = tools
        self.reasoning = reasoning
        self.stream_reasoning = stream_reasoning
        # Reasoning not streamed yet (stream_reasoning false), in pieces joined once it goes: a string grown a piece
        # at a time is copied whole each time.
        self._held_reasoning: list[str] = []
        # usage.completion_tokens_details.reasoning_tokens: the output tokens up to the end marker's id
        # when it is one token, else the reasoning text counted by the tokenizer (kept for that).
        self.reasoning_end_id = reasoning_end_id
        self.count_tokens = count_tokens
        self._reasoning_text: "list[str] | None" = [] if reasoning_end_id is None and count_tokens else None
        # The tool-call parser says the reasoning too (harmony): reasoning comes from it.
        self.reasoning_in_tools = tools is not None and tools.handles_reasoning
        self.calls_finish = calls_finish  # the finish_reason of an answer with calls that stopped by itself
        # The parsers' markers, kept by the detokenizer even where they are special tokens.
        self.kept_special = frozenset((tools.spellings if tools is not None else ()) +
                                      (reasoning.spellings if reasoning is not None else ()))
        self._calls = 0
        self._content_seen = False  # content other than whitespace went out
        self._pending_space = ""  # whitespace-only content held (streamed)
        # Inside a traced request, a stream's parsing as [first ns, last ns, ns spent, pieces]; False untraced. Decided
        # here, in the request's task: a stream's pieces, its first included, may be parsed by what reads the engine
        # (generation._Progress.on_arrival), outside the request's context where the trace is not seen.
        self._parse_trace: "list[int] | bool" = CURRENT.get() is not None and [0, 0, 0, 0]

    @classmethod
    def for_request(cls, entry: Any, chat: Any) -> "ChatOutput | None":
        """The parsers that apply to ``chat`` on the model of ``entry``; None when none does."""
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
        return cls(tools, reasoning, calls_finish, chat.stream_reasoning, count_tokens, end_id)

    @property
    def separates_reasoning(self) -> bool:
        return self.reasoning is not None or self.reasoning_in_tools

    # -- one answer, whole ------------------------------------------------------------------

    def whole(self, result: GenerationResult) -> ChatAnswer:
        with step("parse"):  # (a span only inside a traced request)
            reasoning_text, text, found = self._parsed(result.text)
        calls = tuple(Call(i, new_call_id(), c.name, c.arguments) for i, c in enumerate(found))
        reasoning_text = reasoning_text or None
        return ChatAnswer(result, self._finish_reason(result, bool(calls)), bool(calls),
                          self._reasoning_tokens(result, reasoning_text or ""),
                          None if calls and not text.strip() else text, reasoning_text, calls,
                          self.separates_reasoning)

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

    # -- a stream -----------------------------------------------------------------------------

    def feed(self, text: str) -> "list[Delta]":
        """The deltas a piece of the answer decides (maybe none)."""
        deltas: list[Delta] = []
        self._step(text, deltas, final=False)
        return deltas

    def finish(self) -> "list[Delta]":
        """The deltas the end of the answer decides: what the parsers held."""
        deltas: list[Delta] = []
        self._step("", deltas, final=True)
        if self._pending_space and (self._content_seen or not self._calls):
            deltas.append(Content(self._pending_space))
        self._pending_space = ""
        return deltas

    def streamed_answer(self, result: GenerationResult) -> ChatAnswer:
        """A stream's end, once ``finish`` was taken."""
        called = bool(self._calls)
        return ChatAnswer(result, self._finish_reason(result, called), called,
                          self._reasoning_tokens(result, "".join(self._reasoning_text or ())),
                          separates_reasoning=self.separates_reasoning)

    def _step(self, text: str, deltas: "list[Delta]", final: bool) -> None:
        if not self._parse_trace:
            self._parse(text, deltas, final)
            return
        started = time.perf_counter_ns()
        self._parse(text, deltas, final)
        ended = time.perf_counter_ns()
        timing = self._parse_trace
        timing[0] = timing[0] or time.time_ns() - (ended - started)
        timing[1], timing[2], timing[3] = time.time_ns(), timing[2] + ended - started, timing[3] + 1
        if final:  # a streamed answer's parsing: one span over its pieces (a whole answer's is a step, whole())
            CURRENT.get().record("parse", timing[0], timing[1], {"smg.parse_s": timing[2] / 1e9,
                                                                 "smg.parse_pieces": timing[3]})

    def _parse(self, text: str, deltas: "list[Delta]", final: bool) -> None:
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
                deltas.append(Content(self._pending_space + content))
                self._pending_space = ""
                self._content_seen = True
            else:
                self._pending_space += content
        for call in calls:
            deltas.append(Call(self._calls, new_call_id(), call.name, call.arguments))
            self._calls += 1

    def _reasoning_delta(self, reasoning: str, after: Any, final: bool, deltas: "list[Delta]") -> None:
        """Reasoning as it comes, or held (stream_reasoning false) until what comes ``after`` it (content,
        calls) or the end, then sent whole."""
        if reasoning:
            if self._reasoning_text is not None:
                self._reasoning_text.append(reasoning)
            if self.stream_reasoning:
                deltas.append(Reasoning(reasoning))
            else:
                self._held_reasoning.append(reasoning)
        if self._held_reasoning and (after or final):
            deltas.append(Reasoning("".join(self._held_reasoning)))
            self._held_reasoning = []

    def _reasoning_tokens(self, result: GenerationResult, reasoning_text: str) -> int:
        if self.reasoning_in_tools:
            count = self.count_tokens(reasoning_text) if self.count_tokens is not None and reasoning_text else 0
            return min(count, len(result.output_ids))
        if self.reasoning is None or not self.reasoning.reasoned:
            return 0
        ids = result.output_ids
        if self.reasoning_end_id is not None:
            return ids.index(self.reasoning_end_id) + 1 if self.reasoning_end_id in ids else len(ids)
        if self.count_tokens is not None:
            return min(len(ids), self.count_tokens(reasoning_text))
        return 0

    def _finish_reason(self, result: GenerationResult, called: bool) -> str:
        return self.calls_finish if called and result.finish_reason == "stop" else result.finish_reason

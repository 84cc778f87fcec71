"""gpt-oss's harmony format, read with ``openai-harmony`` (the format's reference library).

A gpt-oss answer is a series of messages, each ``<|channel|>CHANNEL [to=RECIPIENT] [<|constrain|>TYPE]
<|message|>TEXT`` ended by ``<|end|>``, ``<|call|>`` (a tool call: the engine stops there) or
``<|return|>`` (the answer is over), the next one opened by ``<|start|>assistant``:

    analysis                      the reasoning                 -> reasoning_content
    commentary to=functions.NAME  a call of NAME, TEXT its JSON  -> tool_calls
    commentary (no recipient)     a preamble to the user         -> content
    final                         the answer                     -> content

The gateway detokenizes with those markers kept (``spellings``); the text is encoded again with the
harmony encoding (the same o200k_harmony ids the model emitted: its tokenizer is that encoding) and
fed to ``openai_harmony.StreamableParser`` token by token, so reasoning and content stream as the
library decides them. A call is returned when its message ends (``<|call|>``, or the end of the
answer) with arguments that read as a JSON object and a name the request offers; otherwise its text
is content. Text the library refuses (not harmony) is passed on as content, never lost.

The encoding needs o200k_base's vocabulary file: ``openai-harmony`` downloads it, or reads it from
the directory ``TIKTOKEN_ENCODINGS_BASE`` names (a node without internet access).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from .markers import held_back
from .reasoning import REASONING_PARSERS, ReasoningResult
from .tool_calls import TOOL_CALL_PARSERS, ToolCall, ToolCallParser, ToolCallResult, ToolSet, _arguments_json

FUNCTIONS_PREFIX = "functions."
# Text before the first <|message|> is a header (channel, recipient): this long without one, the
# answer is not harmony, and it goes out as content rather than wait for the end.
HEADER_CHARS_MAX = 512


class HarmonyUnavailable(RuntimeError):
    """The harmony encoding cannot be loaded (no vocabulary file and no way to download it)."""


@functools.cache
def harmony_encoding() -> Any:
    """The gpt-oss encoding, loaded once per process (HarmonyUnavailable when it cannot be)."""
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as e:  # HarmonyError, or the package missing
        raise HarmonyUnavailable(
            f"the harmony encoding (gpt-oss) could not be loaded: {e}; put o200k_base.tiktoken in a directory "
            f"and set TIKTOKEN_ENCODINGS_BASE to it") from None


class HarmonyParser(ToolCallParser):
    """Reasoning, content and tool calls of a gpt-oss answer (``ToolCallResult.reasoning`` carries the
    analysis channel; with ``separate_reasoning`` false it is content)."""

    spellings = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
    handles_reasoning = True  # chat_output.py: this parser also takes the reasoning parser's part

    def __init__(self, tools: "Iterable[str] | Iterable[dict[str, Any]] | ToolSet | None" = None,
                 separate_reasoning: bool = True) -> None:
        from openai_harmony import Role, StreamableParser
        self.encoding = harmony_encoding()
        self._parser = StreamableParser(self.encoding, role=Role.ASSISTANT)
        self.tools = ToolSet.of(tools)
        self.separate_reasoning = separate_reasoning
        self._messages_seen = 0
        self._broken = False  # the library refused the text: the rest passes through as content
        self._held = ""  # the start of a marker cut at the end of a piece: encoded once it is whole
        self._header = ""  # the text before the first <|message|>: content if no message ever starts
        self._started = False

    def feed(self, text: str) -> ToolCallResult:
        result = ToolCallResult()
        if self._broken:
            result.content = text
            return result
        text = self._held + text
        keep = max(held_back(text, marker) for marker in self.spellings)
        text, self._held = text[:len(text) - keep], text[len(text) - keep:]
        if text:
            self._process(text, result)
        return result

    def _process(self, text: str, result: ToolCallResult) -> None:
        if not self._started:
            self._header += text
            if "<|message|>" not in self._header:
                if len(self._header) > HEADER_CHARS_MAX:
                    self._broken = True
                    result.content += self._header
                return
            self._started = True
            text, self._header = self._header, ""
        self._process_tokens(text, result)

    def _process_tokens(self, text: str, result: ToolCallResult) -> None:
        tokens = self.encoding.encode(text, allowed_special="all")
        for at, token in enumerate(tokens):
            try:
                self._parser.process(token)
            except Exception:  # HarmonyError: not the format after all
                self._broken = True
                result.content += self.encoding.decode(tokens[at:])
                return
            self._route_delta(result)
            self._collect(result)

    def finish(self) -> ToolCallResult:
        result = ToolCallResult()
        held, self._held = self._held, ""
        if held:
            if self._broken:
                result.content += held
            else:
                self._process(held, result)
        if not self._started and not self._broken:  # no message ever started: not harmony
            result.content += self._header
            return result
        if not self._broken:
            try:
                self._parser.process_eos()  # a message the answer ended inside is complete now
            except Exception:
                content = self._parser.current_content
                if self._in_call() and content:
                    self._call(self._parser.current_recipient, content, result)
                return result
            self._collect(result)
        return result

    def _in_call(self) -> bool:
        recipient = self._parser.current_recipient
        return recipient is not None and recipient.startswith(FUNCTIONS_PREFIX)

    def _route_delta(self, result: ToolCallResult) -> None:
        delta = self._parser.last_content_delta
        if not delta or self._in_call():
            return  # a call's arguments: whole, when its message ends
        if self._parser.current_channel == "analysis" and self.separate_reasoning:
            result.reasoning += delta
        else:
            result.content += delta

    def _collect(self, result: ToolCallResult) -> None:
        messages = self._parser.messages
        while self._messages_seen < len(messages):
            message = messages[self._messages_seen]
            self._messages_seen += 1
            recipient = message.recipient
            if recipient is not None and recipient.startswith(FUNCTIONS_PREFIX):
                self._call(recipient, "".join(c.text for c in message.content), result)

    def _call(self, recipient: str, arguments_text: str, result: ToolCallResult) -> None:
        name = recipient[len(FUNCTIONS_PREFIX):]
        arguments = _arguments_json(arguments_text)
        if arguments is None or (self.tools is not None and name not in self.tools.names):
            result.content += arguments_text  # not a call after all: what the model wrote
            return
        result.calls.append(ToolCall(name, arguments))


class HarmonyReasoningParser:
    """A gpt-oss answer's reasoning alone, in the reasoning parsers' shape (``/parse/reasoning``): the
    analysis channel is reasoning, the rest content (a call's arguments included, as text)."""

    spellings = HarmonyParser.spellings
    end = "<|end|>"

    def __init__(self) -> None:
        self._inner = HarmonyParser(())  # no function offered: a call's text is content
        self._reasoned = False

    @property
    def reasoned(self) -> bool:
        return self._reasoned

    def _shaped(self, result: ToolCallResult) -> ReasoningResult:
        self._reasoned = self._reasoned or bool(result.reasoning)
        return ReasoningResult(reasoning=result.reasoning, content=result.content)

    def feed(self, text: str) -> ReasoningResult:
        return self._shaped(self._inner.feed(text))

    def finish(self) -> ReasoningResult:
        return self._shaped(self._inner.finish())

    def parse(self, text: str) -> ReasoningResult:
        result = self.feed(text)
        result.extend(self.finish())
        return result


# smg's name, vLLM's ("openai") and SGLang's ("gpt-oss"), for either kind of parser: a harmony answer carries
# both, so chat_output.py runs the one HarmonyParser for them (is_harmony).
TOOL_CALL_PARSERS.add("gpt_oss", HarmonyParser, "harmony: channels and `to=functions.NAME`", aliases=("openai", "gpt-oss"),
                      models="gpt-oss", ids=("gpt-oss",), architectures=("gptossforcausallm",))
REASONING_PARSERS.add("gpt_oss", HarmonyReasoningParser, "harmony: the `analysis` channel (with the tool calls)",
                      aliases=("openai", "gpt-oss"), models="gpt-oss", ids=("gpt-oss",),
                      architectures=("gptossforcausallm",))


def is_harmony(name: str | None) -> bool:
    """Whether a parser name (tool-call or reasoning) means gpt-oss's harmony format."""
    return name is not None and TOOL_CALL_PARSERS.get(name) is HarmonyParser

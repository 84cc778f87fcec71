"""Reasoning in a model's output (``<think>`` ... ``</think>``), separated from the answer as the text streams.

Two kinds of model:

* those whose output may open with the start marker (Qwen3 with thinking on, GLM-4.5): text
  before it, if any, and text after the end marker are the answer; no start marker at the very
  beginning means no reasoning at all (thinking off);
* those that start inside the reasoning, their template having opened it in the prompt
  (DeepSeek-R1, Qwen3-Thinking, Kimi): everything up to the end marker is reasoning; a start
  marker the model repeats first is dropped; no end marker means the whole output was reasoning
  (cut short).

The whitespace between the end marker and the answer ("</think>\\n\\n") is not part of the answer.
Markers never reach either side. What ``feed`` returns for a whole text equals what it returns
for the same text in any pieces, plus ``finish``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..base.registry import Registry
from .markers import held_back


@dataclasses.dataclass(slots=True)
class ReasoningResult:
    reasoning: str = ""
    content: str = ""

    def extend(self, other: "ReasoningResult") -> None:
        self.reasoning += other.reasoning
        self.content += other.content


_START, _REASONING, _AFTER, _CONTENT = range(4)  # where the parser stands


class ReasoningParser:
    def __init__(self, starts_in_reasoning: bool, start: str = "<think>", end: str = "</think>") -> None:
        self.start, self.end = start, end
        self.spellings = (start, end)  # kept in the decoded text if the tokenizer holds them as special tokens
        self._state = _START
        self._starts_in_reasoning = starts_in_reasoning
        self._buffer = ""
        # Whitespace before anything else, kept apart (in pieces) while the start marker may still come: looking
        # at it again on every piece was quadratic in a whitespace-only answer (0.17 s at 200,000 characters).
        self._leading: list[str] = []
        self._left_reasoning = False  # the end marker came

    def feed(self, text: str) -> ReasoningResult:
        result = ReasoningResult()
        buffer = self._buffer + text
        while True:
            if self._state == _START:
                stripped = buffer.lstrip()
                if len(stripped) != len(buffer):
                    self._leading.append(buffer[:len(buffer) - len(stripped)])
                    buffer = stripped
                if stripped.startswith(self.start):
                    buffer = stripped[len(self.start):]
                    self._leading.clear()  # the whitespace before the marker is dropped
                    self._state = _REASONING
                    continue
                if self.start.startswith(stripped):
                    break  # empty, or the start marker still arriving
                buffer = "".join(self._leading) + buffer  # no marker: the whitespace is the answer's own
                self._leading.clear()
                self._state = _REASONING if self._starts_in_reasoning else _CONTENT
                continue
            if self._state == _REASONING:
                at = buffer.find(self.end)
                if at < 0:
                    keep = held_back(buffer, self.end)
                    result.reasoning += buffer[:len(buffer) - keep]
                    buffer = buffer[len(buffer) - keep:]
                    break
                result.reasoning += buffer[:at]
                buffer = buffer[at + len(self.end):]
                self._state = _AFTER
                self._left_reasoning = True
                continue
            if self._state == _AFTER:  # the whitespace right after the end marker is dropped
                buffer = buffer.lstrip()
                if not buffer:
                    break
                self._state = _CONTENT
            result.content += buffer
            buffer = ""
            break
        self._buffer = buffer
        return result

    @property
    def reasoned(self) -> bool:
        """Whether the answer had reasoning (entered it, by its start marker or by starting inside)."""
        return self._state == _REASONING or self._left_reasoning

    def finish(self) -> ReasoningResult:
        result = ReasoningResult()
        buffer, self._buffer = "".join(self._leading) + self._buffer, ""
        self._leading.clear()
        if self._state == _START:
            # Only whitespace or a prefix of the start marker came: text of wherever this model starts.
            if self._starts_in_reasoning:
                result.reasoning = buffer
            else:
                result.content = buffer
        elif self._state == _REASONING:
            result.reasoning = buffer  # a partial end marker at the very end was reasoning text
        elif self._state == _CONTENT:
            result.content = buffer
        return result

    def parse(self, text: str) -> ReasoningResult:
        result = self.feed(text)
        result.extend(self.finish())
        return result


# The formats, by smg's names: whether the answer starts inside the reasoning (the template opened it in the
# prompt) or the model opens it, its markers, the models that write it (docs/apis.md), and which models get it when
# the operator names none (choice.py: ``ids`` in the model id, else ``architectures``). ``switches``: models that
# think only when asked (their template's switch off by default, DeepSeek V3.1's ``thinking``): their parser
# applies only when the request turns one of these on; otherwise the whole answer is content (issue 34: every
# answer of DeepSeek V3.1, tool calls included, landed in reasoning_content).
REASONING_PARSERS: Registry[Callable[[], ReasoningParser]] = Registry("reasoning parser", off=("passthrough", "none"))
REASONING_PARSERS.add("qwen3", lambda: ReasoningParser(starts_in_reasoning=False),
                      "`<think>`...`</think>`; the answer may open with it", models="Qwen3, Qwen3-Coder (a "
                      "`<think>` it opens is reasoning)", ids=("qwen3", "qwen3-coder"),
                      architectures=("qwen3forcausallm", "qwen3moeforcausallm"))
REASONING_PARSERS.add("qwen3_thinking", lambda: ReasoningParser(starts_in_reasoning=True),
                      "the answer starts inside `<think>`", models="Qwen3 *-Thinking", ids=("thinking",))
REASONING_PARSERS.add("deepseek_r1", lambda: ReasoningParser(starts_in_reasoning=True),
                      "the answer starts inside `<think>`", models="DeepSeek-R1, QwQ", ids=("qwq", "deepseek-r1"))
REASONING_PARSERS.add("glm45", lambda: ReasoningParser(starts_in_reasoning=False),
                      "`<think>`...`</think>`; the answer may open with it", models="GLM-4.5 to 4.7",
                      ids=("glm-4.5", "glm-4.6", "glm-4.7"), architectures=("glm4moeforcausallm",))
REASONING_PARSERS.add("kimi", lambda: ReasoningParser(starts_in_reasoning=True, start="◁think▷", end="◁/think▷"),
                      "the answer starts inside `◁think▷`", models="Kimi K2 Thinking", ids=("kimi-k2-thinking",))
REASONING_PARSERS.add("deepseek_v31", lambda: ReasoningParser(starts_in_reasoning=True),
                      "the answer starts inside `<think>`, only when the request turns thinking on",
                      models="DeepSeek V3.1", ids=("deepseek-v3.1",), switches=("thinking", "enable_thinking"))
REASONING_PARSERS.add("nano_v3", lambda: ReasoningParser(starts_in_reasoning=True),
                      "the answer starts inside `<think>`", models="Nemotron Nano v3",
                      ids=("nemotron-nano", "nemotron-3-nano"))
REASONING_PARSERS.add("step3", lambda: ReasoningParser(starts_in_reasoning=True),
                      "the answer starts inside `<think>`", models="Step-3", ids=("step3", "step-3"),
                      architectures=("step3vlforconditionalgeneration",))
REASONING_PARSERS.add("minimax", lambda: ReasoningParser(starts_in_reasoning=True),
                      "the answer starts inside `<think>` (its template opens it)", aliases=("minimax_m2",),
                      models="MiniMax-M2", ids=("minimax-m2",), architectures=("minimaxm2forcausallm",))
REASONING_PARSERS.add("cohere_cmd", lambda: ReasoningParser(starts_in_reasoning=False, start="<|START_THINKING|>",
                                                            end="<|END_THINKING|>"),
                      "`<\\|START_THINKING\\|>`...`<\\|END_THINKING\\|>`; the model opens it",
                      models="Command A Reasoning", ids=("command-a-reasoning",))
# gpt-oss's harmony format registers itself in harmony.py.


def thinks(name: str, template_kwargs: dict) -> bool:
    """Whether a model whose reasoning parser is ``name`` thinks in an answer rendered with these template kwargs
    (the request's own switches off are handled before: reasoning_effort none, enable_thinking false)."""
    switches = REASONING_PARSERS.plugin(name).detail("switches") if name in REASONING_PARSERS else None
    return switches is None or any(template_kwargs.get(switch) is True for switch in switches)


def reasoning_parser(name: str) -> ReasoningParser:
    """A new parser (one per generation); KeyError for a name we do not know."""
    return REASONING_PARSERS[name]()

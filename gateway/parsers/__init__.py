"""What a model's output means besides text: tool calls and reasoning, parsed as the text streams.

Pure, no I/O: each parser takes the decoded text in whatever pieces it arrives (``feed``) and says
at the end what is left (``finish``); what it returns for a whole text is what it returns for the
same text in any chunking. ``tool_calls.TOOL_CALL_PARSERS`` and ``reasoning.REASONING_PARSERS``
map smg's parser names (and vLLM's and SGLang's where they differ) to parsers.
"""

from .harmony import HarmonyParser, HarmonyReasoningParser, HarmonyUnavailable, harmony_encoding
from .reasoning import REASONING_PARSERS, ReasoningParser, reasoning_parser, thinks
from .tool_calls import (
    TOOL_CALL_PARSERS,
    JsonParser,
    NamedArgumentsParser,
    RequiredCallsParser,
    ToolCall,
    ToolCallParser,
    ToolCallResult,
    tool_call_parser,
)

# gpt-oss: smg's name, vLLM's ("openai") and SGLang's ("gpt-oss"), for either kind of parser; harmony
# answers carry both, so chat_output.py runs the one HarmonyParser for them.
for _name in ("gpt_oss", "openai", "gpt-oss"):
    TOOL_CALL_PARSERS[_name] = HarmonyParser
    REASONING_PARSERS[_name] = HarmonyReasoningParser



def is_harmony(name: str | None) -> bool:
    """Whether a parser name (tool-call or reasoning) means gpt-oss's harmony format."""
    return name is not None and TOOL_CALL_PARSERS.get(name) is HarmonyParser


__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS", "HarmonyParser", "HarmonyUnavailable", "JsonParser", "NamedArgumentsParser", "ReasoningParser",
           "RequiredCallsParser",
           "ToolCall", "ToolCallParser", "ToolCallResult", "harmony_encoding", "is_harmony", "reasoning_parser", "thinks", "tool_call_parser"]

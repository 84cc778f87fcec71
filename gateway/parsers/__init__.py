"""What a model's output means besides text: tool calls and reasoning, parsed as the text streams.

Pure, no I/O: each parser takes the decoded text in whatever pieces it arrives (``feed``) and says
at the end what is left (``finish``); what it returns for a whole text is what it returns for the
same text in any chunking. ``tool_calls.TOOL_CALL_PARSERS`` and ``reasoning.REASONING_PARSERS`` are the
registries of the formats (``gateway/base/registry.py``), by smg's names with vLLM's and SGLang's as aliases: each
parser registers itself in its module with its format, its models and which model ids choose it, and the
config, ``--help``, the docs' tables and ``choice.py`` read them.
"""

from ..base.options import Option
from .harmony import HarmonyParser, HarmonyReasoningParser, HarmonyUnavailable, harmony_encoding, is_harmony
from .reasoning import REASONING_PARSERS, ReasoningParser, reasoning_parser, thinks
from .tool_calls import (TOOL_CALL_PARSERS, JsonParser, NamedArgumentsParser, RequiredCallsParser, ToolCall,
                         ToolCallParser, ToolCallResult, tool_call_parser)

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS", "HarmonyParser", "HarmonyReasoningParser", "HarmonyUnavailable", "JsonParser", "NamedArgumentsParser", "ReasoningParser",
           "RequiredCallsParser",
           "ToolCall", "ToolCallParser", "ToolCallResult", "harmony_encoding", "is_harmony", "reasoning_parser", "thinks", "tool_call_parser"]

# The parsers' flags (gateway/base/options.py): every model gets these instead of the ones chosen for it (choice.py).
OPTIONS = (
    Option("--tool-call-parser", "tool_call_parser", str, "tool-call format of the models' answers (vLLM's and "
           "SGLang's names too); default: chosen by the model's id, else its architecture", "engines",
           choices=TOOL_CALL_PARSERS),
    Option("--reasoning-parser", "reasoning_parser", str, "reasoning format; default: chosen by the model's id, "
           "else its architecture", "engines", choices=REASONING_PARSERS),
)

"""What a model's output means besides text: tool calls and reasoning, parsed as the text streams.

Pure, no I/O: each parser takes the decoded text in whatever pieces it arrives (``feed``) and says
at the end what is left (``finish``); what it returns for a whole text is what it returns for the
same text in any chunking. ``tool_calls.TOOL_CALL_PARSERS`` and ``reasoning.REASONING_PARSERS``
map smg's parser names (and vLLM's and SGLang's where they differ) to parsers.
"""

from .reasoning import REASONING_PARSERS, ReasoningParser, reasoning_parser
from .tool_calls import (
    TOOL_CALL_PARSERS,
    JsonParser,
    NamedArgumentsParser,
    ToolCall,
    ToolCallParser,
    ToolCallResult,
    tool_call_parser,
)

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS", "JsonParser", "NamedArgumentsParser", "ReasoningParser",
           "ToolCall", "ToolCallParser", "ToolCallResult", "reasoning_parser", "tool_call_parser"]

"""Which parsers a model gets when the operator names none: by its id, the longest matching pattern wins;
a model whose id no pattern matches, by its architecture.

Patterns are lower-case substrings of the model id (``Qwen/Qwen3-8B`` -> ``qwen3-8b``). A model no
pattern matches gets none: its text passes through as content. ``--tool-call-parser`` and
``--reasoning-parser`` override this for every model; ``none`` (or smg's ``passthrough``) turns a
kind off.
"""

from __future__ import annotations

TOOL_CALL_PATTERNS = {
    "qwen": "qwen",
    "qwq": "qwen",
    "hermes": "hermes",
    "qwen3-coder": "qwen_coder",
    "qwen3.5": "qwen_coder",
    "llama-3": "llama",
    "llama3": "llama",
    "llama-4": "pythonic",
    "llama4": "pythonic",
    "mistral": "mistral",
    "mixtral": "mistral",
    "deepseek-v3": "deepseek",
    "deepseek-r1": "deepseek",
    "deepseek-v3.1": "deepseek31",
    "kimi-k2": "kimik2",
    "glm-4.5": "glm45_moe",
    "glm-4.6": "glm45_moe",
    "glm-4.7": "glm47_moe",
    "minimax-m2": "minimax_m2",
    "step3": "step3",
    "step-3": "step3",
    "deepseek-v3.2": "deepseek32",
    "command-r": "cohere",
    "command-a": "cohere",
    "gpt-oss": "gpt_oss",
}

REASONING_PATTERNS = {
    "qwen3": "qwen3",
    # No thinking mode, but an answer may still open <think> (and be cut inside it by max_tokens): that is
    # reasoning, not content with a raw marker. The parser starts outside: answers without it are untouched.
    "qwen3-coder": "qwen3",
    "thinking": "qwen3_thinking",
    "qwq": "deepseek_r1",
    "deepseek-r1": "deepseek_r1",
    "glm-4.5": "glm45",
    "glm-4.6": "glm45",
    "glm-4.7": "glm45",
    "kimi-k2-thinking": "kimi",
    "deepseek-v3.1": "deepseek_v31",
    "nemotron-nano": "nano_v3",
    "nemotron-3-nano": "nano_v3",
    "step3": "step3",
    "step-3": "step3",
    "minimax-m2": "minimax",
    "command-a-reasoning": "cohere_cmd",
    "gpt-oss": "gpt_oss",
}


# When no pattern matches the id (a served name such as "my-model"), the model's architecture, as its
# engine reports it (GetModelInfo), lower-cased and matched whole.
TOOL_CALL_ARCHITECTURES = {
    "qwen2forcausallm": "qwen",
    "qwen3forcausallm": "qwen",
    "qwen3moeforcausallm": "qwen",
    "llamaforcausallm": "llama",
    "llama4forconditionalgeneration": "pythonic",
    "mistralforcausallm": "mistral",
    "deepseekv3forcausallm": "deepseek",
    "deepseekv32forcausallm": "deepseek32",
    "glm4moeforcausallm": "glm45_moe",
    "minimaxm2forcausallm": "minimax_m2",
    "cohere2forcausallm": "cohere",
    "step3vlforconditionalgeneration": "step3",
    "gptossforcausallm": "gpt_oss",
}
REASONING_ARCHITECTURES = {
    "qwen3forcausallm": "qwen3",
    "qwen3moeforcausallm": "qwen3",
    "glm4moeforcausallm": "glm45",
    "minimaxm2forcausallm": "minimax",
    "step3vlforconditionalgeneration": "step3",
    "gptossforcausallm": "gpt_oss",
}


def _by_architecture(table: dict[str, str], architectures: "tuple[str, ...]") -> str | None:
    return next((table[a.lower()] for a in architectures if a.lower() in table), None)


def _longest(patterns: dict[str, str], model_id: str) -> str | None:
    name = model_id.lower()
    matches = [p for p in patterns if p in name]
    if not matches:
        return None
    return patterns[max(matches, key=len)] or None


def choose(model_id: str, tool_call_parser: str | None = None, reasoning_parser: str | None = None,
           architectures: "tuple[str, ...]" = ()) -> tuple[str | None, str | None]:
    """(tool-call parser, reasoning parser) for a model: the operator's choice, else by the model id, else
    by its architecture."""
    name = model_id.lower()
    by_id = any(p in name for p in TOOL_CALL_PATTERNS) or any(p in name for p in REASONING_PATTERNS)
    if tool_call_parser is not None:
        tool = tool_call_parser
    else:
        tool = _longest(TOOL_CALL_PATTERNS, model_id) if by_id else _by_architecture(TOOL_CALL_ARCHITECTURES,
                                                                                     architectures)
    if reasoning_parser is not None:
        reasoning = reasoning_parser
    else:
        reasoning = _longest(REASONING_PATTERNS, model_id) if by_id else _by_architecture(REASONING_ARCHITECTURES,
                                                                                          architectures)
    off = ("none", "passthrough")
    return (None if tool in off else tool), (None if reasoning in off else reasoning)

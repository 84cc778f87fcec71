"""Which parsers a model gets when the operator names none: by its id, the longest matching pattern wins;
a model whose id no pattern matches, by its architecture.

Patterns are lower-case substrings of the model id (``Qwen/Qwen3-8B`` -> ``qwen3-8b``), declared by each parser
where it registers (``ids``, ``architectures``: ``gateway/base/registry.py``). A model no pattern matches gets none:
its text passes through as content. ``--tool-call-parser`` and
``--reasoning-parser`` override this for every model; ``none`` (or smg's ``passthrough``) turns a
kind off.
"""

from __future__ import annotations

from typing import Any

from ..base.registry import Registry
from .harmony import REASONING_PARSERS, TOOL_CALL_PARSERS

def _patterns(registry: Registry[Any]) -> dict[str, str]:
    """Model-id pattern -> parser name, as the parsers declared them (``ids`` in their registrations)."""
    return {pattern: plugin.name for plugin in registry.plugins() for pattern in plugin.detail("ids", ())}


def _architectures(registry: Registry[Any]) -> dict[str, str]:
    """Architecture (lower case, as engines report it) -> parser name."""
    return {arch: plugin.name for plugin in registry.plugins() for arch in plugin.detail("architectures", ())}


TOOL_CALL_PATTERNS = _patterns(TOOL_CALL_PARSERS)
REASONING_PATTERNS = _patterns(REASONING_PARSERS)
# When no pattern matches the id (a served name such as "my-model"), the model's architecture, as its
# engine reports it (GetModelInfo), lower-cased and matched whole.
TOOL_CALL_ARCHITECTURES = _architectures(TOOL_CALL_PARSERS)
REASONING_ARCHITECTURES = _architectures(REASONING_PARSERS)


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
    return (None if tool in TOOL_CALL_PARSERS.off else tool), (None if reasoning in REASONING_PARSERS.off else reasoning)

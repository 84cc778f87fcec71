"""The parsers as a subsystem of the node (gateway/base/subsystem.py): their flags, and the check that harmony's
encoding loads when a flag names it."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, Subsystem
from . import OPTIONS
from .harmony import HarmonyUnavailable, harmony_encoding, is_harmony


def _check(config: Any) -> None:
    if is_harmony(config.tool_call_parser) or is_harmony(config.reasoning_parser):
        try:
            harmony_encoding()
        except HarmonyUnavailable as e:
            raise ConfigProblem(f"--tool-call-parser/--reasoning-parser gpt_oss: {e}") from None


SUBSYSTEM = Subsystem("parsers", options=OPTIONS, check=_check)

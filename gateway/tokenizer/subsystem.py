"""The tokenizer as a subsystem of the node (gateway/base/subsystem.py): its section, flags and checks. Its
tokenizers are the model catalog's to load (gateway/serving/models.py)."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, Subsystem
from .service import OPTIONS, TokenizerConfig


def _check(config: Any) -> None:
    if config.tokenizer.encode_threads < 0:
        raise ConfigProblem("--encode-threads must not be negative (0: one per core)")
    if config.tokenizer.chat_template_fuel < 1:
        raise ConfigProblem("--chat-template-fuel must be at least 1")


SUBSYSTEM = Subsystem("tokenizer", TokenizerConfig(), OPTIONS, _check)

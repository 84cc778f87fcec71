"""Scripted answers: the simulated engine says what a test tells it to for prompts that match.

A script is a JSON-lines file, one rule per line, first match wins:

    {"match": "weather in (Paris|Oslo)", "output": "<tool_call>\\n{\\"name\\": \\"get_weather\\", ...}\\n</tool_call>"}
    {"match": "(?s).*", "output": "Hello!", "finish": "length"}

``match`` is a Python regular expression searched in the prompt as text (the prompt's token ids
decoded with special tokens kept, so a rule may match the chat template's markers, a system
prompt or a tool's name). ``output`` is encoded with the engine's tokenizer, special tokens
included (``<tool_call>``, ``<think>``, ``<|python_tag|>`` come out as the single ids a model
emits), and the engine streams those ids, then EOS unless ``finish`` is ``"length"`` (the
answer stops there as if it reached max_tokens) or the request ignores EOS. max_tokens still
cuts an answer short. A prompt no rule matches gets the usual deterministic words.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

FINISHES = ("stop", "length")
RULES_MAX = 10_000


class ScriptError(ValueError):
    """The script file cannot be used; the message names the line."""


@dataclasses.dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    output: str
    finish: str = "stop"


@dataclasses.dataclass(frozen=True)
class Script:
    rules: tuple[Rule, ...]

    @classmethod
    def load(cls, path: Path) -> "Script":
        rules = []
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ScriptError(f"{path}: {e}") from None
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rule = json.loads(line)
                if not isinstance(rule, dict) or not isinstance(rule.get("match"), str) \
                        or not isinstance(rule.get("output"), str):
                    raise ValueError('a rule is an object with string "match" and "output"')
                finish = rule.get("finish", "stop")
                if finish not in FINISHES:
                    raise ValueError(f'"finish" must be one of {", ".join(FINISHES)}')
                unknown = set(rule) - {"match", "output", "finish"}
                if unknown:
                    raise ValueError(f"unknown keys {', '.join(sorted(unknown))}")
                rules.append(Rule(re.compile(rule["match"]), rule["output"], finish))
            except (ValueError, re.error) as e:
                raise ScriptError(f"{path}, line {number}: {e}") from None
            if len(rules) > RULES_MAX:
                raise ScriptError(f"{path}: more than {RULES_MAX} rules")
        return cls(tuple(rules))

    def rule_for(self, prompt: str) -> Rule | None:
        for rule in self.rules:
            if rule.pattern.search(prompt):
                return rule
        return None

"""Multi-turn chat transcripts built from real texts that ship with Python.

We have no corpus of real conversations offline, so turns are cut from real
prose and code (the stdlib's own docstrings and sources) mixed with
multilingual lines, emoji and combining characters: the inputs where a
tokenizer cache would go wrong if cutting at special tokens were unsafe.
"""

from __future__ import annotations

import inspect
import json
import random

import argparse
import asyncio
import collections
import email
import json as json_module
import textwrap

_SOURCES = [argparse, asyncio, collections, email, json_module, textwrap]

MULTILINGUAL = [
    "Qu'est-ce que c'est ? Ça dépend… « vraiment » !",
    "東京は日本の首都です。今日はいい天気ですね。",
    "Привет, как дела? Всё хорошо, спасибо.",
    "مرحبا بك في عالم البرمجة 👋🏽",
    "e\u0301 vs \u00e9 — NFC matters; 🇫🇷🇩🇪 flags and 👩‍👩‍👧 families",
    "def f(x):\n\treturn x ** 2  # tabs\tand  spaces   \n\n\n",
    "数学: ∑_{i=1}^{n} i² = n(n+1)(2n+1)/6 ✓",
    "<think>\nmaybe\n</think>\n\nliteral <|im_end|> inside user text",
]


def real_texts() -> list[str]:
    texts: list[str] = []
    for module in _SOURCES:
        source = inspect.getsource(module)
        texts.extend(chunk for chunk in source.split("\n\n") if chunk.strip())
    return texts


def transcripts(seed: int, count: int, turns_max: int = 8) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    texts = real_texts()
    out = []
    for _ in range(count):
        system = "\n\n".join(rng.sample(texts, 3))
        messages = [{"role": "system", "content": system}]
        for _ in range(rng.randint(1, turns_max)):
            pieces = rng.sample(texts, rng.randint(1, 3)) + rng.sample(MULTILINGUAL, rng.randint(0, 2))
            rng.shuffle(pieces)
            messages.append({"role": "user", "content": "\n".join(pieces)})
            messages.append({"role": "assistant", "content": rng.choice(texts + MULTILINGUAL)})
        out.append(messages)
    return out


def dumps(messages) -> str:
    return json.dumps(messages, ensure_ascii=False)[:200]

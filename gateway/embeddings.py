"""Embeddings: what the gateway does around the engines' ``Embed`` (the API is ``gateway/api/embeddings.py``).

Each input is tokenized here and embedded by one ``Embed`` call on a worker the routing policy picks (by its
ids, like a prompt), retried elsewhere when an attempt fails (``Generator.embed``). A request is bounded
before anything is sent: at most ``inputs_max`` inputs and ``tokens_max`` tokens across them (OpenAI's
bounds: 2,048 inputs, 300,000 tokens), each input within the model's context; at most ``calls_at_once`` of
its calls in flight, so one large batch does not take every engine slot at once.

``dimensions`` cuts a vector to its first N values and normalizes it again, which is what vLLM does for a
matryoshka model (a model trained so that its first N values are an embedding by themselves); as vLLM
does, it is refused for a model whose config.json does not say it is one, and limited to the sizes the
config lists when it lists some. The engines return normalized vectors, so cutting theirs and normalizing
equals cutting the model's and normalizing. ``base64``: the float32 values, little-endian, base64-encoded
(OpenAI's and vLLM's encoding).
"""

from __future__ import annotations

import base64
import dataclasses
import math
import struct
from collections.abc import Sequence

from .options import Option


@dataclasses.dataclass(frozen=True)
class EmbeddingConfig:
    inputs_max: int = 2048  # inputs in one request: OpenAI's bound
    tokens_max: int = 300_000  # tokens across one request's inputs: OpenAI's bound
    # Engine calls one request has in flight: 16 keep a batch moving on a few engines without taking all of a
    # large one's slots (each input is one call); the rest wait their turn.
    calls_at_once: int = 16


def cut(vector: Sequence[float], dimensions: int | None) -> Sequence[float]:
    """The first ``dimensions`` values, normalized again (unit length); the vector as it is without a cut."""
    if dimensions is None or dimensions >= len(vector):
        return vector
    head = vector[:dimensions]
    norm = math.sqrt(math.fsum(v * v for v in head))
    return [v / norm for v in head] if norm > 0 else list(head)


def encoded(vector: Sequence[float], encoding_format: str) -> "list[float] | str":
    """The vector as the API sends it: a list of floats, or its float32 little-endian bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return list(vector)


def dimensions_problem(model: str, sizes: "tuple[int, ...] | None", dimensions: int) -> str | None:
    """Why ``dimensions`` cannot be asked of a model with these matryoshka ``sizes`` (None: it can)."""
    if sizes is None:
        return (f"the model '{model}' does not support 'dimensions' (it is not a matryoshka model: changing the "
                "output dimensions would give poor embeddings)")
    if sizes and dimensions not in sizes:
        return f"the model '{model}' supports only these dimensions: {', '.join(map(str, sizes))}"
    return None


# This subsystem's flags (gateway/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--max-embedding-inputs", "embeddings.inputs_max", int, "inputs one /v1/embeddings request may carry",
           "http"),
    Option("--max-embedding-tokens", "embeddings.tokens_max", int, "tokens across one /v1/embeddings request's "
           "inputs", "http"),
)

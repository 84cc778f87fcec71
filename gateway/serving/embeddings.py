"""Embeddings: what the gateway does around the engines' ``Embed`` (the API is ``gateway/api/embeddings.py``).

Each input is tokenized here and embedded by one ``Embed`` call on a worker the routing policy picks (by its
ids, like a prompt), retried elsewhere when an attempt fails (``Generator.embed``). A request is bounded
before anything is sent: at most ``inputs_max`` inputs and ``tokens_max`` tokens across them (OpenAI's
bounds: 2,048 inputs, 300,000 tokens), each input within the model's context; at most ``calls_at_once`` of
its calls in flight, so one large batch does not take every engine slot at once.

The answer is bounded too (``--max-answer-bytes``, as a generation held whole): refused before anything is
embedded when its inputs times the model's size (or ``dimensions``) already pass the bound at the fewest bytes a
value takes (``answer_bytes_floor``), and stopped when the vectors, encoded as each arrives, pass it. Only the
encoded pieces are kept (a vector of Python floats is ~8x its JSON), and they are sent as they are, with no
second whole copy (2,048 inputs of a 4,096-value model were a 188 MB answer held twice).

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
from typing import Any

import orjson

from ..base.errors import InvalidInput
from ..base.options import Option

# The fewest bytes one value takes in the answer: as JSON, a float32 value of a unit vector printed as a double is
# 16-21 characters with its comma (0.015625476837158203,); only values such as 0.5 or 0.0 are shorter, which a
# model's vectors do not consist of. As base64, exactly 4 bytes a value times 4/3.
FLOAT_JSON_BYTES_FLOOR = 16
BASE64_BYTES_PER_VALUE = 16 / 3
ITEM_BYTES = 48  # {"object":"embedding","index":N,"embedding":...}, around each vector


class EmbeddingsTooLarge(InvalidInput):
    """An answer past --max-answer-bytes: before anything ran (``floor``: what it would at least be), or while the
    vectors arrived."""

    def __init__(self, bound_bytes: int, floor_bytes: int | None = None, inputs: int = 0, size: int = 0,
                 encoding_format: str = "float") -> None:
        if floor_bytes is not None:
            said = (f"the answer would be at least {floor_bytes} bytes ({inputs} vectors of {size} values as "
                    f"{encoding_format})")
        else:
            said = "the answer grew past the bound"
        hint = "; or ask for encoding_format base64 (about a quarter of the size)" if encoding_format == "float" else ""
        super().__init__(f"{said}, and at most {bound_bytes} bytes are held at once (--max-answer-bytes): send fewer "
                         f"inputs in one request{hint}", code="answer_too_large")


def answer_bytes_floor(inputs: int, size: int, encoding_format: str) -> int:
    """The fewest bytes ``inputs`` vectors of ``size`` values take in the answer."""
    per_value = BASE64_BYTES_PER_VALUE if encoding_format == "base64" else FLOAT_JSON_BYTES_FLOOR
    return int(inputs * (size * per_value + ITEM_BYTES))


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


class EncodedAnswer:
    """The answer's vectors, each encoded as it arrives (only its JSON kept) and counted against the bound."""

    HEAD = b'{"object":"list","data":['

    def __init__(self, bound_bytes: int, dimensions: int | None, encoding_format: str, inputs: int) -> None:
        self.bound_bytes = bound_bytes
        self.dimensions = dimensions
        self.encoding_format = encoding_format
        self.encoded: list[bytes] = [b""] * inputs
        self.size = len(self.HEAD) + 2 + max(0, inputs - 1)  # the head, "]," and the commas between items

    def check_floor(self, size: int) -> None:
        """Refuse now what the vectors cannot fit in."""
        floor = answer_bytes_floor(len(self.encoded), size, self.encoding_format)
        if floor > self.bound_bytes:
            raise EmbeddingsTooLarge(self.bound_bytes, floor, len(self.encoded), size, self.encoding_format)

    def keep(self, index: int, vector: Any) -> None:
        item = orjson.dumps({"object": "embedding", "index": index,
                             "embedding": encoded(cut(vector, self.dimensions), self.encoding_format)})
        self.size += len(item)
        if self.size > self.bound_bytes:
            raise EmbeddingsTooLarge(self.bound_bytes, encoding_format=self.encoding_format)
        self.encoded[index] = item

    def body(self, tail: Any) -> "tuple[list[bytes], int]":
        """(the answer as pieces to send in order, their size): the head, the items with commas, then the fields of
        ``tail`` (the model, usage) after them."""
        rest = orjson.dumps(tail)[1:]  # its fields and closing brace
        out = [self.HEAD]
        for index, item in enumerate(self.encoded):
            if index:
                out.append(b",")
            out.append(item)
        out.append(b"],")
        out.append(rest)
        return out, self.size + len(rest)


def dimensions_problem(model: str, sizes: "tuple[int, ...] | None", dimensions: int,
                       embedding_size: int | None = None) -> str | None:
    """Why ``dimensions`` cannot be asked of a model with these matryoshka ``sizes`` whose vectors have
    ``embedding_size`` values (None: it can). vLLM's checks, in its order (PoolingParams): a matryoshka model, a
    size from 1 to the model's, one of its listed sizes."""
    if sizes is None:
        return (f"the model '{model}' does not support 'dimensions' (it is not a matryoshka model: changing the "
                "output dimensions would give poor embeddings)")
    if embedding_size is not None and not 1 <= dimensions <= embedding_size:
        return (f"the model '{model}' only supports dimensions in range [1, {embedding_size}], got {dimensions}: "
                "a vector cannot be cut longer than it is")
    if sizes and dimensions not in sizes:
        return f"the model '{model}' supports only these dimensions: {', '.join(map(str, sizes))}"
    return None


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--max-embedding-inputs", "embeddings.inputs_max", int, "inputs one /v1/embeddings request may carry",
           "http"),
    Option("--max-embedding-tokens", "embeddings.tokens_max", int, "tokens across one /v1/embeddings request's "
           "inputs", "http"),
)

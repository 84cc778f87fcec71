"""Scores of text pairs from an embedding model's vectors, as vLLM's own server computes them for a bi-encoder.

vLLM serves ``/score`` and ``/rerank`` for an embedding model by embedding every query and document on its own (each
tokenized with the model's special tokens) and scoring each pair by the cosine similarity of its two vectors, in
float32 (``BiEncoderIOProcessor`` of vllm/entrypoints/pooling/scoring/io_processor.py): one query is scored against
every document (1:N), N queries against N documents pairwise (N:N). A rerank is the 1:N scores sorted from the most
relevant, the first ``top_n`` of them. What is computed here is that, without I/O; gateway/api/scoring.py asks the
engines for the vectors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# torch's cosine_similarity bounds the product of the norms below by eps (1e-8): a zero vector scores 0, not NaN.
NORM_EPS = 1e-8


def pairs_problem(queries: int, documents: int) -> str | None:
    """Why these counts cannot be paired (vLLM's rule: 1:1, 1:N or N:N), or None."""
    if queries == 0:
        return "at least one query is needed"
    if documents == 0:
        return "at least one document is needed"
    if queries > 1 and queries != documents:
        return f"{queries} queries and {documents} documents: pair one query with every document, or as many " \
               "queries as documents"
    return None


def cosine(a: "Sequence[float]", b: "Sequence[float]") -> float:
    """The cosine similarity of two vectors, in float32 as vLLM's server computes it."""
    x, y = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    if x.shape != y.shape:
        raise ValueError(f"vectors of {x.size} and {y.size} values cannot be compared")
    norms = np.sqrt(np.float32(np.dot(x, x)) * np.float32(np.dot(y, y)))
    return float(np.float32(np.dot(x, y)) / max(norms, np.float32(NORM_EPS)))


def pair_scores(query_vectors: "Sequence[Sequence[float]]", document_vectors: "Sequence[Sequence[float]]"
                ) -> list[float]:
    """Each document's score against its query: the one query's, or its own (pairs_problem held)."""
    if len(query_vectors) == 1:
        return [cosine(query_vectors[0], d) for d in document_vectors]
    return [cosine(q, d) for q, d in zip(query_vectors, document_vectors)]


def ranked(scores: "Sequence[float]", top_n: int) -> list[int]:
    """Documents' indexes from the most relevant (ties in the documents' order, as a stable sort leaves them), the
    first ``top_n`` (0: all of them)."""
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    return order[:top_n] if 0 < top_n < len(order) else order

"""Scores from vectors as vLLM's server computes them for an embedding model (gateway/serving/scoring.py)."""

from __future__ import annotations

import math

from gateway.serving.scoring import cosine, pair_scores, pairs_problem, ranked


def test_cosine_is_the_float32_cosine_and_a_zero_vector_scores_zero():
    a, b = [0.6, 0.8, 0.0], [0.8, 0.6, 0.0]
    assert abs(cosine(a, b) - 0.96) < 1e-7
    assert abs(cosine([1, 2, 3], [2, 4, 6]) - 1.0) < 1e-6 and cosine([0, 0], [1, 0]) == 0.0
    assert not math.isnan(cosine([0.0] * 4, [0.0] * 4))


def test_pairs_are_one_to_many_or_pairwise_and_rankings_stable():
    assert pairs_problem(1, 3) is None and pairs_problem(3, 3) is None
    assert "2 queries and 3 documents" in pairs_problem(2, 3) and pairs_problem(0, 1) and pairs_problem(1, 0)
    q, docs = [[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    scores = pair_scores(q, docs)
    assert [round(s, 6) for s in scores] == [1.0, 0.0, round(1 / math.sqrt(2), 6)]
    assert pair_scores([[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]) == [0.0, 1.0]
    assert ranked(scores, 0) == [0, 2, 1] and ranked(scores, 2) == [0, 2] and ranked(scores, 9) == [0, 2, 1]
    assert ranked([0.5, 0.5, 0.7], 0) == [2, 0, 1]  # ties keep the documents' order

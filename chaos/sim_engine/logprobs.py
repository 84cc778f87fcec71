"""Log probabilities the simulated engine reports: deterministic, and shaped as a real engine's.

Each token gets a logprob drawn from (seed, position), and ``k`` alternatives most likely first:
the token itself (the simulation is greedy: what it says is what it found most likely) and
``k - 1`` of its word tokens with lower logprobs. The prompt's first token has none, as in a real
engine (nothing comes before it).
"""

from __future__ import annotations

import random

LogprobEntry = "tuple[int, float | None, list[tuple[int, float]]]"


def token_logprobs(token_ids: "list[int]", first_position: int, seed: int, k: int,
                   words: "tuple[int, ...]") -> "list[LogprobEntry]":
    return [_entry(token_id, first_position + i, seed, k, words) for i, token_id in enumerate(token_ids)]


def prompt_logprobs(prompt_ids: "list[int]", seed: int, k: int, words: "tuple[int, ...]") -> "list[LogprobEntry]":
    entries = token_logprobs(prompt_ids, -len(prompt_ids), seed, k, words)
    if entries:
        entries[0] = (entries[0][0], None, [])
    return entries


def _entry(token_id: int, position: int, seed: int, k: int, words: "tuple[int, ...]") -> "LogprobEntry":
    rng = random.Random(seed * 1_000_003 + position)
    logprob = -round(rng.uniform(0.001, 2.0), 4)
    alternatives = [(token_id, logprob)]
    value = logprob
    while len(alternatives) < k:
        candidate = words[rng.randrange(len(words))]
        if any(candidate == alt for alt, _ in alternatives):
            continue
        value = round(value - rng.uniform(0.1, 1.5), 4)
        alternatives.append((candidate, value))
    return token_id, logprob, alternatives[:k]

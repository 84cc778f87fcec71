"""Hostile values for peers' payloads: a seeded generator of extreme and random values, and a mutator that
puts them in place of one field of a valid frame (the way a key holder would craft one).

Structure-aware on purpose: random bytes rarely get past a decoder's first check, while a valid frame with
one number replaced by 2^64 - 1, NaN or -1 reaches the arithmetic behind it. Every draw comes from the
``random.Random`` given, so a failing case replays from its seed.
"""

from __future__ import annotations

import random
from typing import Any

# What msgpack can carry, at the edges where arithmetic on a decoded value overflows what it can encode.
EXTREME_INTS = (0, 1, -1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 53, 2 ** 53 + 1, 2 ** 62, 2 ** 63 - 1,
                2 ** 63, 2 ** 64 - 1, -2 ** 31, -2 ** 63)
EXTREME_FLOATS = (0.0, -0.0, 1e-300, 1e15, 1.5e19, 1e300, -1e300, float("inf"), float("-inf"), float("nan"))
EXTREME_TEXTS = ("", "a", "x" * 129, "x" * 257, "x" * 513, "x" * 5000, "\x00", "é" * 200, "../../etc", "%s%n")


def extreme(rng: random.Random, depth: int = 0) -> Any:
    """One value of any msgpack type, biased to the edges."""
    kind = rng.randrange(10 if depth < 2 else 7)
    if kind == 0:
        return rng.choice(EXTREME_INTS)
    if kind == 1:
        return rng.randrange(-2 ** 63, 2 ** 64)
    if kind == 2:
        return rng.choice(EXTREME_FLOATS)
    if kind == 3:
        return rng.choice(EXTREME_TEXTS)
    if kind == 4:
        return rng.randbytes(rng.choice((0, 1, 8, 64, 4096)))
    if kind == 5:
        return rng.choice((True, False, None))
    if kind == 6:
        return rng.choice((0, 1, 2, -1, "", None))
    if kind in (7, 8):
        return [extreme(rng, depth + 1) for _ in range(rng.choice((0, 1, 2, 5, 11)))]
    return {rng.choice(EXTREME_TEXTS[:5]): extreme(rng, depth + 1) for _ in range(rng.choice((0, 1, 3)))}


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, prefix + (i,))
    elif isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, prefix + (key,))
    return out


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        return [(_replace(v, rest, new) if i == head else v) for i, v in enumerate(value)]
    return {k: (_replace(v, rest, new) if k == head else v) for k, v in value.items()}


def mutate(rng: random.Random, value: Any) -> Any:
    """``value`` with one field (or element, or the whole) replaced, dropped or duplicated."""
    paths = _paths(value)
    path = rng.choice(paths[1:] if len(paths) > 1 and rng.random() < 0.9 else paths)
    move = rng.random()
    if move < 0.75 or not path:
        return _replace(value, path, extreme(rng))
    parent_path, last = path[:-1], path[-1]
    parent = value
    for step in parent_path:
        parent = parent[step]
    if isinstance(parent, list):
        items = list(parent)
        if move < 0.87:
            del items[last]
        else:
            items.insert(last, items[last])
        return _replace(value, parent_path, items)
    return _replace(value, path, extreme(rng))


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """``data`` with a few bytes flipped, cut short or extended."""
    data = bytearray(data)
    for _ in range(rng.choice((1, 2, 8))):
        move = rng.random()
        if not data or move < 0.2:
            data += rng.randbytes(rng.choice((1, 16)))
        elif move < 0.4:
            del data[rng.randrange(len(data)):]
        else:
            data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)

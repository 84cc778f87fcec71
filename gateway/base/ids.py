"""Ids of what the gateway stores or hands out (responses, items, messages, tool calls): unguessable.

A stored response's id is all a client needs to read it back on a node without authentication, so
ids come from the operating system's random source, never from ``random`` (whose state a client can
recover from ids it is shown). One ``os.urandom`` per id was a system call per id, three or more per
Responses request; a pool of 4 KiB serves 341 ids of 12 bytes per call. A forked worker process
(``--workers N``) forgets the pool it inherited, or two processes would hand out the same ids.
"""

from __future__ import annotations

import os

ID_BYTES = 12  # 96 random bits: OpenAI-style ids (prefix, underscore, 24 hex characters)
ID_CHARS = 2 * ID_BYTES
POOL_BYTES = 4096 - 4096 % ID_BYTES

# The pool as hex, made once per refill: a slice of it and one f-string per id took ~185 ns where a slice of
# bytes, ``hex()`` and two concatenations took ~430 (three or more ids a Responses request).
_pool = ""
_taken = 0


def new_id(prefix: str) -> str:
    """``prefix``, an underscore and 24 hex characters of fresh randomness."""
    global _pool, _taken
    start = _taken
    if start + ID_CHARS > len(_pool):
        _pool, start = os.urandom(POOL_BYTES).hex(), 0
    _taken = start + ID_CHARS
    return f"{prefix}_{_pool[start:_taken]}"


def _forget_pool() -> None:
    global _pool, _taken
    _pool, _taken = "", 0


os.register_at_fork(after_in_child=_forget_pool)

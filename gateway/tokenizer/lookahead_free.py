"""The pre-tokenizer regex without its lookahead, and the texts it splits exactly as the original.

Qwen2/2.5/3 and Llama 3 (and tiktoken's cl100k) pre-tokenize with

    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+

(Qwen: ``\\p{N}`` alone). Its one lookaround, ``\\s+(?!\\S)``, leaves the last character of a
whitespace run to the word after it ("a   b" -> "a", "  ", " b"). Because of it fancy-regex runs
the pattern in its backtracking VM; without it (``...|\\s*[\\r\\n]+|\\s+``) the whole pattern goes
to regex-automata's DFA, and tiktoken encodes a 7,800-token English prompt in ~0.55 ms instead of
~0.79 ms (BENCHMARKS.md, tenth pass).

When the two split a text alike. Say WS is Unicode White_Space (fancy-regex's ``\\s``) and
NNWS is WS without ``\\r`` and ``\\n``. The patterns differ only in ``\\s+(?!\\S)|\\s+``
against ``\\s+``: they pick different pieces only where the scanner reaches ``\\s+(?!\\S)``
at a position where 2 or more whitespace characters follow and then a non-space (there the
original stops one short; at the end of the text, or with one whitespace character, both
take the same). Reaching that alternative at a whitespace position means every earlier one
failed, ``\\s*[\\r\\n]+`` included, so the run from there holds no newline: it is 2 or more
NNWS characters followed by a non-space. A text with no two adjacent NNWS characters has no
such place, and both patterns give it the same pieces, hence (the BPE works piece by piece)
the same ids. ``splits_alike`` checks that conservatively and cheaply (a literal search and
``str.__contains__`` per character, ~13 us for 40 KB of English); other texts keep the original pattern.

Only the exact patterns above qualify: the argument needs every alternative before
``\\s*[\\r\\n]+`` to end in a non-space or a newline, which an arbitrary pattern need not.
tests/unit/test_fast_bpe.py checks the claim on every character of the Basic Multilingual
Plane in whitespace runs, and on a large corpus.
"""

from __future__ import annotations

import re

_LOOKAHEAD_TAIL = r"|\s*[\r\n]+|\s+(?!\S)|\s+"
_NO_LOOKAHEAD_TAIL = r"|\s*[\r\n]+|\s+"
_HEAD = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_KNOWN_PATTERNS = {
    _HEAD + r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*" + _LOOKAHEAD_TAIL,  # Qwen2, Qwen2.5, Qwen3
    _HEAD + r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*" + _LOOKAHEAD_TAIL,  # Llama 3, cl100k
}

# SRE finds a literal with a memchr-driven scan: ~12 us for 40 KB against ~29 us for `"  " in text`
# (str's two-character search restarts at every single space).
_DOUBLE_SPACE = re.compile("  ")
# Unicode White_Space without \r and \n: ASCII ones first, then the rest.
_ASCII_NNWS = ("\t", "\x0b", "\x0c")
_NON_ASCII_NNWS = ("\x85", "\xa0", "\u1680", *map(chr, range(0x2000, 0x200B)), "\u2028", "\u2029", "\u202f",
                   "\u205f", "\u3000")


def without_lookahead(pattern: str) -> str | None:
    """The pattern without ``\\s+(?!\\S)``, when it is one this module's argument covers; else None."""
    if pattern not in _KNOWN_PATTERNS:
        return None
    return pattern[:-len(_LOOKAHEAD_TAIL)] + _NO_LOOKAHEAD_TAIL


def splits_alike(text: str) -> bool:
    """True only if the lookahead-free pattern splits ``text`` as the original (no two adjacent NNWS).

    Conservative: the tabs and non-ASCII spaces it refuses on sight need not be adjacent.
    """
    if _DOUBLE_SPACE.search(text) is not None:
        return False
    for char in _ASCII_NNWS:
        if char in text:
            return False
    if text.isascii():
        return True
    # A character above the text's widest one is rejected without a scan, so Latin-1 text costs
    # two searches here, not nineteen.
    for char in _NON_ASCII_NNWS:
        if char in text:
            return False
    return True

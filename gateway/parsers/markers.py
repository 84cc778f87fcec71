"""Finding a marker in streamed text without letting half of it out as text."""

from __future__ import annotations


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker`` (kept until more arrives)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def split_before(text: str, markers: "tuple[str, ...]") -> tuple[str, str]:
    """(text that is surely before any of ``markers``, the rest): the rest starts at a marker's first
    character or at a tail that may still become one."""
    keep = max(held_back(text, marker) for marker in markers)
    return text[:len(text) - keep], text[len(text) - keep:]

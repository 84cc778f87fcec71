"""Stop strings matched across chunk boundaries.

Text arrives in pieces; a stop string may straddle two of them ("Hel" + "lo").
The matcher emits text only once it is decided: any tail of the buffered text
that could still become the start of a stop string is held back until the next
piece settles it (or the generation ends, and it is flushed).
"""

from __future__ import annotations

from typing import NamedTuple


class StopResult(NamedTuple):
    """What one piece of text decided (a NamedTuple: one is made per streamed token)."""

    text: str  # safe to emit now
    matched: str | None = None  # the stop string that ended the generation, if any


class StopMatcher:
    def __init__(self, stops: "list[str] | tuple[str, ...]", include_stop_str: bool = False) -> None:
        self.stops = tuple(s for s in stops if s)
        self.include_stop_str = include_stop_str
        self._held = ""
        self._hold_max = max((len(s) for s in self.stops), default=1) - 1
        self.done = False

    def feed(self, text: str) -> StopResult:
        if self.done:
            return StopResult("")
        if not self.stops:
            return StopResult(text)
        buffer = self._held + text
        best: tuple[int, str] | None = None
        for stop in self.stops:
            pos = buffer.find(stop)
            if pos >= 0 and (best is None or pos < best[0] or (pos == best[0] and len(stop) > len(best[1]))):
                best = (pos, stop)
        if best is not None:
            pos, stop = best
            self.done = True
            self._held = ""
            return StopResult(buffer[:pos + len(stop)] if self.include_stop_str else buffer[:pos], matched=stop)
        keep = self._undecided_tail(buffer)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return StopResult(buffer[:len(buffer) - keep])

    def flush(self) -> str:
        """The generation ended without a stop string: release what was held back."""
        held, self._held = self._held, ""
        return "" if self.done else held

    def _undecided_tail(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of a stop string."""
        for k in range(min(self._hold_max, len(buffer)), 0, -1):
            tail = buffer[-k:]
            if any(stop.startswith(tail) for stop in self.stops):
                return k
        return 0

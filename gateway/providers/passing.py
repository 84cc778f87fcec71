"""A provider's stream passed to a client of the provider's own API (``Provider.relays``): Anthropic's events to a
Messages client, OpenAI's chunks to a chat client. The client is given what the provider wrote, every field of it,
as it would calling the provider itself; the node still reads what it needs (the finish, the usage, an error).

Nothing goes before it is checked: each event is read by its wire's ``check`` (a JSON object of the wire's kind;
text events of the learned shape by their bytes, as ``TextEvents`` reads them, so a run of them is checked as
parsing each would check it). A piece of whole events in the usual framing goes as it came (less what must not go);
anything else (an event cut between pieces, comments, carriage returns, several data lines) is written again in
that framing. What each event is decides whether it goes:

    PASS        it goes (the answer has begun)
    EARLY       before the answer began it waits (Anthropic's message_start, OpenAI's role chunk); after, it goes
    EARLY_DROP  before the answer began it is dropped (pings); after, it goes
    DROP        never (OpenAI's ``[DONE]``, which the node writes itself; a usage chunk the client did not ask for)

Holding what comes before the answer keeps a failure right after it (Anthropic's overloaded error after
message_start) the route's to move on from: nothing has gone to the client. What is held is bounded
(``HELD_BYTES_MAX``): past it the answer is taken to have begun.

Pure: no I/O.
"""

from __future__ import annotations

import abc

from .base import Passed, StreamReader
from .sse import event_at
from .text_events import TextEvents

PASS, EARLY, EARLY_DROP, DROP = "pass", "early", "early_drop", "drop"

# What waits for the answer to begin is a message_start or a role chunk (a few hundred bytes); a provider that sends
# more before its answer has begun (endless empty chunks) has its events passed on rather than held without bound.
HELD_BYTES_MAX = 64 * 1024


def data_lines(payload: bytes) -> bytes:
    """``payload`` as an event's data lines and the blank line that ends it: a newline in it (an event of several
    data lines, which the decoder joined so) begins another data line, which the client joins back."""
    return b"data: " + payload.replace(b"\n", b"\ndata: ") + b"\n\n"


class PassingReader(StreamReader):
    """The wire's reader (``check``, ``framed``, ``finish``) over the module's passing; ``frame`` is how each of the
    wire's events begins in the body (``event: `` for named events, ``data: ``)."""

    frame: bytes

    def __init__(self, events: TextEvents) -> None:
        self._events = events
        self._held: list[bytes] = []  # what waits for the answer to begin
        self._held_bytes = 0
        self._opened = False
        self.answer_id: bytes | None = None  # the answer's id in the events, as JSON (a wire's check learns it)

    @abc.abstractmethod
    def check(self, payload: bytes) -> str:
        """What the event whose data is ``payload`` is (the module's constants), once it is checked (a
        ProviderError when it is not the wire's, or says the provider failed) and read."""

    @abc.abstractmethod
    def framed(self, payload: bytes) -> bytes:
        """The event just checked, in the wire's framing."""

    def feed(self, data: bytes) -> "list":
        if self._events.whole_events(data):
            out = self._regular(data)
            if out is not None:
                return [Passed(out, self.answer_id)] if out else []
        return self._rewritten(data)

    def _hold(self, event: bytes) -> None:
        self._held.append(event)
        self._held_bytes += len(event)
        if self._held_bytes > HELD_BYTES_MAX:
            self._opened = True

    def _open(self, out: "list[bytes]") -> None:
        self._opened = True
        out += self._held
        self._held.clear()

    def _regular(self, data: bytes) -> "bytes | None":
        """``data``'s events (whole) that go, when each is in the usual framing (one event line, if the wire names
        its events, and one data line); None when one is not (the piece is then written again)."""
        shape = self._events.shape
        frame = self.frame
        out: list[bytes] = []
        pos, size = 0, len(data)
        start = 0  # where the events that go unchanged began
        single_until = 0  # a run refused before that: its events are parsed one at a time
        while pos < size:
            if shape is not None and pos >= single_until and data.startswith(shape.head, pos):
                end, text = shape.run(data, pos)
                if text is not None:  # text events of the shape: they go
                    if not self._opened:
                        self._open(out)
                        start = pos
                    pos = end
                    continue
                single_until = end
            event = event_at(data, pos) if data.startswith(frame, pos) else None
            if event is None:
                return None
            payload, end = event
            verdict = DROP if payload == b"[DONE]" else self.check(payload)
            shape = self._events.shape  # (learned from a text event it parsed, for the next ones)
            if self._opened:
                if verdict == DROP:
                    out.append(data[start:pos])
                    start = end
            elif verdict == PASS:
                self._open(out)
                start = pos
            else:
                if verdict == EARLY:
                    self._hold(data[pos:end])
                    if self._opened:  # (held past the bound: the answer is taken to have begun)
                        out += self._held
                        self._held.clear()
                start = end
            pos = end
        if self._opened:
            out.append(data[start:size])
        return b"".join(out)

    def _rewritten(self, data: bytes) -> "list":
        """The events ``data`` completes that go, written again in the wire's framing (comments, carriage returns
        and OpenAI's ``[DONE]`` left out)."""
        out: list[bytes] = []
        for _, payload in self._events.raw(data):
            verdict = DROP if payload == b"[DONE]" else self.check(payload)
            if verdict == DROP:
                continue
            if not self._opened:
                if verdict == EARLY_DROP:
                    continue
                if verdict == EARLY:
                    self._hold(self.framed(payload))
                    if self._opened:
                        out += self._held
                        self._held.clear()
                    continue
                self._open(out)
            out.append(self.framed(payload))
        return [Passed(b"".join(out), self.answer_id)] if out else []

"""A Responses stream's events: the one place they are made (``EventStream.emit``), and the order they may come in.

Every event of a stream takes the next sequence number, goes into the resumable log when the stream has one (a
background stream's: ``stream_log.StreamLog``, which a client that dropped resumes from), and must follow the one
before it as ``FOLLOWS`` says: the grammar of OpenAI's stream, kept as h11 keeps its states. ``emit`` does all
three, so an event kind added anywhere is numbered and logged, and one added out of order fails at once
(``EventOrderError``: our bug, never the client's) instead of breaking a resumed stream silently.

An event's bytes are ``event: KIND\\ndata: {"type":KIND,"sequence_number":N`` (its head: made once per kind, every
kind being the code's own) and its tail, the rest of its JSON from ``,`` to ``}`` and the blank line; the shape
(``shape.py``) makes tails, from templates where a stream makes many (a message's text deltas), held to what
encoding the fields would make by tests/unit/test_response_shape.py.

The grammar (``FOLLOWS``): created, then queued (a background stream) or in_progress; then items, each from
output_item.added to output_item.done (a message's or reasoning's content part, its deltas and done; a call's
arguments; an MCP tool list; an MCP call's progress, which may wait for the step's other calls); then completed,
incomplete or failed, after which nothing. failed may follow anything before the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from .stream_log import StreamLog

CREATED = "response.created"
QUEUED = "response.queued"
IN_PROGRESS = "response.in_progress"
COMPLETED = "response.completed"
INCOMPLETE = "response.incomplete"
FAILED = "response.failed"
ITEM_ADDED = "response.output_item.added"
ITEM_DONE = "response.output_item.done"
PART_ADDED = "response.content_part.added"
PART_DONE = "response.content_part.done"
TEXT_DELTA = "response.output_text.delta"
TEXT_DONE = "response.output_text.done"
REASONING_DELTA = "response.reasoning_text.delta"
REASONING_DONE = "response.reasoning_text.done"
FUNCTION_ARGUMENTS_DELTA = "response.function_call_arguments.delta"
FUNCTION_ARGUMENTS_DONE = "response.function_call_arguments.done"
MCP_ARGUMENTS_DELTA = "response.mcp_call_arguments.delta"
MCP_ARGUMENTS_DONE = "response.mcp_call_arguments.done"
MCP_LIST_IN_PROGRESS = "response.mcp_list_tools.in_progress"
MCP_LIST_COMPLETED = "response.mcp_list_tools.completed"
MCP_LIST_FAILED = "response.mcp_list_tools.failed"
MCP_CALL_IN_PROGRESS = "response.mcp_call.in_progress"
MCP_CALL_COMPLETED = "response.mcp_call.completed"
MCP_CALL_FAILED = "response.mcp_call.failed"

START = "(start)"  # before the first event
ENDS = frozenset({COMPLETED, INCOMPLETE, FAILED})
# Where an item may begin or the response end.
_BOUNDARY = frozenset({ITEM_ADDED, *ENDS})
_FOLLOWS: dict[str, frozenset[str]] = {
    START: frozenset({CREATED}),
    CREATED: frozenset({QUEUED, IN_PROGRESS}),
    QUEUED: frozenset({IN_PROGRESS}),
    IN_PROGRESS: _BOUNDARY,
    # An item's first events, by its type: a message's or reasoning's content part, a call's arguments (an MCP
    # call the loop makes itself, or one a model proposed), an MCP tool list, an approval request (done at once).
    ITEM_ADDED: frozenset({PART_ADDED, FUNCTION_ARGUMENTS_DELTA, FUNCTION_ARGUMENTS_DONE, MCP_ARGUMENTS_DELTA,
                           MCP_ARGUMENTS_DONE, MCP_LIST_IN_PROGRESS, ITEM_DONE}),
    PART_ADDED: frozenset({TEXT_DELTA, TEXT_DONE, REASONING_DELTA, REASONING_DONE}),
    TEXT_DELTA: frozenset({TEXT_DELTA, TEXT_DONE}),
    REASONING_DELTA: frozenset({REASONING_DELTA, REASONING_DONE}),
    TEXT_DONE: frozenset({PART_DONE}),
    REASONING_DONE: frozenset({PART_DONE}),
    PART_DONE: frozenset({ITEM_DONE}),
    FUNCTION_ARGUMENTS_DELTA: frozenset({FUNCTION_ARGUMENTS_DELTA, FUNCTION_ARGUMENTS_DONE}),
    FUNCTION_ARGUMENTS_DONE: frozenset({ITEM_DONE}),
    MCP_ARGUMENTS_DELTA: frozenset({MCP_ARGUMENTS_DELTA, MCP_ARGUMENTS_DONE}),
    # An MCP call's item stays open while it runs: the step's next item, or the calls' progress (a call past the
    # response's max_tool_calls fails without running).
    MCP_ARGUMENTS_DONE: _BOUNDARY | {MCP_CALL_IN_PROGRESS, MCP_CALL_COMPLETED, MCP_CALL_FAILED},
    MCP_CALL_IN_PROGRESS: frozenset({MCP_CALL_IN_PROGRESS, MCP_CALL_COMPLETED, MCP_CALL_FAILED}),
    MCP_CALL_COMPLETED: frozenset({ITEM_DONE}),
    MCP_CALL_FAILED: frozenset({ITEM_DONE}),
    # A step lists its servers' tools all at once: the next listing may begin before the first is done.
    MCP_LIST_IN_PROGRESS: frozenset({ITEM_ADDED, MCP_LIST_COMPLETED, MCP_LIST_FAILED}),
    MCP_LIST_COMPLETED: frozenset({ITEM_DONE}),
    MCP_LIST_FAILED: frozenset({ITEM_DONE}),
    # After an item: the next, the end, or (an MCP step) the other listings' and calls' results.
    ITEM_DONE: _BOUNDARY | {MCP_LIST_COMPLETED, MCP_LIST_FAILED, MCP_CALL_IN_PROGRESS, MCP_CALL_COMPLETED,
                            MCP_CALL_FAILED},
    COMPLETED: frozenset(),
    INCOMPLETE: frozenset(),
    FAILED: frozenset(),
}
# failed may come after anything but the end (an error mid-stream); its open item's closing events come first.
FOLLOWS: dict[str, frozenset[str]] = {kind: nexts | ({FAILED} if kind not in ENDS and kind != START else frozenset())
                                      for kind, nexts in _FOLLOWS.items()}
KINDS = frozenset(FOLLOWS) - {START}


class EventOrderError(AssertionError):
    """An event made out of the stream's order: a bug of the shape's, said with what came before."""


def event_head(kind: str) -> bytes:
    """An event's bytes up to its sequence number."""
    return b"event: " + kind.encode() + b'\ndata: {"type":' + orjson.dumps(kind) + b',"sequence_number":'


HEADS: dict[str, bytes] = {kind: event_head(kind) for kind in KINDS}


class EventStream:
    """One stream's numbering, log and place in the grammar (see the module's docstring). A response answered
    whole has none: ``silent()`` makes nothing (its tool loop's steps still call the shape's event methods)."""

    __slots__ = ("sequence", "log", "_last", "_next")

    def __init__(self, log: "StreamLog | None" = None) -> None:
        self.sequence = 0
        self.log = log  # a background stream's: every event is kept there, for a resume
        self._last = START
        self._next = FOLLOWS[START]

    def emit(self, kind: str, tail: bytes) -> bytes:
        """The event ``kind`` whose JSON goes on with ``tail`` after its sequence number: numbered, logged, in
        order."""
        if kind not in self._next:
            raise EventOrderError(f"{kind} cannot follow {self._last} in a Responses stream")
        self._last, self._next = kind, FOLLOWS[kind]
        sequence = self.sequence
        self.sequence = sequence + 1
        frame = b"%s%d%s" % (HEADS[kind], sequence, tail)
        if self.log is not None:
            self.log.append(sequence, kind, frame)
        return frame

    @property
    def ended(self) -> bool:
        return self._last in ENDS


class _Silent(EventStream):
    __slots__ = ()

    def emit(self, kind: str, tail: bytes) -> bytes:
        return b""


def silent() -> EventStream:
    """The events of a response answered whole: none."""
    return _Silent()

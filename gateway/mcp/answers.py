"""MCP servers' answers, bounded as they arrive and before the SDK reads them.

Why a gate of our own: the ``mcp`` SDK (2.3) reads a JSON answer whole (``response.aread()``) and validates it
with pydantic on the event loop; its SSE reader bounds one event (1 MiB) but nothing bounds a JSON body, and a
tool list is validated whole before the node sees it. A server that answers with chunked JSON that never ends
took a node from 1.0 to 6.7 GiB; 200,000 small tools (~10 MB) stalled every request for 7.4 s. So every HTTP
answer a session gets passes through ``GatedTransport`` (the session's httpx2 transport, in front of the pinned
one for clients' URLs), which hands the SDK only whole messages that passed:

    a JSON body, or one SSE event, is read no further than its bound: ``answer_bytes_max`` (a ``tools/list``
    answer: ``list_bytes_max``); past it the read fails with ``AnswerRefused`` naming the bound
    every message is parsed once here (in a worker thread when it is over ``THREAD_PARSE_BYTES``) and its typed
    items counted (a call's content parts, a list's tools, resources, prompts): more than ``items_max`` and it
    is refused the same way. The SDK's own parse and validation then handle bounded bytes and bounded items
    (pydantic takes ~6.5 us a content part: 40,000 parts in 1 MiB were 330 ms on the loop)
    a compressed answer is refused: the gate asks for ``identity`` and counts what the SDK will read

A refusal trips the session's ``Trip``: the calls in flight on it are cancelled and answered with the reason
(an ``http_error`` 502), and the session is dropped. The SDK sees ``AnswerRefused`` as a stream error (JSON: a
JSON-RPC parse error for that request) or an SSE error (SSE: the stream ends), so it stops reading either way.

stdio servers (configured by the operator, never by a client) are read by a transport of ours with the same bounds
(``gateway/mcp/stdio.py``): the SDK's line reader keeps a line whole however long it grows.
"""

from __future__ import annotations

import re
from typing import Any

import httpx2
import orjson
import trio

# Messages at most this large are parsed on the event loop (~0.1 ms); larger ones in a worker thread.
THREAD_PARSE_BYTES = 64 * 1024
# The lists inside an answer the SDK validates item by item into typed models.
TYPED_LISTS = ("content", "tools", "resources", "resourceTemplates", "prompts")
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")  # an SSE event ends with a blank line


def message_problem(message: bytes, items_max: int) -> str | None:
    """Why one message (a JSON-RPC message or a batch of them) is refused; None when it is not. What does not
    parse is left to the SDK, which says so itself."""
    try:
        value = orjson.loads(message)
    except orjson.JSONDecodeError:
        return None
    for one in value if isinstance(value, list) else (value,):
        result = one.get("result") if isinstance(one, dict) else None
        if not isinstance(result, dict):
            continue
        for name in TYPED_LISTS:
            items = result.get(name)
            if isinstance(items, list) and len(items) > items_max:
                return f"answered {len(items)} {name} items in one message; at most {items_max} are read"
    return None


async def checked_message(message: bytes, items_max: int) -> str | None:
    """``message_problem``, in a worker thread when the message is over THREAD_PARSE_BYTES."""
    if len(message) > THREAD_PARSE_BYTES:
        return await trio.to_thread.run_sync(message_problem, message, items_max)
    return message_problem(message, items_max)


class AnswerRefused(httpx2.StreamError, httpx2.SSEError):
    """An answer past a bound. Both a StreamError (what the SDK catches around a JSON body) and an SSEError
    (what it catches around an event stream), so it stops reading and resolves the request either way."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self._request = None


class Trip:
    """One session's refusal: the first reason, and the calls in flight to cancel when it comes."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._scopes: set[trio.CancelScope] = set()

    def trip(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        for scope in self._scopes:
            scope.cancel()

    def watching(self) -> "_Watch":
        """``with trip.watching():`` cancels the block when the session trips (the block's caller reads
        ``reason`` after it)."""
        return _Watch(self)


class _Watch:
    def __init__(self, trip: Trip) -> None:
        self.trip = trip
        self.scope = trio.CancelScope()

    def __enter__(self) -> trio.CancelScope:
        if self.trip.reason is not None:
            self.scope.cancel()
        self.trip._scopes.add(self.scope)
        return self.scope.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        self.trip._scopes.discard(self.scope)
        return self.scope.__exit__(*exc)


class GatedTransport(httpx2.AsyncBaseTransport):
    """``inner``'s answers, each message bounded and checked before it is read (see the module's docstring)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, trip: Trip, answer_bytes_max: int, list_bytes_max: int,
                 items_max: int, flag: str = "--mcp-max-answer-bytes") -> None:
        self.inner = inner
        self.trip = trip
        self.answer_bytes_max = answer_bytes_max
        self.list_bytes_max = list_bytes_max
        self.items_max = items_max
        self.flag = flag

    async def aclose(self) -> None:
        await self.inner.aclose()

    def _bound(self, request: httpx2.Request) -> tuple[int, str]:
        """(bytes one message of the answer may take, the option that sets it): a tool list's own bound when the
        request lists tools."""
        try:
            method = orjson.loads(request.content).get("method") if request.method == "POST" else None
        except (orjson.JSONDecodeError, AttributeError, httpx2.RequestNotRead):
            method = None
        if method == "tools/list":
            return self.list_bytes_max, "--mcp-max-output-bytes x 4"
        return self.answer_bytes_max, self.flag

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["accept-encoding"] = "identity"
        bound, flag = self._bound(request)
        response = await self.inner.handle_async_request(request)
        refusal = None
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            refusal = f"sent a {encoding}-encoded answer (the node asks for none: it bounds what it reads)"
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > bound:
            refusal = f"answered {declared} bytes, more than {bound} ({flag})"
        sse = response.headers.get("content-type", "").lower().startswith("text/event-stream")
        if refusal is not None:
            await response.aclose()
            body: httpx2.AsyncByteStream = _Refused(self, refusal)
        else:
            body = _GatedBody(self, response.stream, bound, flag, sse)
        return httpx2.Response(response.status_code, headers=response.headers, stream=body,
                               extensions=response.extensions, request=request)

    def refuse(self, reason: str) -> AnswerRefused:
        self.trip.trip(reason)
        return AnswerRefused(f"the MCP server {reason}")


class _Refused(httpx2.AsyncByteStream):
    def __init__(self, gate: GatedTransport, reason: str) -> None:
        self.gate = gate
        self.reason = reason

    async def __aiter__(self) -> Any:
        raise self.gate.refuse(self.reason)
        yield b""  # an async generator: the refusal comes with the first read


class _GatedBody(httpx2.AsyncByteStream):
    """A body released whole message by whole message: the JSON body at its end, SSE events as each ends."""

    def __init__(self, gate: GatedTransport, raw: Any, bound: int, flag: str, sse: bool) -> None:
        self.gate = gate
        self.raw = raw
        self.bound = bound
        self.flag = flag
        self.sse = sse

    async def aclose(self) -> None:
        await self.raw.aclose()

    async def _checked(self, message: bytes) -> None:
        problem = await checked_message(message, self.gate.items_max)
        if problem is not None:
            raise self.gate.refuse(problem)

    async def _events_checked(self, events: bytes) -> None:
        for event in _EVENT_END.split(events):
            if len(event) > self.bound:
                raise self._too_large()
            data = b"\n".join(line[5:].removeprefix(b" ") for line in event.splitlines() if line.startswith(b"data:"))
            if data:
                await self._checked(data)

    def _too_large(self) -> AnswerRefused:
        what = "an event" if self.sse else "an answer"
        return self.gate.refuse(f"sent {what} of more than {self.bound} bytes ({self.flag})")

    async def __aiter__(self) -> Any:
        pending = bytearray()
        async for chunk in self.raw:
            pending += chunk
            if self.sse:
                ends = None
                for ends in _EVENT_END.finditer(pending):
                    pass
                if ends is not None:
                    whole = bytes(pending[:ends.end()])
                    del pending[:ends.end()]
                    await self._events_checked(whole)
                    yield whole
            if len(pending) > self.bound:
                raise self._too_large()
        if pending:
            rest = bytes(pending)
            if self.sse:
                await self._events_checked(rest)
            else:
                await self._checked(rest)
            yield rest

"""A stream's first piece written by what reads the engine, the response head with it (api/pipeline.SseSink on the
native server's ``start_body_now``): the bytes a client gets are those of the awaited path, and the request knows its
response started (an error after it is an SSE event, not a status)."""

from __future__ import annotations

import trio

from gateway.api.http import SSE_HEADERS, Request
from gateway.api.pipeline import SseSink
from gateway.net.http1 import H1Config, H1Server


def text_event(text: str, first: bool) -> bytes:
    return b"data: " + (b"first " if first else b"") + text.encode() + b"\n\n"


async def answer_and_read(nursery, first_from_elsewhere: bool, recording: bool) -> tuple[bytes, list]:
    seen: list = []

    async def app(scope, receive, send):
        request = Request(scope, receive, send, "req-7", 1000, nursery)
        if recording:
            request.recording, request.recording_bytes_left = [], 10_000
        sink = SseSink(request, text_event)
        if first_from_elsewhere:
            written = trio.Event()

            def engine_side() -> None:  # what the engine connection's reader runs, outside the request's task
                seen.append(("ready before the start", sink.ready_now()))
                seen.append(("all taken", sink.send_now("one")))
                seen.append(("started", request.response_started and sink.started and request.status == 200))
                seen.append(("ready after", sink.ready_now()))
                seen.append(("all taken", sink.send_now("two")))
                written.set()

            async def another_task() -> None:
                engine_side()

            nursery.start_soon(another_task)
            await written.wait()
        else:
            await sink("one")
            await sink("two")
        await request.end_stream(b"data: end\n\n")
        seen.append(("recorded", request.recording))

    shutdown = trio.Event()
    server = H1Server(app, H1Config())
    url = await nursery.start(server.serve, "127.0.0.1", 0, shutdown)
    stream = await trio.open_tcp_stream("127.0.0.1", int(url.rsplit(":", 1)[1]))
    await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n"
                          b"connection: close\r\n\r\n")
    received = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some():
            received += chunk
    shutdown.set()
    return received, seen


def head_and_body(raw: bytes) -> tuple[list[bytes], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")], body


async def test_the_first_piece_written_outside_the_requests_task_is_the_awaited_paths_bytes(nursery):
    awaited, _ = await answer_and_read(nursery, first_from_elsewhere=False, recording=False)
    elsewhere, seen = await answer_and_read(nursery, first_from_elsewhere=True, recording=False)
    assert head_and_body(elsewhere) == head_and_body(awaited)
    head, body = head_and_body(elsewhere)
    assert head[0] == b"HTTP/1.1 200 OK" and b"x-request-id: req-7" in head
    assert all(b"%s: %s" % header in head for header in SSE_HEADERS)
    assert b"data: first one\n\n" in body and b"data: two\n\n" in body and body.index(b"one") < body.index(b"two")
    assert dict(seen[:-1]) == {"ready before the start": True, "all taken": True, "started": True,
                               "ready after": True}


async def test_the_response_cache_records_a_first_piece_written_outside_the_task(nursery):
    _, seen = await answer_and_read(nursery, first_from_elsewhere=True, recording=True)
    assert seen[-1] == ("recorded", [b"data: first one\n\n", b"data: two\n\n", b"data: end\n\n"])


async def test_not_ready_under_another_asgi_server(nursery):
    """No native cycle (hypercorn): the first piece waits for the request's task, as every piece does."""
    async def send(message):
        pass

    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    sink = SseSink(Request(scope, None, send, "req-8", 1000, nursery), text_event)
    assert not sink.ready_now()

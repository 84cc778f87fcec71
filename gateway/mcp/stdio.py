"""A stdio MCP server (one the operator configured) as a session's transport, with the bounds of HTTP answers.

Why not the SDK's ``stdio_client``: its reader keeps a line whole however long it grows (and joins every chunk to
the pending line again, quadratic in its length), so a server that writes a line without end takes the node's
memory as an HTTP server's endless answer did. This one reads the server's stdout as bytes, cuts lines in one pass,
and holds a message to ``answer_bytes_max`` and its typed items to ``items_max`` (gateway/mcp/answers.py); past
either the session trips (the calls in flight answered with the reason) and the server is stopped. What passes is
parsed by the SDK's own JSON-RPC adapter into its ``SessionMessage``, what it cannot parse handed on as the error it
is, as the SDK's transport does.

The server runs in a process group of its own: stopping it closes its stdin, waits ``STOP_GRACE_S``, then
terminates the group, and kills it after as long again (the MCP lifecycle's shutdown order).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import anyio

from .answers import Trip, checked_message

STOP_GRACE_S = 2.0


@contextlib.asynccontextmanager
async def bounded_stdio(sdk: Any, command: str, args: "list[str]", env: "dict[str, str]", trip: Trip,
                        bytes_max: int, items_max: int) -> AsyncIterator[tuple[Any, Any]]:
    """(read stream, write stream) of a session to the server ``command args`` (see the module's docstring)."""
    process = await anyio.open_process([command, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=None, start_new_session=True)
    read_writer, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, write_reader = anyio.create_memory_object_stream[Any](0)

    async def deliver(line: bytes) -> bool:
        """The line to the session; False when the session is gone (then stdout is only drained)."""
        try:
            message: Any = sdk.SessionMessage(sdk.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as e:  # not JSON-RPC: the session surfaces it, as with the SDK's transport
            message = e
        try:
            await read_writer.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    async def read_stdout() -> None:
        pending = bytearray()
        scan = 0  # pending[:scan] holds no line end
        delivering = True
        async with read_writer:
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError,
                                     OSError):
                async for chunk in process.stdout:
                    if not delivering:
                        continue  # drained: a server blocked on a full pipe could not exit
                    pending += chunk
                    start = 0
                    while (end := pending.find(b"\n", scan)) >= 0:
                        line = bytes(pending[start:end])
                        start = scan = end + 1
                        if not line.strip():
                            continue
                        problem = None if len(line) <= bytes_max else \
                            f"sent a message of more than {bytes_max} bytes (--mcp-max-answer-bytes)"
                        problem = problem or await checked_message(line, items_max)
                        if problem is not None:
                            trip.trip(problem)
                            return
                        if not await deliver(line):
                            delivering = False
                            break
                    del pending[:start]
                    scan = len(pending)
                    if len(pending) > bytes_max:
                        trip.trip(f"sent a message of more than {bytes_max} bytes (--mcp-max-answer-bytes)")
                        return

    async def write_stdin() -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with write_reader:
                async for session_message in write_reader:
                    json = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(json.encode() + b"\n")
        await read_writer.aclose()  # the server cannot be written to: the session sees its end

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_stdout)
        tasks.start_soon(write_stdin)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
            tasks.cancel_scope.cancel()


async def _stop(process: Any) -> None:
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    for signum in (None, signal.SIGTERM, signal.SIGKILL):
        if signum is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signum)
        with anyio.move_on_after(STOP_GRACE_S):
            await process.wait()
        if process.returncode is not None:
            return

"""Writing to a trio socket without a trip through the scheduler when the kernel takes the bytes at once.

trio's ``send_all`` checkpoints around every send (a cancellation check before,
a yield to the scheduler after), so each write of the gateway's small frames
and SSE events costs a full pass of trio's run loop besides the system call:
two to seven writes per request, about 4 % of a short request's CPU (py-spy,
2026-11-22). The socket buffer on loopback and to a nearby engine is almost
never full, so the write can be tried synchronously first; only what the kernel
does not take goes through ``send_all`` (which waits for the socket to be
writable).

Callers keep their own rule for who may write: a synchronous write is safe
exactly when no other task is in the middle of an awaited write on the same
socket (callers check their send lock), since nothing can run between the
check and the system call.
"""

from __future__ import annotations

import os

import trio


def send_now(stream: trio.SocketStream, data: "bytes | bytearray | memoryview") -> int:
    """Write what the kernel takes right now; the number of bytes written (0 when its buffer is full).

    Raises OSError when the connection is broken (as ``send`` does); a closed trio socket has no
    file descriptor left, which surfaces as OSError(EBADF).
    """
    try:
        return os.write(stream.socket.fileno(), data)
    except BlockingIOError:
        return 0

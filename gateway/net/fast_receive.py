"""Reading a trio socket with the scheduling of trio's ``receive_some`` and without its layers.

``SocketStream.receive_some`` goes through a conflict detector, a generator-based
context manager that maps socket errors to stream errors, the socket wrapper's
``_nonblocking_helper`` and its ``_try_sync`` async context manager, and on an empty
socket raises and catches a BlockingIOError on the way to waiting. The gateway's
two hot read loops (a client's HTTP/1.1 connection, an engine's HTTP/2 connection)
read five to six times per request, so those layers were a few per cent of a short
request's instructions.

Same semantics where it matters: a cancellation point before anything is read
(``checkpoint_if_cancelled``), and data once read is returned even if a
cancellation arrives meanwhile (``cancel_shielded_checkpoint`` after a read that
did not wait, as trio does); the wait itself is ``wait_readable``.

Errors are not translated: OSError (a broken connection; EBADF once the trio socket
is closed, which leaves it without a file descriptor) and trio.ClosedResourceError
(closed by another task while waiting) reach the caller, which treats both as the
end of the connection. Callers are each the only reader of their socket.
"""

from __future__ import annotations

import os

import trio


async def receive_some(stream: trio.SocketStream, max_bytes: int, drained: bool = False) -> bytes:
    """Up to ``max_bytes`` of what arrived; ``b""`` once the peer closed its side.

    ``drained``: the caller's last read returned less than it asked for, so the socket was empty then.
    The read tried first would then almost always find nothing (a system call and a BlockingIOError
    raised and caught, for every token an engine streams at its own pace): it waits first instead, and
    the wait is the cancellation point. Data that did arrive meanwhile costs one pass of the scheduler
    (the wait returns at once), as the read tried first costs when it succeeds.
    """
    fd = stream.socket.fileno()
    if not drained:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            data = os.read(fd, max_bytes)
        except BlockingIOError:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()  # others run: this read did not wait
            return data
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            return os.read(fd, max_bytes)
        except BlockingIOError:  # woken without data (spurious): wait again
            pass

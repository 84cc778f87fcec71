"""A TLS connection on the kernel socket, driven by trio's readiness waits: the node's server side, and the client
side of its outside calls (``http_client.py``).

``trio.SSLStream`` runs OpenSSL on memory BIOs: every read copies the ciphertext
out of the socket into Python bytes and into the BIO, every write takes the
ciphertext back out of the BIO and through ``send_all`` (a lock, two checkpoints),
and each step is a few Python frames of its state machine. An HTTPS request
costs 1.42x (not streamed) and 1.61x (streamed) of smg's instructions through it,
against ~1.1x in the clear (BENCHMARKS.md, issue 39). Here OpenSSL reads and
writes the socket itself (``ssl.SSLSocket``, non-blocking): one C call per read
or write, and the connection keeps the clear-text path's habits: reads that wait
first when the last one emptied the socket (``fast_receive``), writes tried
synchronously from any task (``fast_send``).

OpenSSL's rules this relies on:

* A non-blocking ``SSL_write`` either takes all of its buffer or fails with
  WANT_WRITE after writing some records; the retry must pass the same bytes
  again, and may pass more after them (Python sets
  SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, OpenSSL checks only that the retry is not
  shorter). ``send_now`` reports such a write as 0 bytes taken: its caller keeps
  the whole buffer and sends it first next time, which is that retry.
* Decrypted bytes can wait inside OpenSSL (``pending()``) while the socket has
  nothing: a read that would wait first checks them before waiting.
* A reading ``SSL_read`` may need to write (a TLS 1.3 key update answered) and
  find the socket full, while a writer already waits for it to drain: trio lets
  one task wait per direction, so both go through ``_writable`` (one waits, the
  other waits for it; a client asking for key updates while reading nothing
  must not end the connection task with a BusyResourceError). Writes never
  need to read once renegotiation is off, which the server's context ensures
  (``OP_NO_RENEGOTIATION``: a client-started renegotiation is also a known way
  to make a server spend CPU).

Errors are OSError (``ssl.SSLError`` is one), as a plain socket's: the callers treat
them as the connection's end. The end of the peer's stream, with or without its
close_notify (HTTPS clients often leave without one), reads as ``b""``.
"""

from __future__ import annotations

import errno
import socket
import ssl

import trio

_wait_readable = trio.lowlevel.wait_readable
_wait_writable = trio.lowlevel.wait_writable


def _closed_error() -> OSError:
    """What a closed plain socket raises (its descriptor is gone), so callers treat both alike."""
    return OSError(errno.EBADF, "the TLS connection is closed")


class TlsSocket:
    """One accepted connection after its TLS handshake; the only reader is one task, writers keep
    their own order (the HTTP/1.1 connection's send lock)."""

    def __init__(self, ssl_socket: ssl.SSLSocket) -> None:
        self.socket = ssl_socket  # getpeername, setsockopt, getpeercert: what a socket answers
        self._closed = False
        self._drained: trio.Event | None = None  # set when the task waiting for writability is done

    async def _writable(self) -> None:
        """Wait until the socket takes bytes; a second task (reader or writer) waits for the first one's
        wait instead of registering its own, then retries its own call."""
        if self._drained is not None:
            await self._drained.wait()
            return
        drained = self._drained = trio.Event()
        try:
            await _wait_writable(self.socket)
        finally:
            self._drained = None
            drained.set()

    @classmethod
    async def accept(cls, stream: trio.SocketStream, context: ssl.SSLContext) -> "TlsSocket":
        """Take over ``stream``'s socket and run the server's handshake on it (the caller bounds it
        in time). On any failure the socket is closed and the error raised."""
        return await cls._handshake(stream, context, server_side=True)

    @classmethod
    async def connect(cls, stream: trio.SocketStream, context: ssl.SSLContext, server_hostname: str) -> "TlsSocket":
        """Take over a connected ``stream``'s socket and run the client's handshake, checking the server's
        certificate for ``server_hostname`` as ``context`` says (the caller bounds it in time). A server that asks
        to renegotiate later fails the write that meets it, as the server side's does."""
        return await cls._handshake(stream, context, server_side=False, server_hostname=server_hostname)

    @classmethod
    async def _handshake(cls, stream: trio.SocketStream, context: ssl.SSLContext, server_side: bool,
                         server_hostname: "str | None" = None) -> "TlsSocket":
        raw = socket.socket(fileno=stream.socket.detach())
        try:
            raw.setblocking(False)
            ssl_socket = context.wrap_socket(raw, server_side=server_side, do_handshake_on_connect=False,
                                             suppress_ragged_eofs=True, server_hostname=server_hostname)
        except BaseException:
            raw.close()
            raise
        tls = cls(ssl_socket)
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            while True:
                try:
                    ssl_socket.do_handshake()
                    return tls
                except ssl.SSLWantReadError:
                    await _wait_readable(ssl_socket)
                except ssl.SSLWantWriteError:
                    await _wait_writable(ssl_socket)
        except BaseException:
            tls.close_now()
            raise

    async def receive_some(self, max_bytes: int, drained: bool = False) -> bytes:
        """Up to ``max_bytes`` of clear text; ``b""`` at the end. ``drained`` as in
        ``fast_receive.receive_some``: the last read found the socket empty, so wait before reading
        (unless OpenSSL holds decrypted bytes already)."""
        if self._closed:
            raise _closed_error()
        sock = self.socket
        waited = drained and not sock.pending()
        if waited:
            await _wait_readable(sock)
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                data = sock.recv(max_bytes)
                break
            except ssl.SSLZeroReturnError:  # the peer's close_notify
                data = b""
                break
            except ssl.SSLWantReadError:  # nothing yet, or a partial record: wait for more
                await _wait_readable(sock)
            except ssl.SSLWantWriteError:  # OpenSSL must write first (a key update answered), the socket is full
                await self._writable()
            waited = True
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()  # others run: this read did not wait
        return data

    def send_now(self, data: "bytes | bytearray | memoryview") -> int:
        """Encrypt and write what the kernel takes now: ``len(data)``, or 0 when the socket is full (then
        the same bytes must start the next write: OpenSSL's retry)."""
        if self._closed:  # OpenSSL keeps the descriptor's number, which the kernel may have given to another
            raise _closed_error()
        try:
            return self.socket.send(data)
        except ssl.SSLWantWriteError:
            return 0
        except ssl.SSLWantReadError as e:  # renegotiation, which the server's context refuses
            raise trio.BrokenResourceError("TLS write needs a read: renegotiation is not supported") from e

    async def send_all(self, data: "bytes | bytearray | memoryview") -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while data:
            sent = self.send_now(data)
            if sent == len(data):
                break
            if sent:  # a partial write (SSL_MODE_ENABLE_PARTIAL_WRITE): the rest is new bytes
                data = memoryview(data)[sent:]
            await self._writable()
            waited = True
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def close_now(self) -> None:
        """Send our close_notify if the socket takes it now (no waiting for the peer's), then close."""
        if self._closed:
            return
        self._closed = True
        trio.lowlevel.notify_closing(self.socket)  # a task waiting on it wakes with ClosedResourceError
        try:
            self.socket.unwrap()
        except (ssl.SSLError, OSError, ValueError):
            pass  # the peer is gone, or its close_notify is not here yet (we do not wait for it)
        self.socket.close()

    async def aclose(self) -> None:
        self.close_now()
        await trio.lowlevel.checkpoint()

"""gateway/fast_tls.TlsSocket on real loopback sockets with a trio TLS client: the read that must write while
a writer waits for the socket to drain (a TLS 1.3 key update answered to a client that reads nothing)."""

from __future__ import annotations

import errno
import socket
import ssl

import pytest
import trio

from gateway.net.fast_tls import TlsSocket
from tests.support.certs import loopback_tls_contexts


@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    return loopback_tls_contexts(tmp_path_factory.mktemp("certs"))


async def connected_pair(server_context, client_context) -> "tuple[TlsSocket, trio.SSLStream]":
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client_sock = trio.socket.socket()
    client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills soon when it does not read
    await client_sock.connect(listener.getsockname())
    accepted, _ = await listener.accept()
    listener.close()
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client = trio.SSLStream(trio.SocketStream(client_sock), client_context, server_hostname="127.0.0.1")
    server: list[TlsSocket] = []

    async def accept():
        server.append(await TlsSocket.accept(trio.SocketStream(accepted), server_context))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        await client.do_handshake()
    return server[0], client


async def test_a_read_that_must_write_waits_for_the_waiting_writer_instead_of_failing(contexts):
    tls, client = await connected_pair(*contexts)
    real_recv = tls.socket.recv
    calls = []

    def recv_wanting_a_write_first(n):  # what SSL_read answers when its own write finds the socket full
        calls.append(n)
        if len(calls) == 1:
            raise ssl.SSLWantWriteError()
        return real_recv(n)

    tls.socket.recv = recv_wanting_a_write_first
    big = b"x" * 2_000_000
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tls.send_all, big)  # blocks: the client reads nothing yet
        await trio.testing.wait_all_tasks_blocked()
        assert tls._drained is not None  # the writer waits for the socket to drain

        async def read():
            got.append(await tls.receive_some(1024))
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert len(calls) == 1 and not got  # the reader waits for the writer's wait, without a second one
        received = 0
        while received < len(big):  # the client reads: the writer finishes, the reader retries
            received += len(await client.receive_some(65536))
        await client.send_all(b"ping")
    assert got == [b"ping"] and len(calls) >= 2
    await tls.aclose()
    await client.aclose()


async def test_the_end_of_the_stream_reads_empty_with_or_without_close_notify(contexts):
    tls, client = await connected_pair(*contexts)
    await client.send_all(b"last words")
    await client.aclose()  # with close_notify
    assert await tls.receive_some(1024) == b"last words"
    assert await tls.receive_some(1024, drained=True) == b""
    await tls.aclose()
    tls, client = await connected_pair(*contexts)
    client.transport_stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x00" * 8)
    await trio.aclose_forcefully(client.transport_stream)  # gone without close_notify (a ragged end)
    with trio.fail_after(5):
        try:
            assert await tls.receive_some(1024) == b""
        except OSError:
            pass  # or the reset itself: either ends the connection for its reader
    await tls.aclose()


async def test_a_closed_connection_refuses_reads_and_writes_as_a_closed_socket_does(contexts):
    """After close, OpenSSL would still write to the descriptor's old number, which the kernel may have given
    to another client's connection: refused with EBADF instead, as a closed plain socket does."""
    tls, client = await connected_pair(*contexts)
    await tls.aclose()
    with pytest.raises(OSError) as write_error:
        tls.send_now(b"secret for someone else")
    with pytest.raises(OSError) as read_error:
        await tls.receive_some(1024)
    assert write_error.value.errno == read_error.value.errno == errno.EBADF
    await client.aclose()

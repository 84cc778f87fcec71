"""fast_receive.receive_some against real connected sockets: trio's receive_some semantics."""

from __future__ import annotations

import socket

import pytest
import trio

from gateway.net.fast_receive import receive_some


def stream_pair() -> tuple[trio.SocketStream, socket.socket]:
    ours, theirs = socket.socketpair()
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours)), theirs


async def test_returns_what_is_there_without_waiting_for_more():
    stream, peer = stream_pair()
    peer.sendall(b"hello")
    assert await receive_some(stream, 65536) == b"hello"
    peer.sendall(b"0123456789")
    assert await receive_some(stream, 4) == b"0123"  # max_bytes is honoured
    assert await receive_some(stream, 65536) == b"456789"


async def test_waits_for_data_and_gives_empty_bytes_at_the_end(autojump_clock):
    stream, peer = stream_pair()

    async def send_later():
        await trio.sleep(0.01)
        peer.sendall(b"late")
        await trio.sleep(0.01)
        peer.shutdown(socket.SHUT_WR)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_later)
        assert await receive_some(stream, 65536) == b"late"
        assert await receive_some(stream, 65536) == b""


async def test_a_cancelled_caller_reads_nothing():
    stream, peer = stream_pair()
    peer.sendall(b"kept")
    with trio.CancelScope() as scope:
        scope.cancel()
        await receive_some(stream, 65536)
    assert scope.cancelled_caught
    assert await receive_some(stream, 65536) == b"kept"  # the cancelled call consumed nothing


async def test_a_wait_is_cancellable(autojump_clock):
    stream, _ = stream_pair()
    with trio.move_on_after(5) as scope:
        await receive_some(stream, 65536)
    assert scope.cancelled_caught


async def test_a_socket_closed_while_waiting_raises_closed_resource_error(autojump_clock):
    stream, _ = stream_pair()

    async def close_soon():
        await trio.sleep(0.01)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_soon)
        with pytest.raises(trio.ClosedResourceError):
            await receive_some(stream, 65536)


async def test_a_closed_socket_raises_os_error():
    stream, _ = stream_pair()
    await stream.aclose()
    with pytest.raises(OSError):
        await receive_some(stream, 65536)


async def test_a_reader_that_never_waits_still_lets_other_tasks_run():
    stream, peer = stream_pair()
    peer.sendall(b"x" * 1000)
    ran = 0

    async def other():
        nonlocal ran
        while True:
            ran += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()  # let it start
        started = ran
        for _ in range(100):
            assert await receive_some(stream, 10) == b"x" * 10
        assert ran - started >= 99
        nursery.cancel_scope.cancel()

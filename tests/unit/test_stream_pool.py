"""The mesh client's pool of idle push-pull connections."""

import socket

import trio

from mesh.transport import STREAM_IDLE_CLIENT_S, _StreamPool


def connected_stream() -> trio.SocketStream:
    ours, theirs = socket.socketpair()
    theirs.close()  # the peer is gone: our end would sit in CLOSE-WAIT until closed
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours))


def closed(stream: trio.SocketStream) -> bool:
    return stream.socket.fileno() == -1


async def test_connections_to_a_peer_never_asked_again_are_closed():
    pool = _StreamPool()
    dead_peer = [connected_stream(), connected_stream()]
    for stream in dead_peer:
        pool.put("10.0.0.9:7946", stream, now=0.0)
    live = connected_stream()
    pool.put("10.0.0.2:7946", live, now=STREAM_IDLE_CLIENT_S / 2)
    assert not any(map(closed, dead_peer))  # still young enough to reuse
    newer = connected_stream()
    pool.put("10.0.0.2:7946", newer, now=STREAM_IDLE_CLIENT_S + 1)  # a later exchange with another peer
    assert all(map(closed, dead_peer))
    assert pool.take("10.0.0.9:7946", now=STREAM_IDLE_CLIENT_S + 1) is None
    assert not closed(live) and not closed(newer)
    assert pool.take("10.0.0.2:7946", now=STREAM_IDLE_CLIENT_S + 1) is newer  # newest first
    assert pool.take("10.0.0.2:7946", now=STREAM_IDLE_CLIENT_S + 1) is live

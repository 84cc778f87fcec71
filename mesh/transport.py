"""Transports: best-effort packets and reliable request/response streams.

``Transport`` is the seam between the agent and the network. ``UdpTcpTransport``
is the real one (UDP datagrams for gossip, TCP for push-pull); ``SimNetwork``
(in ``mesh.simnet``) implements the same interface in memory, with seeded
faults, for the deterministic tests.

A TCP connection opens with a hello frame the agent makes and checks (a sealed,
replay-protected empty message: ``MeshAgent._make_hello``): until it passed, the
server reads no frame larger than HELLO_BYTES_MAX, so a stranger cannot make a
node buffer megabytes, and it must arrive within HELLO_TIMEOUT_S. At most
STREAM_CONNECTIONS_MAX connections are served at once; more are closed at once
(and counted), so connections alone cannot exhaust descriptors or tasks.

``connection_refused`` asks the kernel whether anything listens at a member's address: a
TCP connection refused there (a RST to our SYN) means no process holds the port, which
tells a crashed process from a slow or paused one (whose kernel still accepts) and from
a host or link that is gone (no answer at all). The probe connection closes unused;
the server side does not count it as a refused hello.

Optional mutual TLS for the streams (``MeshTls``: --mesh-tls-ca-cert,
--mesh-tls-cert, --mesh-tls-key, smg's names): both ends present a certificate of
the mesh's CA, checked in the handshake before any frame. Peers are addressed by
IP and port, so the chain is verified but not the host name (as Consul's
``verify_outgoing`` without ``verify_server_hostname``): any certificate of the
mesh CA is a member. Gossip (UDP) is unchanged: the keyring seals it.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

log = logging.getLogger("mesh.transport")

FRAME_HEADER_BYTES = 4
# Connections are kept for the next exchange with the same peer. The server forgets an idle one
# after STREAM_IDLE_SERVER_S; clients stop reusing theirs well before (STREAM_IDLE_CLIENT_S) so
# they rarely pick one the server is closing. Up to STREAMS_IDLE_PER_PEER_MAX idle per peer.
STREAM_IDLE_SERVER_S = 60.0
STREAM_IDLE_CLIENT_S = 30.0
STREAMS_IDLE_PER_PEER_MAX = 16
STREAM_EXCHANGE_S = 10.0  # a request's frames, the handler and the answer
UDP_RECEIVE_BYTES_MAX = 65536
HELLO_BYTES_MAX = 256  # a sealed empty message is 53 bytes
HELLO_TIMEOUT_S = 5.0
# Inbound stream connections served at once. A member keeps up to STREAMS_IDLE_PER_PEER_MAX idle
# connections to each peer but uses one or two: 256 serves ~100 peers with room to spare.
STREAM_CONNECTIONS_MAX = 256
STREAM_BACKLOG = 128
BIND_ATTEMPTS_MAX = 16

StreamHandler = Callable[[bytes], Awaitable[bytes]]
HelloMaker = Callable[[], bytes]
HelloCheck = Callable[[bytes, str], bool]  # (the hello, the host it came from)


def _peer_host(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, IndexError):
        return ""


class TransportError(Exception):
    """A stream exchange failed (refused, timed out, cut)."""


class StreamClosed(TransportError):
    """The peer closed the stream before its answer: after our sealed hello at once, it could not open it (its
    gossip key is not ours), or it was stopping."""


class Transport(Protocol):
    addr: str  # "host:port" other members reach us at

    def send_packet_nowait(self, addr: str, data: bytes) -> bool:
        """Best effort; False when it was not sent (the caller counts it)."""

    async def receive_packet(self) -> tuple[str, bytes]:
        """The next datagram and its sender's address."""

    def receive_packet_nowait(self) -> tuple[str, bytes] | None:
        """A datagram that has arrived and waits to be read, else None (never waits)."""

    async def exchange(self, addr: str, data: bytes, timeout_s: float, hello: HelloMaker | None = None) -> bytes:
        """Send one frame over a stream, return the peer's one-frame answer. Raises TransportError.
        A new connection first carries ``hello()``."""

    async def serve_streams(self, handler: StreamHandler, check_hello: HelloCheck | None = None, *,
                            task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Answer stream exchanges with ``handler`` until cancelled; a connection whose first frame
        fails ``check_hello`` is closed."""

    async def connection_refused(self, addr: str, timeout_s: float) -> bool:
        """True only when a stream connection to ``addr`` is refused: nothing listens there. False when it
        is accepted, or times out, or fails otherwise (none of which says the process is gone)."""


class MeshTls:
    """The two TLS contexts of a member's streams: as a server (client certificates required) and
    as a client (our certificate, the peer's checked against the CA)."""

    def __init__(self, ca_path: str, cert_path: str, key_path: str) -> None:
        self.server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        for context in (self.server, self.client):
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(cert_path, key_path)
            context.load_verify_locations(cafile=ca_path)
            context.verify_mode = ssl.CERT_REQUIRED
        self.client.check_hostname = False  # members are addressed by IP: the chain is what is checked


def _close_now(stream: "trio.SocketStream | trio.SSLStream") -> None:
    raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    raw.socket.close()


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(FRAME_HEADER_BYTES, "big") + data


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def join_addr(host: str, port: int | str) -> str:
    """host:port, an IPv6 host in brackets (what ``split_addr`` reads back)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _StreamPool:
    """Idle client connections per peer address, oldest first (taken from the newest end)."""

    def __init__(self) -> None:
        self._idle: dict[str, list[tuple[float, trio.SocketStream]]] = {}
        self._swept_at = 0.0

    def take(self, addr: str, now: float) -> trio.SocketStream | None:
        idle = self._idle.get(addr)
        while idle:
            used_at, stream = idle.pop()
            if now - used_at < STREAM_IDLE_CLIENT_S:
                return stream
            _close_now(stream)  # too old to trust: the server may be closing it
        return None

    def put(self, addr: str, stream: trio.SocketStream, now: float) -> None:
        if now - self._swept_at >= STREAM_IDLE_CLIENT_S:
            self._sweep(now)
        idle = self._idle.setdefault(addr, [])
        if len(idle) >= STREAMS_IDLE_PER_PEER_MAX:
            _close_now(stream)
            return
        idle.append((now, stream))

    def _sweep(self, now: float) -> None:
        """Close what is too old to reuse, for every peer: a peer that died or left is never asked
        again, and its connections would stay open (in CLOSE-WAIT once it is gone) for good."""
        self._swept_at = now
        for addr, idle in list(self._idle.items()):
            stale = 0  # oldest first: the stale ones lead
            while stale < len(idle) and now - idle[stale][0] >= STREAM_IDLE_CLIENT_S:
                _close_now(idle[stale][1])
                stale += 1
            del idle[:stale]
            if not idle:
                del self._idle[addr]


class UdpTcpTransport:
    """Gossip over UDP on ``bind`` and push-pull over TCP on the same port number."""

    def __init__(self, bind: str, advertise: str | None = None, frame_bytes_max: int = 8 * 1024 * 1024,
                 tls: MeshTls | None = None) -> None:
        self._tls = tls
        host, port = split_addr(bind)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # UDP and TCP share the port number. With port 0 the kernel picks a free UDP port whose TCP
        # twin may be taken (by any outgoing connection's ephemeral port): try again with another.
        for attempt in range(BIND_ATTEMPTS_MAX if port == 0 else 1):
            self._udp = socket.socket(family, socket.SOCK_DGRAM)
            self._udp.setblocking(False)
            self._udp.bind((host, port))
            bound_port = self._udp.getsockname()[1]
            self._tcp = socket.socket(family, socket.SOCK_STREAM)
            self._tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                self._tcp.bind((host, bound_port))
                break
            except OSError as e:
                self._tcp.close()
                self._udp.close()
                if e.errno != errno.EADDRINUSE or port != 0 or attempt == BIND_ATTEMPTS_MAX - 1:
                    raise
        self._family = family
        self.addr = advertise or join_addr(host, bound_port)
        self.frame_bytes_max = frame_bytes_max
        self._pool = _StreamPool()
        self.connections = 0
        self.connections_refused = 0  # over STREAM_CONNECTIONS_MAX
        self.hellos_refused = 0  # first frame too large, late, or not a valid hello
        self.connections_unused = 0  # closed by the peer before a byte: a member's connection_refused check

    def send_packet_nowait(self, addr: str, data: bytes) -> bool:
        try:
            self._udp.sendto(data, split_addr(addr))
            return True
        except (BlockingIOError, InterruptedError):
            return False  # the kernel buffer is full: gossip is best effort
        except OSError as e:
            if e.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EINVAL):
                return False
            raise

    async def receive_packet(self) -> tuple[str, bytes]:
        while True:
            await trio.lowlevel.wait_readable(self._udp)
            packet = self.receive_packet_nowait()
            if packet is not None:
                return packet

    def receive_packet_nowait(self) -> tuple[str, bytes] | None:
        while True:
            try:
                data, addr = self._udp.recvfrom(UDP_RECEIVE_BYTES_MAX)
            except (BlockingIOError, InterruptedError):
                return None
            except ConnectionRefusedError:  # an ICMP error of an earlier send: nothing to read in it
                continue
            host, port = addr[0], addr[1]
            return join_addr(host, port), data

    async def exchange(self, addr: str, data: bytes, timeout_s: float, hello: HelloMaker | None = None) -> bytes:
        """One request frame, one answer frame, over a kept-alive connection when one is idle.

        A pooled connection the peer has closed meanwhile fails at once (EOF); the exchange
        then runs once more on a fresh connection. A connection that saw any error or a
        timeout is closed, never reused: its framing can no longer be trusted."""
        host, port = split_addr(addr)
        frame = _frame(data)
        try:
            with trio.fail_after(timeout_s):
                stream = self._pool.take(addr, trio.current_time())
                if stream is not None:
                    try:
                        answer = await self._round_trip(stream, frame)
                    except (TransportError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                        stream = None  # closed by the peer while idle: use a fresh one
                    if stream is not None:
                        self._pool.put(addr, stream, trio.current_time())
                        return answer
                stream = await trio.open_tcp_stream(host, port)
                if self._tls is not None:
                    stream = trio.SSLStream(stream, self._tls.client, server_hostname=None)
                    await stream.do_handshake()
                opening = hello() if hello is not None else b""
                answer = await self._round_trip(stream, _frame(opening) + frame)
                self._pool.put(addr, stream, trio.current_time())
                return answer
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            detail = str(e) or str(e.__cause__ or "")  # trio wraps a failed handshake's SSLError
            if isinstance(e, ConnectionResetError) or isinstance(e.__cause__, ConnectionResetError):
                # Reset with our frames unread: what a peer that refused our hello does as it closes.
                raise StreamClosed(f"stream to {addr} reset by the peer: {detail}") from None
            raise TransportError(f"stream to {addr} failed: {type(e).__name__}: {detail}") from None

    async def connection_refused(self, addr: str, timeout_s: float) -> bool:
        try:
            host, port = split_addr(addr)
        except ValueError:
            return False  # an address we cannot read says nothing about a process
        if not 0 < port < 65536:
            return False
        with trio.move_on_after(timeout_s):
            try:
                infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                family, kind, proto, _, sockaddr = infos[0]
                with trio.socket.socket(family, kind, proto) as sock:
                    await sock.connect(sockaddr)
                return False
            except ConnectionRefusedError:
                return True
            except OSError:
                return False  # unreachable, reset, no address: nothing that says the process is gone
        return False

    async def _round_trip(self, stream: trio.SocketStream, frame: bytes) -> bytes:
        try:
            await stream.send_all(frame)
            return await self._read_frame(stream)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    async def _read_frame(self, stream: trio.SocketStream) -> bytes:
        header = await self._read_exactly(stream, FRAME_HEADER_BYTES)
        size = int.from_bytes(header, "big")
        if size > self.frame_bytes_max:
            raise TransportError(f"frame of {size} bytes is over the limit")
        return await self._read_exactly(stream, size)

    @staticmethod
    async def _read_exactly(stream: trio.SocketStream, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = await stream.receive_some(min(65536, n - len(buf)))
            if not chunk:
                raise StreamClosed("stream closed early")
            buf += chunk
        return bytes(buf)

    async def _tls_handshake(self, stream: trio.SocketStream, hello_deadline: float) -> trio.SSLStream | None:
        """The server side of mutual TLS, within the hello's time; None when it failed."""
        tls = trio.SSLStream(stream, self._tls.server, server_side=True)
        with trio.move_on_at(hello_deadline):
            try:
                await tls.do_handshake()
                return tls
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return None
        return None

    @staticmethod
    async def _closed_unused(stream: trio.SocketStream, hello_deadline: float) -> bool:
        """The peer closed the connection before sending a byte: a member checking that we listen
        (``connection_refused``), not a hello that failed. Waits for the first byte without taking it
        (the TLS handshake or the hello reads it next), within the hello's time: a silent connection
        is then a hello that did not come."""
        with trio.move_on_at(hello_deadline):
            try:
                return await stream.socket.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True  # reset before a byte: nothing was tried either
        return False

    async def _passes_hello(self, stream: Any, check_hello: HelloCheck | None, hello_deadline: float,
                            host: str) -> bool:
        try:
            with trio.fail_at(hello_deadline):
                size = int.from_bytes(await self._read_exactly(stream, FRAME_HEADER_BYTES), "big")
                if size > HELLO_BYTES_MAX:
                    return False
                hello = await self._read_exactly(stream, size)
        except (TransportError, trio.TooSlowError, trio.BrokenResourceError, OSError):
            return False
        return check_hello is None or check_hello(hello, host)

    async def serve_streams(self, handler: StreamHandler, check_hello: HelloCheck | None = None, *,
                            task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._tcp.listen(STREAM_BACKLOG)
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(self._tcp))]

        async def serve_one(stream: trio.SocketStream) -> None:
            if self.connections >= STREAM_CONNECTIONS_MAX:
                self.connections_refused += 1
                log.debug("refused a stream connection: %d open already", self.connections)
                await trio.aclose_forcefully(stream)
                return
            self.connections += 1
            host = _peer_host(stream)
            hello_deadline = trio.current_time() + HELLO_TIMEOUT_S  # TLS and the hello, together
            try:
                if await self._closed_unused(stream, hello_deadline):
                    self.connections_unused += 1
                    return
                if self._tls is not None:
                    secured = await self._tls_handshake(stream, hello_deadline)
                    if secured is None:
                        self.hellos_refused += 1
                        return
                    stream = secured
                if not await self._passes_hello(stream, check_hello, hello_deadline, host):
                    self.hellos_refused += 1
                    return
                while True:  # a peer keeps its connection for its next exchanges
                    with trio.move_on_after(STREAM_IDLE_SERVER_S):
                        header = await stream.receive_some(FRAME_HEADER_BYTES)
                    if not header:
                        return  # closed by the peer, or idle too long
                    with trio.fail_after(STREAM_EXCHANGE_S):
                        if len(header) < FRAME_HEADER_BYTES:
                            header += await self._read_exactly(stream, FRAME_HEADER_BYTES - len(header))
                        size = int.from_bytes(header, "big")
                        if size > self.frame_bytes_max:
                            return
                        request = await self._read_exactly(stream, size)
                        answer = await handler(request)
                        await stream.send_all(len(answer).to_bytes(FRAME_HEADER_BYTES, "big") + answer)
            except (TransportError, trio.TooSlowError, trio.BrokenResourceError, OSError):
                pass  # a peer that breaks the exchange gets nothing; it will retry later
            finally:
                self.connections -= 1
                await trio.aclose_forcefully(stream)

        task_status.started()
        await trio.serve_listeners(serve_one, listeners)

    def close(self) -> None:
        self._udp.close()
        self._tcp.close()

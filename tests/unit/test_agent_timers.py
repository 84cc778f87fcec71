"""The agent's timers judge only after reading the packets that have arrived (mesh/agent.py, _read_arrived)."""

from __future__ import annotations

import random
import time

import trio

from mesh.agent import UDP_LABEL, MeshAgent
from mesh.config import MeshConfig
from mesh.crypto import Keyring, Sealer
from mesh.members import MemberStatus
from mesh.swim import PacketIn
from mesh.transport import TransportError, UdpTcpTransport
from mesh.wire import Alive, encode_message, encode_packet

KEY_A = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="  # a fixed test key, never used outside tests
X_ADDR = "10.0.0.2:7946"


class HeldUpTransport:
    """Packets wait in the kernel's buffer (``receive_packet_nowait``) while the agent's receiving task has not
    run (``receive_packet`` never returns): a busy process's loop, held still. Nothing sent arrives."""

    addr = "10.0.0.1:7946"

    def __init__(self) -> None:
        self.waiting: list[tuple[str, bytes]] = []

    def send_packet_nowait(self, addr: str, data: bytes) -> bool:
        return True

    async def receive_packet(self) -> tuple[str, bytes]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    def receive_packet_nowait(self) -> tuple[str, bytes] | None:
        return self.waiting.pop(0) if self.waiting else None

    async def exchange(self, addr: str, data: bytes, timeout_s: float, hello=None) -> bytes:
        raise TransportError("no streams here")

    async def serve_streams(self, handler, check_hello=None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()


async def test_a_refutation_that_arrived_while_the_loop_was_held_up_is_read_before_the_suspicion_expires(
        autojump_clock):
    """Our probes of x go unanswered, so we suspect it; x's refutation arrives, but our loop is held up and the
    suspicion's deadline comes due with it. Read first, the refutation keeps x alive; judged first, the timer
    declared a healthy member dead (one such verdict in a 10-minute lossy-network chaos run)."""
    transport = HeldUpTransport()
    agent = MeshAgent(MeshConfig.lan(), "me", transport, Keyring([KEY_A]), rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run)
        agent._handle(PacketIn(X_ADDR, [Alive(1, "x", X_ADDR, ())]))
        with trio.fail_after(30):  # our first probe of x fails within a few probe periods
            while "x" not in agent.swim._suspicions:
                await trio.sleep(0.1)
        deadline = agent.swim._suspicions["x"].deadline
        refutation = encode_packet([encode_message(Alive(2, "x", X_ADDR, ()))])
        transport.waiting.append((X_ADDR, Sealer(Keyring([KEY_A])).seal(refutation, UDP_LABEL, time.time())))
        await trio.sleep_until(deadline + 1.0)
        x = agent.member("x")  # (suspected again since: our probes still go nowhere, but not dead)
        assert x.status is not MemberStatus.DEAD and x.incarnation == 2, x
        assert not transport.waiting
        nursery.cancel_scope.cancel()


async def test_the_udp_transport_reads_what_waits_without_waiting():
    """Real loopback sockets: ``receive_packet_nowait`` returns each datagram the kernel holds, in order, then
    None at once; what it took, ``receive_packet`` does not see again."""
    a, b = UdpTcpTransport("127.0.0.1:0"), UdpTcpTransport("127.0.0.1:0")
    try:
        assert b.receive_packet_nowait() is None
        for data in (b"one", b"two"):
            assert a.send_packet_nowait(b.addr, data)
        with trio.fail_after(5):
            await trio.lowlevel.wait_readable(b._udp)
        assert b.receive_packet_nowait() == (a.addr, b"one")
        with trio.fail_after(5):
            while (packet := b.receive_packet_nowait()) is None:
                await trio.sleep(0.01)
        assert packet == (a.addr, b"two") and b.receive_packet_nowait() is None
        a.send_packet_nowait(b.addr, b"three")
        with trio.fail_after(5):
            assert await b.receive_packet() == (a.addr, b"three")
    finally:
        a.close()
        b.close()


async def test_traffic_of_another_version_is_dropped_and_said_once_a_minute_per_host(autojump_clock, caplog):
    """A rolling upgrade half done: a member of another version seals in another format, or speaks another mesh
    protocol inside a packet that opens. Dropped and counted, and said in one line per host a minute (issue 62)."""
    import msgpack

    from mesh.crypto import SEAL_VERSION
    agent = MeshAgent(MeshConfig.lan(), "me", HeldUpTransport(), Keyring([KEY_A]), rng=random.Random(1))
    sealer = Sealer(Keyring([KEY_A]))
    def newer_protocol() -> bytes:  # sealed anew each time: a packet played twice is a replay, dropped as such
        return sealer.seal(msgpack.packb([99, []]), UDP_LABEL, time.time())

    newer_seal = bytes([SEAL_VERSION + 1]) + sealer.seal(b"x", UDP_LABEL, time.time())[1:]
    for _ in range(3):
        agent._on_packet(X_ADDR, newer_protocol())
        agent._on_packet("10.0.0.3:7946", newer_seal)
    assert agent.stats.dropped["bad_version"] == 3 and agent.stats.dropped["seal_version"] == 3
    lines = [r.getMessage() for r in caplog.records if "another smg-node version" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "another mesh protocol version from 10.0.0.2" in lines[0]
    assert f"sealed in format {SEAL_VERSION + 1} from 10.0.0.3" in lines[1]
    await trio.sleep(61)
    agent._on_packet(X_ADDR, newer_protocol())
    assert len([r for r in caplog.records if "another smg-node version" in r.getMessage()]) == 3

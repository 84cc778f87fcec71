"""A simulated network for deterministic tests: the Transport interface, in memory, with faults.

Every random choice (drop, duplicate, delay) comes from one seeded PRNG, and
delays are trio sleeps, so under ``MockClock(autojump_threshold=0)`` a run is
a pure function of its seed: a failure prints the seed, and the seed replays it.

Faults: packet loss, duplication, delay with jitter (which also reorders),
partitions (cut links between groups), a crashed node (everything to and from
it is lost: the host is gone), a stopped node (its process is gone and its host
refuses connections to the port, as a SIGKILLed process's does), and a slow node
(what it receives is handled late: a node starved of CPU, as in the Lifeguard
paper's experiments).
"""

from __future__ import annotations

import dataclasses
import random

import trio

from .transport import HelloCheck, HelloMaker, StreamHandler, TransportError

PACKETS_QUEUED_MAX = 10_000


@dataclasses.dataclass
class LinkFaults:
    drop: float = 0.0
    duplicate: float = 0.0
    delay_s: float = 0.001
    jitter_s: float = 0.0


class SimNetwork:
    def __init__(self, seed: int, faults: LinkFaults | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.faults = faults or LinkFaults()
        self._nodes: dict[str, "SimTransport"] = {}
        self._cut: set[frozenset[str]] = set()
        self.crashed: set[str] = set()  # hosts gone: nothing answers
        self.stopped: set[str] = set()  # processes gone, hosts up: packets lost, connections refused
        self.slow_s: dict[str, float] = {}  # addr -> extra handling delay
        self.nursery: trio.Nursery | None = None
        self.packets_sent = 0
        self.packets_dropped = 0

    def transport(self, addr: str) -> "SimTransport":
        t = SimTransport(self, addr)
        self._nodes[addr] = t
        return t

    # -- faults -----------------------------------------------------------

    def partition(self, *groups: "list[str]") -> None:
        """Cut every link between members of different groups."""
        for i, a_group in enumerate(groups):
            for b_group in groups[i + 1:]:
                for a in a_group:
                    for b in b_group:
                        self._cut.add(frozenset((a, b)))

    def heal(self) -> None:
        self._cut.clear()

    def linked(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self._cut and a not in self.crashed and b not in self.crashed \
            and a not in self.stopped and b not in self.stopped

    # -- delivery ---------------------------------------------------------

    def _delay(self, src: str, dst: str) -> float:
        f = self.faults
        return f.delay_s + (self.rng.random() * f.jitter_s if f.jitter_s else 0.0) + self.slow_s.get(dst, 0.0)

    def send(self, src: str, dst: str, data: bytes) -> None:
        self.packets_sent += 1
        target = self._nodes.get(dst)
        if target is None or not self.linked(src, dst) or self.rng.random() < self.faults.drop:
            self.packets_dropped += 1
            return
        copies = 2 if self.rng.random() < self.faults.duplicate else 1
        for _ in range(copies):
            self.nursery.start_soon(self._deliver, target, src, dst, data, self._delay(src, dst))

    async def _deliver(self, target: "SimTransport", src: str, dst: str, data: bytes, delay_s: float) -> None:
        await trio.sleep(delay_s)
        if self.linked(src, dst):  # a partition or crash may have happened in flight
            try:
                target.inbox_send.send_nowait((src, data))
            except trio.WouldBlock:
                self.packets_dropped += 1

    async def exchange(self, src: str, dst: str, data: bytes, timeout_s: float) -> bytes:
        target = self._nodes.get(dst)
        with trio.move_on_after(timeout_s) as scope:
            await trio.sleep(self._delay(src, dst))
            if target is None or target.handler is None or not self.linked(src, dst):
                await trio.sleep(timeout_s)  # like a SYN into a black hole
            else:
                answer = await target.handler(data)
                await trio.sleep(self._delay(dst, src))
                if self.linked(src, dst):
                    return answer
                await trio.sleep(timeout_s)
        if scope.cancelled_caught:
            raise TransportError(f"stream {src} -> {dst} timed out")
        raise TransportError(f"stream {src} -> {dst} failed")

    async def connection_refused(self, src: str, dst: str, timeout_s: float) -> bool:
        """Refused after a round trip when ``dst``'s process is stopped and its host reachable (the RST has to
        come back); accepted after one when it runs (a slow process's kernel accepts at once); otherwise no
        answer. No random draw: checking does not shift a seeded run's other choices."""
        round_trip_s = 2 * self.faults.delay_s
        host_up = dst in self._nodes and dst not in self.crashed and src not in self.crashed \
            and src not in self.stopped and frozenset((src, dst)) not in self._cut
        if host_up:
            await trio.sleep(min(round_trip_s, timeout_s))
            return dst in self.stopped and round_trip_s <= timeout_s
        await trio.sleep(timeout_s)
        return False


class SimTransport:
    def __init__(self, network: SimNetwork, addr: str) -> None:
        self.network = network
        self.addr = addr
        self.inbox_send, self.inbox = trio.open_memory_channel(PACKETS_QUEUED_MAX)
        self.handler: StreamHandler | None = None

    def send_packet_nowait(self, addr: str, data: bytes) -> bool:
        self.network.send(self.addr, addr, data)
        return True

    async def receive_packet(self) -> tuple[str, bytes]:
        return await self.inbox.receive()

    def receive_packet_nowait(self) -> tuple[str, bytes] | None:
        try:
            return self.inbox.receive_nowait()
        except trio.WouldBlock:
            return None

    async def exchange(self, addr: str, data: bytes, timeout_s: float, hello: HelloMaker | None = None) -> bytes:
        # A simulated stream is one exchange on a connection of its own, and no stranger can reach
        # it: the hello that guards real connections (mesh.transport) has nothing to guard here.
        return await self.network.exchange(self.addr, addr, data, timeout_s)

    async def connection_refused(self, addr: str, timeout_s: float) -> bool:
        return await self.network.connection_refused(self.addr, addr, timeout_s)

    async def serve_streams(self, handler: StreamHandler, check_hello: HelloCheck | None = None, *,
                            task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.handler = handler
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            self.handler = None

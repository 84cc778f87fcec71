"""Network faults for the chaos harness, injected at the seam all mesh traffic crosses: the Transport.

Inert unless ``SMG_NODE_CHAOS_FAULTS`` names a rules file (the harness writes
it; the node logs a warning when it is set). Why here and not in the kernel:
network namespaces and iptables need privileges and leave state behind when a
run dies, and the machines that run CI may not grant them; every byte one node
sends another (UDP gossip, TCP push-pull, rate-limit and KV-index requests)
passes through ``Transport``, so faults at this seam hit exactly the traffic
between nodes and nothing else (clients and engines are unaffected, as with a
partition of the cluster's own network). They are seeded, so a run replays.

Rules file (JSON, re-read when it changes)::

    {"default": {"drop": 0.1, "delay_ms": 0},
     "peers": {"127.0.0.1:7947": {"drop": 1.0}}}

``drop`` applies to packets this node sends to a peer and to packets it
receives from one; for a stream exchange (TCP) a drop of 1 is a connection
that never answers (it times out), and a smaller one is a retransmission that
costs 200 ms, as TCP would. ``delay_ms`` delays every send. A partition is
drop 1 written into both sides' files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import zlib
from pathlib import Path

import trio

from .transport import HelloCheck, HelloMaker, StreamHandler, Transport, TransportError

log = logging.getLogger("mesh.faults")

FAULTS_ENV = "SMG_NODE_CHAOS_FAULTS"
SEED_ENV = "SMG_NODE_CHAOS_SEED"
RELOAD_INTERVAL_S = 0.1
TCP_RETRANSMIT_S = 0.2


@dataclasses.dataclass(frozen=True)
class LinkRule:
    drop: float = 0.0
    delay_s: float = 0.0


def parse_rules(text: str) -> tuple[LinkRule, dict[str, LinkRule]]:
    raw = json.loads(text) if text.strip() else {}

    def rule(value: dict) -> LinkRule:
        return LinkRule(min(1.0, max(0.0, float(value.get("drop", 0.0)))),
                        max(0.0, float(value.get("delay_ms", 0.0))) / 1000.0)

    return rule(raw.get("default", {})), {peer: rule(r) for peer, r in raw.get("peers", {}).items()}


class FaultyTransport:
    """A Transport that loses and delays traffic as its rules file says."""

    def __init__(self, inner: Transport, rules_path: Path, seed: int) -> None:
        self.inner = inner
        self.addr = inner.addr
        self.rules_path = rules_path
        self.rng = random.Random(seed)
        self._default = LinkRule()
        self._peers: dict[str, LinkRule] = {}
        self._mtime_ns = -1
        self._checked_at = -1.0
        self.dropped = 0

    def _rule(self, peer: str) -> LinkRule:
        now = trio.current_time()
        if now - self._checked_at >= RELOAD_INTERVAL_S:
            self._checked_at = now
            try:
                mtime = self.rules_path.stat().st_mtime_ns
                if mtime != self._mtime_ns:
                    self._mtime_ns = mtime
                    self._default, self._peers = parse_rules(self.rules_path.read_text())
            except (OSError, ValueError, TypeError, AttributeError) as e:
                log.warning("chaos rules %s unreadable (%s): keeping the previous ones", self.rules_path, e)
        return self._peers.get(peer, self._default)

    def _lost(self, rule: LinkRule) -> bool:
        lost = rule.drop > 0 and self.rng.random() < rule.drop
        if lost:
            self.dropped += 1
        return lost

    def send_packet_nowait(self, addr: str, data: bytes) -> bool:
        rule = self._rule(addr)
        if self._lost(rule):
            return True  # sent, as far as the sender can tell
        if rule.delay_s > 0:
            trio.lowlevel.spawn_system_task(self._send_later, addr, data, rule.delay_s)
            return True
        return self.inner.send_packet_nowait(addr, data)

    async def _send_later(self, addr: str, data: bytes, delay_s: float) -> None:
        await trio.sleep(delay_s)
        try:
            self.inner.send_packet_nowait(addr, data)
        except OSError:
            pass

    async def receive_packet(self) -> tuple[str, bytes]:
        while True:
            addr, data = await self.inner.receive_packet()
            if not self._lost(self._rule(addr)):
                return addr, data

    def receive_packet_nowait(self) -> tuple[str, bytes] | None:
        while True:
            packet = self.inner.receive_packet_nowait()
            if packet is None or not self._lost(self._rule(packet[0])):
                return packet

    async def exchange(self, addr: str, data: bytes, timeout_s: float, hello: HelloMaker | None = None) -> bytes:
        rule = self._rule(addr)
        if rule.drop >= 1.0:
            await trio.sleep(timeout_s)
            raise TransportError(f"stream to {addr} timed out (chaos: link cut)")
        if self._lost(rule):
            await trio.sleep(min(TCP_RETRANSMIT_S, timeout_s))
        if rule.delay_s > 0:
            await trio.sleep(rule.delay_s)
        return await self.inner.exchange(addr, data, timeout_s, hello)

    async def connection_refused(self, addr: str, timeout_s: float) -> bool:
        rule = self._rule(addr)
        if rule.drop >= 1.0:  # a cut link answers nothing, as a partition's SYNs would get
            await trio.sleep(timeout_s)
            return False
        if rule.delay_s > 0:
            await trio.sleep(min(rule.delay_s, timeout_s))
        return await self.inner.connection_refused(addr, timeout_s)

    async def serve_streams(self, handler: StreamHandler, check_hello: HelloCheck | None = None, *,
                            task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.inner.serve_streams(handler, check_hello, task_status=task_status)

    def close(self) -> None:
        self.inner.close()


def maybe_faulty(transport: Transport, name: str) -> Transport:
    """Wrap ``transport`` when the chaos harness asked for it (``SMG_NODE_CHAOS_FAULTS``)."""
    path = os.environ.get(FAULTS_ENV)
    if not path:
        return transport
    log.warning("CHAOS: mesh traffic passes through fault rules from %s (never set this in production)", path)
    seed = int(os.environ.get(SEED_ENV, "0")) * 1_000_003 + zlib.crc32(name.encode())
    return FaultyTransport(transport, Path(path), seed)

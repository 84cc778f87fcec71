"""Every tunable of the membership protocol, in one frozen object, with presets.

Defaults and formulas (after memberlist's DefaultLANConfig, which Serf and
Consul run on LANs; n is the number of members):

* probe_interval_s / probe_timeout_s: one member is probed per interval; a
  direct ping that gets no ack within the timeout triggers indirect probes.
  Both are multiplied by (awareness + 1) under Lifeguard (see below).
* indirect_checks: members asked to probe on our behalf (k in SWIM).
* suspicion timeout (Lifeguard): starts at
      max = suspicion_max_timeout_mult * min,
      min = suspicion_mult * max(1, log10(n)) * probe_interval_s
  and shrinks toward min as k = suspicion_confirmations (memberlist: suspicion_mult - 2)
  independent confirmations arrive:
      timeout(c) = max(min, max - (max - min) * log(c + 1) / log(k + 1)).
  k is at most n - 2 (the members besides the accuser and the suspect): in a 3-member
  cluster one confirmation brings min (2 members have nobody to confirm: max).
  Longer suspicion means fewer false positives; shorter, faster detection. A member
  that hears of a suspicion probes the suspect at once (its confirmation, or the ack
  that withholds one, comes within a probe period).
* no_listener_suspicion_s: when a direct probe gets no ack, the prober also asks the
  kernel whether anything listens at the member's address (a TCP connection, closed
  unused). Refused means no process holds the port: the member's process crashed or
  exited, its host is up. A slow or paused process's kernel still accepts, and a
  host or link that is gone answers nothing, so neither is affected. A suspicion
  backed by our own refusal of the same incarnation ends after this long (from the
  refusal), whatever the confirmations or slowness memories: time for an Alive
  already in flight to arrive. None: never check (memberlist's behaviour). A refusal is
  our own observation, never gossiped, and forging one needs the sequence number of
  our SYN (off-path attackers cannot); one on-path can drop the packets anyway.
* refuted_memory_s: a member that refuted a suspicion this recently has shown it is
  alive but slow (a crashed member never refutes); its next suspicions run the
  longest timeout whatever the confirmations, so it has time to refute again (held
  until the memory lapses, then the usual timeout). Lifeguard's awareness protects
  against a slow accuser; this, against a slow accused. The same memory of our own
  refutations while our awareness is above 0: a member suspected lately and still
  failing probes is likely slow itself, so its own suspicions of others run the
  longest timeout too.
* retransmit_mult: each membership change is piggybacked
      retransmit_mult * ceil(log10(n + 1))  times,
  enough to reach every member with high probability (epidemic spread).
* gossip_interval_s / gossip_nodes: besides probes, every interval the queue is
  sent to this many random members: faster spread for more bytes.
* push_pull_interval_s: full state exchange over TCP with one random member,
  which repairs anything gossip lost (scaled up beyond 32 members).
* gossip_to_the_dead_s: dead members still receive gossip this long, so they
  learn they were declared dead and can refute.
* reconnect_interval_s: every interval, push-pull with one random member we
  hold as dead (not left), as Serf does: after a partition heals, the two
  sides would otherwise never talk again, each holding the other dead.
* left_reap_s: members that left are forgotten after this long (memberlist's dead-node reclaim; they
  said goodbye, nothing is owed them).
* dead_reap_s: failed members are forgotten after this long: 24 hours, Serf's reconnect_timeout. A
  failed member may be cut off rather than crashed, still serving clients on its side, and the gateway
  counts it as known until then: rate limits share their allowance with it, a node alone on its side
  refuses history writes, a record it may hold is "unavailable" rather than "not found". Forgetting it
  sooner makes each side of a longer partition act as the whole cluster (a 90 s partition with a 60 s
  reap granted a rate limit on both sides and answered "not found" for records held across it: chaos
  reports ``partition-halves-300s``). A member gone for good is removed at once with ``smg-node
  force-leave`` (Kubernetes discovery does it when the member's pod is deleted). Whatever the reap, a
  partition heals through the seeds: a node joins its ``--join`` seeds again every reconnect interval
  while it does not see one of them alive (service.py ``keep_seeds_joined``).
* awareness_max: Lifeguard's local health multiplier goes from 0 to
  awareness_max - 1; a node that sees signs of its own slowness (probes it
  could not complete, missing nacks, having to refute) waits longer before
  judging others: its probe period and timeout are multiplied by awareness + 1.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 0.5
    indirect_checks: int = 3
    suspicion_mult: float = 4
    suspicion_max_timeout_mult: int = 6
    # Lifeguard's k: independent confirmations that bring a suspicion's timeout down to its minimum
    # (memberlist derives it as suspicion_mult - 2 = 2).
    suspicion_confirmations: int = 2
    # A member that refuted a suspicion this recently has shown it is alive but slow: its next
    # suspicions run the longest timeout (at most until this memory lapses), confirmed or not (a crashed
    # member never refutes). A slow member refutes every few seconds, so 20 s covers it (12 s let 3 false
    # verdicts through in the slow-member simulation, 20 and 60 s one); 60 s held a crash right after a
    # lossy half-minute, when most members had refuted, for the longest timeout (28.5 s p50 after 30 %
    # loss, 13.2 s with 20; mesh_bench.py and BENCHMARKS.md).
    refuted_memory_s: float = 20.0
    # A crashed process's address refuses connections: its suspicion ends this long after our refusal, not
    # after the 4 s minimum a slow member needs to refute (a crash detected in ~2 s rather than ~6).
    no_listener_suspicion_s: float | None = 0.5
    retransmit_mult: int = 4
    gossip_interval_s: float = 0.2
    gossip_nodes: int = 3
    push_pull_interval_s: float = 30.0
    gossip_to_the_dead_s: float = 30.0
    reconnect_interval_s: float = 30.0
    left_reap_s: float = 300.0
    dead_reap_s: float = 86_400.0
    awareness_max: int = 8
    # Lifeguard as a whole (awareness, nacks, dynamic suspicion); off = plain SWIM
    # (fixed suspicion timeout = the minimum, no slowness awareness), for comparison.
    lifeguard: bool = True
    # Compound packets stay under a typical MTU (1,500) minus IP/UDP and seal overhead.
    udp_packet_bytes_max: int = 1400
    # A push-pull state larger than this is refused (10,000 members x ~600 bytes).
    tcp_state_bytes_max: int = 8 * 1024 * 1024
    members_max: int = 10_000

    @classmethod
    def lan(cls, **overrides) -> "MeshConfig":
        """memberlist's LAN defaults: a crash is detected and spread in ~5-6 s typical."""
        return cls(**overrides)

    @classmethod
    def local(cls, **overrides) -> "MeshConfig":
        """One machine (loopback): 5x faster timers, for tests and demos."""
        values = dict(probe_interval_s=0.2, probe_timeout_s=0.1, gossip_interval_s=0.05,
                      push_pull_interval_s=10.0, gossip_to_the_dead_s=6.0, reconnect_interval_s=6.0, left_reap_s=60.0,
                      no_listener_suspicion_s=0.1)
        values.update(overrides)
        return cls(**values)

    def retransmit_limit(self, n: int) -> int:
        return self.retransmit_mult * max(1, math.ceil(math.log10(n + 1)))

    def suspicion_min_s(self, n: int) -> float:
        return self.suspicion_mult * max(1.0, math.log10(max(1, n))) * self.probe_interval_s

    def suspicion_max_s(self, n: int) -> float:
        return self.suspicion_max_timeout_mult * self.suspicion_min_s(n)

    def suspicion_timeout_s(self, n: int, confirmations: int) -> float:
        lo = self.suspicion_min_s(n)
        if not self.lifeguard:
            return lo
        k = self.confirmations_expected(n)
        hi = self.suspicion_max_s(n)
        frac = math.log(confirmations + 1) / math.log(k + 1)
        return max(lo, hi - (hi - lo) * frac)

    def confirmations_expected(self, n: int) -> int:
        """Lifeguard's k among n members: at most the n - 2 members besides the accuser and the suspect, so that
        every confirmation there can be brings the timeout to its minimum. With k = 2 regardless, a 3-member
        cluster (one confirmation at most) waited ~60 % of the longest timeout for every crash: 13 s on the LAN
        preset instead of 5.8. memberlist sets k = 0 when n - 2 < k (the minimum from the start), which lets a
        slow member of 3 (packets handled 4 s late) declare a healthy one dead from its late view; here an
        unconfirmed suspicion runs the longest timeout in any cluster. Two members have nobody to confirm
        and nothing to tell a slow peer from a dead one by: the longest timeout (k = 1, never reached)."""
        return max(1, min(self.suspicion_confirmations, n - 2))

    def push_pull_interval_for(self, n: int) -> float:
        # memberlist's pushPullScale: past 32 members, stretch the interval so the
        # cluster-wide TCP load stays roughly constant.
        if n <= 32:
            return self.push_pull_interval_s
        return self.push_pull_interval_s * math.ceil(math.log2(n) - math.log2(32) + 1)

"""The member state machine, one test per rule (see mesh/members.py), time passed in."""

import random

from mesh.config import MeshConfig
from mesh.members import MemberStatus, MemberTable
from mesh.swim import MemberChanged, PacketIn, SendPacket, Swim, Tick
from mesh.wire import Ack, Alive, Dead, Ping, Suspect, decode_packet, encode_packet

A, S, D, L = MemberStatus.ALIVE, MemberStatus.SUSPECT, MemberStatus.DEAD, MemberStatus.LEFT


def table_with(status=A, inc=5) -> MemberTable:
    t = MemberTable("me", 100)
    t.apply_alive(Alive(inc, "x", "10.0.0.2:1", ()), 0)
    if status is S:
        t.apply_suspect(Suspect(inc, "x", "y"), 0)
    elif status in (D, L):
        t.apply_dead(Dead(inc, "x", "x" if status is L else "y"), 0)
    return t


def test_unknown_alive_is_added():
    t = MemberTable("me", 100)
    assert t.apply_alive(Alive(1, "x", "a:1", (("k", "v"),)), 3).reason == "added"
    assert t.get("x").status is A and t.get("x").changed_at == 3


def test_old_incarnations_are_ignored():
    t = table_with(A, 5)
    assert t.apply_alive(Alive(5, "x", "10.0.0.2:1", ()), 1).reason == "stale"
    assert t.apply_suspect(Suspect(4, "x", "y"), 1).reason == "stale"
    assert t.apply_dead(Dead(4, "x", "y"), 1).reason == "stale"
    assert t.get("x").status is A


def test_suspect_refuted_by_higher_incarnation():
    t = table_with(S, 5)
    v = t.apply_alive(Alive(6, "x", "10.0.0.2:1", ()), 1)
    assert v.changed and v.previous is S and t.get("x").status is A


def test_suspect_with_same_incarnation_is_a_confirmation():
    assert table_with(S, 5).apply_suspect(Suspect(5, "x", "z"), 1).reason == "confirmation"


def test_dead_is_final_for_that_incarnation():
    t = table_with(D, 5)
    assert t.apply_suspect(Suspect(5, "x", "y"), 1).reason == "final"
    assert t.apply_dead(Dead(9, "x", "y"), 1).reason == "final"
    assert t.apply_alive(Alive(5, "x", "10.0.0.2:1", ()), 1).reason == "stale"
    assert t.apply_alive(Alive(6, "x", "10.0.0.2:1", ()), 1).changed  # a rejoin needs a higher incarnation


def test_leave_is_not_a_failure():
    t = table_with(A, 5)
    assert t.apply_dead(Dead(5, "x", "x"), 1).reason == "left" and t.get("x").status is L


def test_two_processes_claiming_one_name_do_not_flap():
    t = table_with(A, 5)
    assert t.apply_alive(Alive(6, "x", "10.9.9.9:1", ()), 1).reason == "addr_conflict"
    assert t.get("x").addr == "10.0.0.2:1"


def test_unknown_member_suspicion_and_death_are_ignored():
    t = MemberTable("me", 100)
    assert t.apply_suspect(Suspect(1, "ghost", "y"), 0).reason == "unknown"
    assert t.apply_dead(Dead(1, "ghost", "y"), 0).reason == "unknown"


def test_the_table_is_bounded():
    t = MemberTable("me", 2)
    t.apply_alive(Alive(1, "a", "a:1", ()), 0)
    t.apply_alive(Alive(1, "b", "b:1", ()), 0)
    assert t.apply_alive(Alive(1, "c", "c:1", ()), 0).reason == "table_full"


def test_reap_forgets_left_members_after_their_time_and_failed_ones_after_theirs():
    t = table_with(L, 5)
    assert t.reap(10, left_reap_s=20, dead_reap_s=100) == []
    assert t.reap(21, left_reap_s=20, dead_reap_s=100)[0].name == "x" and t.get("x") is None
    t = table_with(D, 5)
    assert t.reap(21, left_reap_s=20, dead_reap_s=100) == [] and t.get("x").status is D  # may be cut off
    assert t.reap(101, left_reap_s=20, dead_reap_s=100)[0].name == "x" and t.get("x") is None


def test_a_failed_member_said_to_leave_under_its_own_name_has_left():
    """force-leave: a DEAD member becomes LEFT by a leave in its own name at (at least) its incarnation; no
    other message moves it, and LEFT stays final."""
    t = table_with(D, 5)
    assert t.apply_dead(Dead(4, "x", "x"), 1).reason == "stale"
    v = t.apply_dead(Dead(5, "x", "x"), 2)
    assert v.reason == "left" and v.previous is D and t.get("x").status is L and t.get("x").changed_at == 2
    assert t.apply_dead(Dead(5, "x", "x"), 3).reason == "final"
    assert t.apply_dead(Dead(5, "x", "y"), 3).reason == "final"
    assert t.apply_alive(Alive(6, "x", "10.0.0.2:1", ()), 4).changed  # alive after all: it refutes


def swim(name="me", **cfg) -> Swim:
    return Swim(MeshConfig.lan(**cfg), name, f"{name}:1", {}, random.Random(0), 0.0)


def test_suspicion_about_self_is_refuted_with_a_higher_incarnation():
    s = swim()
    s.handle(PacketIn("x:1", [Suspect(1, "me", "x")]), 1.0)
    assert s.incarnation == 2 and s.stats["refutations"] == 1 and s.awareness == 1
    assert s.table.get("me").status is A


def test_dead_about_self_while_leaving_is_accepted():
    from mesh.swim import Leave
    s = swim()
    s.handle(Leave(), 1.0)
    s.handle(PacketIn("x:1", [Dead(9, "me", "x")]), 1.0)
    assert s.stats["refutations"] == 0


def test_ping_gets_an_ack_and_wrong_target_does_not():
    s = swim()
    out = s.handle(PacketIn("x:1", [Ping(7, "me", "x", "x:1")]), 1.0)
    messages, _ = decode_packet(encode_packet(list(out[0].messages)), 2000)
    assert out[0].addr == "x:1" and Ack(7, "me") in messages
    assert s.handle(PacketIn("x:1", [Ping(8, "someone-else", "x", "x:1")]), 1.0) == []


def test_unanswered_probe_leads_to_suspicion_then_death():
    s = swim(probe_interval_s=1.0, probe_timeout_s=0.5, suspicion_mult=4)
    s.handle(PacketIn("x:1", [Alive(1, "x", "x:1", ())]), 0.0)
    changes = []
    t = 0.0
    while t < 40:
        t = max(t + 0.001, s.next_deadline())
        changes += [a for a in s.handle(Tick(), t) if isinstance(a, MemberChanged)]
    statuses = [c.member.status for c in changes if c.member.name == "x"]
    assert statuses == [S, D]
    # n = 2 members: min suspicion = 4 * 1 * 1 s; Lifeguard starts at 6x that with no confirmations.
    assert s.stats["suspicions_raised"] == 1


def test_buddy_system_puts_the_suspicion_in_the_probe():
    s = swim()
    s.handle(PacketIn("x:1", [Alive(1, "x", "x:1", ())]), 0.0)
    s.handle(PacketIn("y:1", [Suspect(1, "x", "y")]), 0.0)
    t, packet = 0.0, None
    while packet is None:
        t = s.next_deadline()
        for a in s.handle(Tick(), t):
            if isinstance(a, SendPacket) and a.addr == "x:1":
                msgs, _ = decode_packet(encode_packet(list(a.messages)), 2000)
                if any(isinstance(m, Ping) for m in msgs):
                    packet = msgs
    assert isinstance(packet[0], Suspect) and packet[0].node == "x" and isinstance(packet[1], Ping)


def _pinged(actions) -> "set[str]":
    return {a.addr for a in actions if isinstance(a, SendPacket)
            and any(isinstance(m, Ping) for m in decode_packet(encode_packet(list(a.messages)), 2000)[0])}


def test_a_suspicion_heard_from_another_member_is_probed_at_once():
    """Our own probe of the suspect is the independent confirmation Lifeguard's timeout waits for (or its
    ack, no confirmation): sent when we hear of the suspicion, not when our round-robin reaches it."""
    s = swim()
    for name in "abcdefgh":
        s.handle(PacketIn(f"{name}:1", [Alive(1, name, f"{name}:1", ())]), 0.0)
    assert s.next_deadline() > 0.0
    s.handle(PacketIn("a:1", [Suspect(1, "h", "a")]), 0.0)
    assert s.next_deadline() == 0.0 and _pinged(s.handle(Tick(), 0.0)) == {"h:1"}
    # With a probe of ours running, the suspect is the next one, when its period ends.
    running = s._probe.target
    other = "g" if running != "g" else "f"
    s.handle(PacketIn("a:1", [Suspect(1, other, "a")]), 0.1)
    t, pinged = 0.1, set()
    while not pinged:
        t = s.next_deadline()
        pinged = _pinged(s.handle(Tick(), t))
    assert pinged == {f"{other}:1"} and t == s.config.probe_interval_s


def test_a_member_that_refuted_lately_gets_longer_suspicions_and_a_crashed_one_does_not():
    """A refutation shows a member alive but slow: for refuted_memory_s its suspicions run the longest
    timeout even when confirmed. A member that never refuted is judged on the usual timeout."""
    s = swim()
    for name in "abcdefgh":
        s.handle(PacketIn(f"{name}:1", [Alive(1, name, f"{name}:1", ())]), 0.0)
    s.handle(PacketIn("a:1", [Suspect(1, "x", "a")]), 1.0)  # x is not a member: ignored
    s.handle(PacketIn("a:1", [Suspect(1, "h", "a")]), 1.0)
    usual = s._suspicions["h"].deadline - 1.0
    s.handle(PacketIn("h:1", [Alive(2, "h", "h:1", ())]), 2.0)  # h refutes
    assert "h" not in s._suspicions and s.table.get("h").status is A
    longest = s.config.suspicion_max_s(9)
    s.handle(PacketIn("a:1", [Suspect(2, "h", "a")]), 3.0)
    s.handle(PacketIn("b:1", [Suspect(2, "h", "b")]), 3.0)
    s.handle(PacketIn("c:1", [Suspect(2, "h", "c")]), 3.0)  # confirmed twice: the minimum, were it not for...
    # ...the refutation: the longest timeout, held while it is remembered (20 s from 2.0: less than 3 + 24).
    memory_s = s.config.refuted_memory_s
    assert s._suspicions["h"].deadline == min(3.0 + longest, 2.0 + memory_s) == 22.0
    s.handle(PacketIn("a:1", [Suspect(1, "g", "a")]), 3.0)  # g never refuted
    s.handle(PacketIn("b:1", [Suspect(1, "g", "b")]), 3.0)
    s.handle(PacketIn("c:1", [Suspect(1, "g", "c")]), 3.0)
    assert s._suspicions["g"].deadline - 3.0 == s.config.suspicion_min_s(9) < longest
    # When the memory lapses, the usual timeout (confirmed twice: long over) gives the verdict.
    changes = [a for a in s.handle(Tick(), 22.0) if isinstance(a, MemberChanged) and a.member.name == "h"]
    assert changes and changes[0].member.status is D
    s.handle(PacketIn("h:1", [Alive(3, "h", "h:1", ())]), 23.0)  # h comes back
    later = 23.0 + s.config.refuted_memory_s + 1
    s.handle(PacketIn("a:1", [Suspect(3, "h", "a")]), later)  # remembered no longer
    assert s._suspicions["h"].deadline - later == usual
    assert MeshConfig.lan(lifeguard=False).refuted_memory_s and swim(lifeguard=False)._suspicion_timeout_s(
        "h", s._suspicions["h"], later) == MeshConfig.lan(lifeguard=False).suspicion_timeout_s(9, 0)


def test_confirmations_shorten_the_suspicion_timeout():
    cfg = MeshConfig.lan()
    n = 10
    assert cfg.suspicion_timeout_s(n, 0) == 6 * cfg.suspicion_min_s(n)
    assert cfg.suspicion_timeout_s(n, 1) < cfg.suspicion_timeout_s(n, 0)
    assert cfg.suspicion_timeout_s(n, 2) == cfg.suspicion_min_s(n)
    assert MeshConfig.lan(lifeguard=False).suspicion_timeout_s(n, 0) == cfg.suspicion_min_s(n)


def test_confirmations_expected_are_at_most_the_members_who_could_confirm():
    """k is at most n - 2: in 3 members the one confirmation there can be brings the minimum (it waited ~60 %
    of the longest before: 13 s on the LAN preset); 2 members have nobody to confirm, the longest."""
    cfg = MeshConfig.lan()
    assert [cfg.confirmations_expected(n) for n in (1, 2, 3, 4, 10)] == [1, 1, 1, 2, 2]
    assert cfg.suspicion_timeout_s(3, 1) == cfg.suspicion_min_s(3) == 4.0
    assert cfg.suspicion_timeout_s(3, 0) == cfg.suspicion_max_s(3) == 24.0  # unconfirmed: a slow accuser waits
    assert cfg.suspicion_timeout_s(2, 0) == cfg.suspicion_max_s(2)
    assert 4.0 < cfg.suspicion_timeout_s(4, 1) < 24.0


def test_retransmit_limit_grows_with_log_of_cluster_size():
    cfg = MeshConfig.lan()
    assert [cfg.retransmit_limit(n) for n in (1, 9, 10, 99, 100, 1000)] == [4, 4, 8, 8, 12, 16]


def run_with_answered_probes(s: Swim, until_s: float, extra_ticks_s: float = 0.0,
                             queue_at: "tuple[float, bytes] | None" = None) -> "tuple[list, int]":
    """Drive ``s`` at its deadlines (and every ``extra_ticks_s`` besides, when given), its peer x acking
    every ping at once; ``queue_at``: a subsystem's broadcast queued at that time. (packets sent, ticks)."""
    from mesh.swim import QueueUser
    sent, ticks, t, extra_at = [], 0, 0.0, extra_ticks_s or float("inf")
    while True:
        t = min(s.next_deadline(), extra_at, queue_at[0] if queue_at else float("inf"))
        if t >= until_s:
            return sent, ticks
        if queue_at and t == queue_at[0]:
            actions = s.handle(QueueUser(queue_at[1]), t)
            queue_at = None
        else:
            actions = s.handle(Tick(), t)
            ticks += 1
        if t == extra_at:
            extra_at += extra_ticks_s
        for action in actions:
            if isinstance(action, SendPacket):
                sent.append((t, action.addr, action.messages))
                for m in decode_packet(encode_packet(list(action.messages)), 4000)[0]:
                    if isinstance(m, Ping):
                        s.handle(PacketIn("x:1", [Ack(m.seq, "x")]), t)


def test_a_quiet_mesh_wakes_for_probes_not_for_empty_gossip_rounds_and_keeps_their_times():
    # An idle node woke 5 times a second for gossip rounds that sent nothing (BENCHMARKS.md, idle CPU).
    def fresh() -> Swim:
        s = swim()
        s.handle(PacketIn("x:1", [Alive(1, "x", "x:1", ())]), 0.0)
        return s

    quiet, quiet_ticks = run_with_answered_probes(fresh(), 60.0, queue_at=(41.33, b"news"))
    woken, woken_ticks = run_with_answered_probes(fresh(), 60.0, extra_ticks_s=0.05, queue_at=(41.33, b"news"))
    # Woken every 50 ms or only at its deadlines, the node sends the same packets at the same times: the
    # broadcast at the first round after it was queued, not at once.
    assert quiet == woken
    news = [t for t, _, messages in quiet if any(b"news" in m for m in messages)]
    assert news and 41.33 < news[0] <= 41.33 + MeshConfig.lan().gossip_interval_s
    # 60 s: ~60 probes, a few rounds for the news and the first seconds' queue; not 300 gossip rounds.
    assert quiet_ticks < 120 and woken_ticks > 1200


def test_a_member_that_had_to_refute_lately_holds_its_own_suspicions_longest():
    """Suspected and refuting, we are the slow one: a suspect's refutation reaches us late, so our own verdict
    waits the longest timeout, even for a suspicion we held before we refuted. The others' verdict, when right,
    reaches us by gossip."""
    s = swim()
    for name in "abcdefgh":
        s.handle(PacketIn(f"{name}:1", [Alive(1, name, f"{name}:1", ())]), 0.0)
    for accuser in "abc":  # confirmed twice: the minimum
        s.handle(PacketIn(f"{accuser}:1", [Suspect(1, "h", accuser)]), 1.0)
    shortest, longest = s.config.suspicion_min_s(9), s.config.suspicion_max_s(9)
    assert s._suspicions["h"].deadline == 1.0 + shortest
    s.handle(PacketIn("a:1", [Suspect(1, "me", "a")]), 2.0)  # we are suspected: we refute
    assert s.stats["refutations"] == 1
    # Our probes go unanswered here, so our awareness stays above 0: the longest timeout, held until our
    # refutation's memory lapses (2 + 20 s, before 1 + 24).
    held_until = min(1.0 + longest, 2.0 + s.config.refuted_memory_s)
    changes = []
    t = 2.0
    while t < held_until + 1 and not changes:
        t = max(t + 0.001, s.next_deadline())
        changes = [a for a in s.handle(Tick(), t) if isinstance(a, MemberChanged) and a.member.name == "h"]
        if t < held_until:
            assert not changes, f"h declared dead at {t}: before the longest timeout"
        assert s.awareness > 0
    assert changes and changes[0].member.status is D and t == held_until
    # Others' verdicts are taken at once, whatever our own timeout.
    s.handle(PacketIn("a:1", [Suspect(1, "g", "a")]), t)
    s.handle(PacketIn("b:1", [Dead(1, "g", "b")]), t)
    assert s.table.get("g").status is D
    # Past refuted_memory_s, the usual timeouts again.
    later = 2.0 + s.config.refuted_memory_s + 1
    for accuser in "abc":
        s.handle(PacketIn(f"{accuser}:1", [Suspect(1, "f", accuser)]), later)
    assert s._suspicions["f"].deadline == later + shortest


def test_a_member_well_again_judges_on_the_usual_timeouts_at_once():
    """We refuted a suspicion of us, then our probes succeed again (awareness back to 0): our network was
    lossy, not our process slow. Suspicions held for our slowness run their own timeouts from then on. Held for
    the whole memory instead, a crash right after a lossy half-minute waited the longest timeout on every
    survivor (BENCHMARKS.md: 28.5 s p50 after 30 s of 30 % loss)."""
    s = swim()
    for name in "abcdefgh":
        s.handle(PacketIn(f"{name}:1", [Alive(1, name, f"{name}:1", ())]), 0.0)
    s.handle(PacketIn("a:1", [Suspect(1, "me", "a")]), 1.0)  # we refute: awareness 1
    assert s.awareness == 1
    for accuser in "abc":
        s.handle(PacketIn(f"{accuser}:1", [Suspect(1, "h", accuser)]), 2.0)
    assert s._suspicions["h"].deadline > 2.0 + s.config.suspicion_min_s(9)  # held: we may be the slow one
    t = 2.0
    while s.awareness:  # answer our probes (not h's: h is down) until we are well again
        t = max(t + 0.001, s.next_deadline())
        for action in s.handle(Tick(), t):
            if isinstance(action, SendPacket):
                for m in decode_packet(encode_packet(list(action.messages)), 4000)[0]:
                    if isinstance(m, Ping) and m.target != "h":
                        s.handle(PacketIn(action.addr, [Ack(m.seq, m.target)]), t)
        assert t < 20.0, "awareness never fell back to 0"
    assert s._suspicions["h"].deadline == 2.0 + s.config.suspicion_min_s(9)  # its own timeout, now
    changes = [a for a in s.handle(Tick(), max(t, 6.0)) if isinstance(a, MemberChanged) and a.member.name == "h"]
    assert changes and changes[0].member.status is D


def test_refuting_a_merged_or_dead_verdict_of_us_is_no_sign_of_slowness():
    """A restarted process hears of its previous life: a peer's state merged at its join says "suspect" in our
    own name, gossip may say "dead". It refutes both, but neither says it answers late."""
    for message in (Suspect(1, "me", "me"), Dead(1, "me", "x")):
        s = swim()
        s.handle(PacketIn("x:1", [message]), 1.0)
        assert s.stats["refutations"] == 1 and s._self_refuted_at is None
    s = swim()
    s.handle(PacketIn("x:1", [Suspect(1, "me", "x")]), 1.0)
    assert s._self_refuted_at == 1.0

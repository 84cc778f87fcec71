"""The hash ring: distinct owners, minimal movement, and a golden distribution that must not drift."""

import collections

from mesh.ring import HashRing, hash64

MEMBERS = [f"node-{i}" for i in range(5)]
KEYS = [f"key-{i}" for i in range(10_000)]


def test_owners_are_distinct_and_primary_first():
    ring = HashRing.build(MEMBERS)
    owners = ring.owners("some-key", 3)
    assert len(set(owners)) == 3 and owners[0] == ring.owner("some-key")
    assert len(ring.owners("k", 10)) == 5
    assert HashRing.build([]).owners("k", 2) == []


def test_removing_a_member_moves_only_its_keys():
    ring = HashRing.build(MEMBERS)
    smaller = HashRing.build(MEMBERS[:-1])
    moved = [k for k in KEYS if ring.owner(k) != smaller.owner(k)]
    assert all(ring.owner(k) == "node-4" for k in moved)
    # The second owner takes over: a key's replica is where the data already is.
    assert all(smaller.owner(k) == ring.owners(k, 2)[1] for k in moved)


def test_golden_distribution_of_ten_thousand_keys():
    # Pins the hash function, vnode naming and lookup: a change here moves keys between
    # nodes of a running cluster during an upgrade. Update only on purpose.
    ring = HashRing.build(MEMBERS)
    counts = collections.Counter(ring.owner(k) for k in KEYS)
    assert dict(sorted(counts.items())) == GOLDEN
    assert max(counts.values()) / min(counts.values()) < 1.35


GOLDEN = {'node-0': 1735, 'node-1': 1991, 'node-2': 2152, 'node-3': 2189, 'node-4': 1933}


def test_walk_is_owners_taken_lazily():
    ring = HashRing.build([f"n{i}" for i in range(7)])
    for key in ("a", "conv_1", "resp_2", "x" * 100):
        walked = list(ring.walk(key))
        assert walked == ring.owners(key, 7) and sorted(walked) == sorted(ring.members)
    assert list(HashRing.build([]).walk("k")) == []


def test_placement_puts_no_two_copies_on_one_machine_while_another_has_none():
    """Issue 36: rate-limit replicas and KV followers took the plain ring order, so with --workers N a key's owner
    and its replica could be two processes of one machine that die together. One rule places every key now."""
    processes = [f"m{m}-w{w}" for m in range(3) for w in range(2)]  # three machines, two processes each
    machine = lambda member: member.split("-")[0]  # noqa: E731
    ring = HashRing.build(processes)
    for key in KEYS[:2000]:
        owners = ring.placement(key, 2, machine)
        assert len(owners) == 2 and len({machine(m) for m in owners}) == 2, (key, owners)
        assert owners[0] == ring.owner(key)  # the primary is the plain ring's: nothing moves for it
        five = ring.placement(key, 5, machine)  # more copies than machines: every machine first
        assert len(five) == 5 and len({machine(m) for m in five[:3]}) == 3
        walk = ring.placement(key, 0, machine, owners_only=False)
        assert sorted(walk) == sorted(processes) and walk[:3] == ring.placement(key, 3, machine)
    # One machine: its processes, in ring order (a process restarting alone still finds a copy).
    assert sorted(HashRing.build(["a-w0", "a-w1"]).placement("k", 2, machine)) == ["a-w0", "a-w1"]
    # Members on machines of their own: the plain ring order.
    plain = HashRing.build(MEMBERS)
    assert all(plain.placement(k, 3, lambda m: m) == plain.owners(k, 3) for k in KEYS[:500])


async def test_a_cluster_places_by_its_members_node_tags_and_a_peer_it_cannot_ask_is_one_error():
    import pytest
    import trio

    from gateway.cluster import ClusterState
    from mesh import PeerUnreachable
    from mesh.members import MemberSnapshot, MemberStatus

    class Agent:  # the two calls ClusterState makes of a mesh agent here
        def __init__(self, members):
            self._members = {m.name: m for m in members}

        def member(self, name):
            return self._members.get(name)

        def members(self):
            return list(self._members.values())

        async def request(self, addr, payload, timeout_s):
            await trio.sleep_forever()  # a peer that never answers

    snapshots = [MemberSnapshot(f"n{m}-w{w}", f"10.0.0.{m}:7946", 1, MemberStatus.ALIVE, {"node": f"n{m}"}, 0.0)
                 for m in range(2) for w in range(2)]
    cluster = ClusterState("n0-w0")
    cluster.agent = Agent(snapshots)
    cluster.ring_view.update(snapshots)
    for key in KEYS[:200]:
        owners = cluster.owners(key, 2)
        assert {cluster.machine_of(m) for m in owners} == {"n0", "n1"}
    with pytest.raises(PeerUnreachable, match="no member"):
        await cluster.request_peer("stranger", b"x", 1.0)
    with trio.move_on_after(5):
        with pytest.raises(PeerUnreachable):
            await cluster.request_peer("n1-w0", b"x", 0.05)


def test_owner_is_the_first_of_owners_and_what_it_remembers_is_bounded():
    from mesh.ring import OWNER_CACHE_KEYS_MAX
    ring = HashRing.build([f"node-{i}" for i in range(7)])
    keys = [f"tenant-{i}:requests" for i in range(OWNER_CACHE_KEYS_MAX + 100)]
    for _ in range(2):  # computed, then remembered: the same answers
        assert all(ring.owner(key) == ring.owners(key, 1)[0] for key in keys)
    assert len(ring._owner_of) <= OWNER_CACHE_KEYS_MAX
    assert HashRing.build([]).owner("any") is None
    # A key past the last point wraps to the first point's member.
    past_the_end = next(f"k{i}" for i in range(100_000) if hash64(f"k{i}") > ring._points[-1])
    assert ring.owner(past_the_end) == ring._owners[0] == ring.owners(past_the_end, 1)[0]

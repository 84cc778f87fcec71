"""The replicated worker registry document: convergence, removal wins by stamp, bounded history."""

import random

import pytest

from mesh.worker_doc import EPOCH_MAX, STAMP_AHEAD_MAX_S, DocError, WorkerDoc


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t


def sync(*docs: WorkerDoc, rng=None) -> None:
    """Exchange states until nothing changes (what push-pull does)."""
    for _ in range(4):
        for a in docs:
            for b in docs:
                if a is not b:
                    for extra in b.merge(a.state()):
                        for c in docs:
                            c.merge(extra)


def test_registration_reaches_every_node_by_update_and_by_state():
    clock = Clock()
    a, b, c = (WorkerDoc(n, clock=clock) for n in "abc")
    update = a.register("w1", {"url": "grpc://e:1", "kind": "grpc"})
    b.merge(update)
    assert b.workers()["w1"]["url"] == "grpc://e:1"
    c.merge(b.state())  # a joining node gets everything at once
    assert set(c.workers()) == {"w1"}


def test_updates_are_idempotent_and_commute():
    clock = Clock()
    a, b = WorkerDoc("a", clock=clock), WorkerDoc("b", clock=clock)
    u1 = a.register("w1", {"url": "u1"})
    clock.t += 1
    u2 = a.remove("w1")
    for u in (u2, u1, u2, u1):
        b.merge(u)
    assert b.workers() == {} and a.workers() == {}


def test_later_removal_beats_earlier_registration_across_nodes():
    clock = Clock()
    a, b = WorkerDoc("a", clock=clock), WorkerDoc("b", clock=clock)
    a.merge(b.register("w1", {"url": "u"}))
    clock.t += 1
    b.merge(a.remove("w1"))
    sync(a, b)
    assert a.workers() == b.workers() == {}


def test_concurrent_writes_settle_on_the_newest_stamp():
    clock = Clock()
    a, b = WorkerDoc("a", clock=clock), WorkerDoc("b", clock=clock)
    ua = a.set_health("w1", {"healthy": True})
    clock.t += 1
    ub = b.set_health("w1", {"healthy": False})
    a.merge(ub)
    b.merge(ua)
    sync(a, b)
    assert a.health()["w1"]["healthy"] is False and b.health()["w1"]["healthy"] is False


def test_unchanged_health_writes_nothing():
    doc = WorkerDoc("a", clock=Clock())
    assert doc.set_health("w1", {"healthy": True}) is not None
    assert doc.set_health("w1", {"healthy": True}) is None


def test_long_run_of_health_flaps_stays_bounded():
    clock = Clock()
    a, b = WorkerDoc("a", compact_bytes=16 * 1024, clock=clock), WorkerDoc("b", compact_bytes=16 * 1024, clock=clock)
    for w in range(5):
        b.merge(a.register(f"w{w}", {"url": f"grpc://e{w}:1"}))
    sizes = []
    for i in range(10_000):
        clock.t += 0.01
        writer, reader = (a, b) if (i // 100) % 2 == 0 else (b, a)
        update = writer.set_health(f"w{i % 5}", {"healthy": i % 2 == 0})
        for extra in reader.merge(update):
            writer.merge(extra)
        compacted = writer.maybe_compact()
        if compacted is not None:
            reader.merge(compacted)
        sizes.append(max(a.size_bytes(), b.size_bytes()))
    # Without compaction this run grows to ~115 KB; with it, never past the bound plus one write.
    assert max(sizes) <= 16 * 1024 + 512
    assert a.compactions + b.compactions >= 5
    assert a.workers() == b.workers() and len(a.workers()) == 5
    assert a.health() == b.health()


def test_a_write_racing_a_compaction_is_not_lost():
    clock = Clock()
    a, b = WorkerDoc("a", compact_bytes=1, clock=clock), WorkerDoc("b", clock=clock)
    b.merge(a.register("w1", {"url": "u"}))
    clock.t += 1
    racing = b.register("w2", {"url": "u2"})  # b writes at the old epoch...
    new_epoch = a.maybe_compact()  # ...while a compacts without it
    assert new_epoch is not None and a.epoch == 1
    resend = b.merge(new_epoch)  # b adopts epoch 1 and re-applies its own write
    for update in resend:
        a.merge(update)
    a.merge(racing)  # the old-epoch update itself is answered with the new state
    assert set(a.workers()) == set(b.workers()) == {"w1", "w2"}


def test_old_tombstones_are_dropped_at_compaction():
    clock = Clock()
    doc = WorkerDoc("a", compact_bytes=1, tombstone_s=60, clock=clock)
    doc.register("w1", {"url": "u"})
    doc.remove("w1")
    clock.t += 120
    doc.maybe_compact()
    assert doc.get("workers", "w1") is None


@pytest.mark.parametrize("seed", range(5))
def test_random_delivery_converges(seed):
    rng = random.Random(seed)
    clock = Clock()
    docs = [WorkerDoc(n, compact_bytes=2048, clock=clock) for n in "abcd"]
    pending = []
    for i in range(300):
        clock.t += rng.random()
        d = rng.choice(docs)
        op = rng.random()
        if op < 0.3:
            pending.append(d.register(f"w{rng.randrange(10)}", {"url": str(i)}))
        elif op < 0.45:
            pending.append(d.remove(f"w{rng.randrange(10)}"))
        else:
            u = d.set_health(f"w{rng.randrange(10)}", {"healthy": rng.random() < 0.5})
            if u:
                pending.append(u)
        c = d.maybe_compact()
        if c:
            pending.append(c)
        rng.shuffle(pending)
        while pending and rng.random() < 0.7:  # deliver some, late and out of order, to a random node
            pending.extend(rng.choice(docs).merge(pending.pop()))
    sync(*docs)
    assert all(d.workers() == docs[0].workers() for d in docs), f"seed={seed}"
    assert all(d.health() == docs[0].health() for d in docs), f"seed={seed}"


def test_garbage_is_refused():
    with pytest.raises(DocError):
        WorkerDoc("a").merge(b"\x00garbage")


def _peer_update(entries: dict, epoch: int = 0) -> bytes:
    """A peer's update carrying raw map values, as a key holder could craft it."""
    import msgpack
    import pycrdt
    doc = pycrdt.Doc()
    maps = {}
    with doc.transaction():
        for (map_name, key), raw in entries.items():
            maps.setdefault(map_name, doc.get(map_name, type=pycrdt.Map))[key] = raw
    return msgpack.packb([epoch, doc.get_update()])


def test_unreadable_values_from_a_peer_refuse_the_update_and_leave_the_document_as_it_was():
    doc = WorkerDoc("a", clock=Clock())
    doc.register("w0", {"url": "u0"})
    before = doc.state()
    for raw in ("{not json", "[1, 2]", '{"t": 1.5e19, "by": "x"}', '{"by": "x"}', '{"t": 5}'):
        with pytest.raises(DocError):
            doc.merge(_peer_update({("workers", "w1"): raw}))
        assert doc.state() == before and set(doc.workers()) == {"w0"}
    assert doc.register("w1", {"url": "u"})  # and writing goes on


MSGPACK_UINT_MAX = 2 ** 64 - 1


@pytest.mark.parametrize("epoch", [MSGPACK_UINT_MAX, EPOCH_MAX + 1, -1])
def test_an_epoch_out_of_range_is_refused_and_the_next_compaction_still_encodes(epoch):
    # The attack of issue 33: an update at epoch 2^64 - 1 was adopted; the next compaction computed
    # epoch + 1, which msgpack cannot encode, and the node died at its next ordinary write.
    import msgpack
    import pycrdt
    doc = WorkerDoc("a", compact_bytes=1, clock=Clock())
    with pytest.raises(DocError):
        doc.merge(msgpack.packb([epoch, pycrdt.Doc().get_update()]))
    assert doc.epoch == 0
    doc.register("w1", {"url": "u"})
    assert doc.maybe_compact() is not None and doc.epoch == 1


def test_at_the_last_epoch_the_document_stops_compacting_instead_of_overflowing():
    import msgpack
    clock = Clock()
    peer = WorkerDoc("p", clock=clock)
    peer.register("w1", {"url": "u"})
    epoch, update = msgpack.unpackb(peer.state())
    doc = WorkerDoc("a", compact_bytes=1, clock=clock)
    doc.merge(msgpack.packb([EPOCH_MAX, update]))  # in range, however unlikely: adopted
    assert doc.epoch == EPOCH_MAX
    assert doc.maybe_compact() is None  # saturated: no EPOCH_MAX + 1
    assert msgpack.unpackb(doc.register("w2", {"url": "v"}))[0] == EPOCH_MAX
    assert set(doc.workers()) == {"w1", "w2"}


def test_a_stamp_from_the_far_future_is_refused_so_our_clock_never_follows_it():
    clock = Clock()
    doc = WorkerDoc("a", clock=clock)
    ahead_ms = int((clock.t + STAMP_AHEAD_MAX_S + 1) * 1000)
    for stamp in (ahead_ms, MSGPACK_UINT_MAX, 2 ** 63):
        with pytest.raises(DocError):
            doc.merge(_peer_update({("settings", "x"): f'{{"value": 1, "t": {stamp}, "by": "evil"}}'}))
    written = doc.get("workers", "w1") if doc.register("w1", {"url": "u"}) else None
    assert written is not None and written["t"] <= clock.t * 1000 + 1
    # A stamp a little ahead (a peer's clock a minute fast) is taken, and ours moves past it.
    near_ms = int((clock.t + 60) * 1000)
    doc.merge(_peer_update({("settings", "x"): f'{{"value": 1, "t": {near_ms}, "by": "b"}}'}))
    doc.register("w2", {"url": "u"})
    assert doc.get("workers", "w2")["t"] > near_ms


def test_a_refused_update_after_a_good_one_changes_nothing_more():
    clock = Clock()
    a, b = WorkerDoc("a", clock=clock), WorkerDoc("b", clock=clock)
    b.merge(a.register("w1", {"url": "u"}))
    state = b.state()
    with pytest.raises(DocError):
        b.merge(b"\x92\x00\xc4\x03abc")  # [0, b"abc"]: not a pycrdt update
    with pytest.raises(DocError):
        b.merge(_peer_update({("workers", "x" * 300): '{"t": 1, "by": "b"}'}))
    assert b.state() == state and set(b.workers()) == {"w1"}

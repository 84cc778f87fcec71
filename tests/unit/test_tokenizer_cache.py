"""The tokenizer caches' storage: what they hand back, and what they cost the garbage collector."""

import gc
from array import array

import pytest

from gateway.tokenizer.cache import ExactCache, SegmentCache, pack_ids, unpack_ids


def test_packed_ids_round_trip():
    for ids in ([], [0], [151_645, 7, 2**32 - 1], list(range(10_000))):
        assert unpack_ids(pack_ids(ids)) == ids


def test_packed_ids_are_four_native_bytes_each_from_a_list_or_any_sequence():
    ids = [0, 1, 255, 256, 151_645, 2**32 - 1]
    expected = b"".join(i.to_bytes(4, "little" if array("I", [1]).tobytes()[0] == 1 else "big") for i in ids)
    assert pack_ids(ids) == pack_ids(tuple(ids)) == pack_ids(range(0)) + pack_ids(ids) == expected
    with pytest.raises(OverflowError):  # an id past 32 bits is refused, not wrapped
        pack_ids([2**32])


def test_full_caches_leave_the_garbage_collector_nothing_to_walk():
    # A full L1 holds ~190,000 segments: as tracked objects they made every full collection
    # take 115-250 ms, stopping every thread (BENCHMARKS.md, ninth pass).
    l0 = ExactCache(entries_max=100_000, bytes_max=10**9)
    l1 = SegmentCache(bytes_max=10**9)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(5_000):
        l1.insert(l1.root(False), [f"system {i}<|im_end|>", f"user {i}<|im_end|>"], [[i, 151_645], [i + 1]])
        l0.put(f"text {i}", False, [i, i + 1, 70_000])
    gc.collect()
    assert len(gc.get_objects()) - before < 50
    assert l0.get("text 7", False) == [7, 8, 70_000]
    match = l1.longest_prefix(["system 9<|im_end|>", "user 9<|im_end|>", "tail"], False)
    assert (match.ids, match.segments) == ([9, 151_645, 10], 2)

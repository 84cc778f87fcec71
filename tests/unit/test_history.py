"""The node-local response store (gateway/history.py): scoped to its owner, bounded by count and bytes
(least recently used out first), forgotten after its retention time, on a passed-in clock."""

from __future__ import annotations

from gateway.history import HistoryConfig, ResponseStore


def put(store, rid, owner="a", now=0.0, size=10):
    return store.put(rid, owner, {"id": rid, "pad": "x" * size}, [], [], now)


def test_owner_scoping_and_delete():
    store = ResponseStore()
    put(store, "r1")
    assert store.get("r1", "a", 1.0).response["id"] == "r1"
    assert store.get("r1", "b", 1.0) is None and not store.delete("r1", "b", 1.0)
    assert store.delete("r1", "a", 1.0) and store.get("r1", "a", 1.0) is None


def test_bounded_by_count_and_bytes_least_recently_used_first():
    store = ResponseStore(HistoryConfig(max_responses=3))
    for i in range(3):
        put(store, f"r{i}")
    store.get("r0", "a", 1.0)  # used: r1 is now the least recent
    put(store, "r3")
    assert [rid for rid in ("r0", "r1", "r2", "r3") if store.get(rid, "a", 2.0)] == ["r0", "r2", "r3"]
    by_bytes = ResponseStore(HistoryConfig(max_bytes=1000))
    for i in range(10):
        put(by_bytes, f"b{i}", size=300)
    assert len(by_bytes) == 3 and by_bytes.get("b9", "a", 1.0) is not None  # ~330 bytes of JSON each


def test_retention():
    store = ResponseStore(HistoryConfig(retention_s=60.0))
    put(store, "old", now=0.0)
    put(store, "new", now=50.0)
    assert store.get("old", "a", 59.0) is not None
    assert store.get("old", "a", 61.0) is None and store.get("new", "a", 61.0) is not None
    put(store, "later", now=200.0)  # a write drops what expired
    assert len(store) == 1

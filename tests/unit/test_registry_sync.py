"""When a node drains a worker the cluster's document does not list (gateway/cluster/registry_sync.py),
one test per rule, on passed-in time."""

from __future__ import annotations

from gateway.cluster import AbsenceRule


def no_tombstones(wid: str) -> bool:
    return False


def test_a_listed_worker_is_never_drained():
    rule = AbsenceRule(grace_s=30)
    assert rule.to_drain(["a", "b"], {"a", "b"}, no_tombstones, now=0) == []
    assert rule.to_drain(["a", "b"], {"a", "b"}, no_tombstones, now=1000) == []


def test_a_tombstoned_worker_is_drained_at_once():
    rule = AbsenceRule(grace_s=30)
    assert rule.to_drain(["a", "b"], {"a"}, lambda wid: wid == "b", now=5) == ["b"]


def test_a_missing_worker_is_kept_for_the_grace_period_then_drained():
    rule = AbsenceRule(grace_s=30)
    assert rule.to_drain(["a"], set(), no_tombstones, now=100) == []
    assert rule.to_drain(["a"], set(), no_tombstones, now=129.9) == []
    assert rule.to_drain(["a"], set(), no_tombstones, now=130) == ["a"]


def test_reappearing_restarts_the_grace_period():
    rule = AbsenceRule(grace_s=30)
    rule.to_drain(["a"], set(), no_tombstones, now=0)
    assert rule.to_drain(["a"], {"a"}, no_tombstones, now=20) == []  # back in the document
    assert rule.to_drain(["a"], set(), no_tombstones, now=25) == []  # missing again: a new period
    assert rule.to_drain(["a"], set(), no_tombstones, now=54) == []
    assert rule.to_drain(["a"], set(), no_tombstones, now=55) == ["a"]


def test_a_worker_gone_meanwhile_is_forgotten():
    rule = AbsenceRule(grace_s=30)
    rule.to_drain(["a"], set(), no_tombstones, now=0)
    assert rule.to_drain([], set(), no_tombstones, now=10) == [] and rule.absent_since == {}

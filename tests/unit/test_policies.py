"""Routing policies choose from read-only candidates; each rule of each policy."""

import collections
import dataclasses

import pytest

from gateway.routing.policies import POLICIES, PolicyConfig, RoutingRequest, make_policy


@dataclasses.dataclass
class FakeWorker:
    id: str
    load: int = 0

    def load_score(self) -> int:
        return self.load


def workers(n: int, loads=None) -> list[FakeWorker]:
    return [FakeWorker(f"w{i}", (loads or [0] * n)[i]) for i in range(n)]


def policy(name: str, **kw):
    return make_policy(PolicyConfig(name=name, seed=1, **kw))


def test_every_policy_returns_one_of_the_candidates():
    ws = workers(3)
    for name in POLICIES:
        assert policy(name).choose(ws, RoutingRequest(input_ids=list(range(100)))) in ws


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        policy("fastest")


def test_round_robin_cycles():
    p, ws = policy("round_robin"), workers(3)
    assert [p.choose(ws, RoutingRequest()).id for _ in range(6)] == ["w0", "w1", "w2"] * 2


def test_random_spreads_over_all():
    p, ws = policy("random"), workers(4)
    assert {p.choose(ws, RoutingRequest()).id for _ in range(200)} == {"w0", "w1", "w2", "w3"}


def test_power_of_two_never_picks_the_most_loaded_of_two():
    p, ws = policy("power_of_two"), workers(2, [10, 0])
    assert all(p.choose(ws, RoutingRequest()).id == "w1" for _ in range(50))


def test_least_load_picks_the_minimum():
    p = policy("least_load")
    assert p.choose(workers(3, [5, 2, 9]), RoutingRequest()).id == "w1"


def test_consistent_hashing_is_stable_and_moves_few_keys():
    p = policy("consistent_hashing")
    ws = workers(5)
    before = {k: p.choose(ws, RoutingRequest(routing_key=f"user-{k}")).id for k in range(1000)}
    again = {k: p.choose(ws, RoutingRequest(routing_key=f"user-{k}")).id for k in range(1000)}
    assert before == again
    after = {k: p.choose(ws[:4], RoutingRequest(routing_key=f"user-{k}")).id for k in range(1000)}
    moved = sum(1 for k in before if before[k] != after[k])
    assert moved == sum(1 for k in before if before[k] == "w4")  # only the removed worker's keys move
    assert 100 < moved < 300


def test_prefix_hash_same_prefix_same_worker():
    p, ws = policy("prefix_hash", prefix_token_count=8), workers(4)
    a = p.choose(ws, RoutingRequest(input_ids=[1, 2, 3, 4, 5, 6, 7, 8, 100]))
    b = p.choose(ws, RoutingRequest(input_ids=[1, 2, 3, 4, 5, 6, 7, 8, 200, 300]))
    assert a is b


def test_manual_keeps_a_session_on_its_worker_and_reassigns_when_it_is_gone():
    p, ws = policy("manual"), workers(3)
    first = p.choose(ws, RoutingRequest(routing_key="s1"))
    for w in ws:
        w.load = 0 if w is not first else 100  # load does not move a live session
    assert all(p.choose(ws, RoutingRequest(routing_key="s1")) is first for _ in range(10))
    others = [w for w in ws if w is not first]
    moved = p.choose(others, RoutingRequest(routing_key="s1"))
    assert moved in others
    assert p.choose(ws, RoutingRequest(routing_key="s1")) is moved  # the new assignment sticks


def test_cache_aware_sends_a_shared_prefix_to_the_same_worker():
    p, ws = policy("cache_aware"), workers(3)
    system = list(range(1000, 1512))
    first = p.choose(ws, RoutingRequest(input_ids=system + [1, 2, 3]))
    for i in range(20):
        assert p.choose(ws, RoutingRequest(input_ids=system + [i] * 40)) is first


def test_cache_aware_spreads_unrelated_prompts():
    p, ws = policy("cache_aware"), workers(3)
    chosen = collections.Counter(p.choose(ws, RoutingRequest(input_ids=[i] * 64)).id for i in range(30))
    assert len(chosen) == 3 and min(chosen.values()) >= 5


def test_cache_aware_imbalance_overrides_cache_affinity():
    p, ws = policy("cache_aware", balance_abs_threshold=8, balance_rel_threshold=1.5), workers(2)
    prompt = RoutingRequest(input_ids=list(range(256)))
    home = p.choose(ws, prompt)
    other = next(w for w in ws if w is not home)
    home.load, other.load = 20, 1
    assert p.choose(ws, prompt) is other


def test_forget_drops_what_was_learnt():
    p, ws = policy("cache_aware"), workers(2)
    home = p.choose(ws, RoutingRequest(input_ids=list(range(256))))
    p.forget(home.id)
    assert p.index.size(home.id) == 0

"""Routing policies: choose one worker from a read-only list of candidates.

The caller has already filtered the candidates (healthy, circuit allows, serves
the model, not draining); a policy only chooses and never mutates a worker.
Policies that learn (``cache_aware``, ``manual``) keep their own state.

Load of a worker, as every policy here sees it (``load_score``): the engine's
own count of running + waiting requests from its last ``GetLoads`` poll, plus
the requests this node started on it since that poll; this node's in-flight
count when the engine reports nothing (HTTP workers).
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import hashlib
import itertools
import random
from collections.abc import Sequence
from typing import Any, Protocol

from .kv_index import KvIndex, prompt_block_hashes
from .prefix_index import ApproxPrefixIndex, chained_block_hashes
from ..base.options import Option
from ..base.registry import Registry


class RoutableWorker(Protocol):
    """What a policy reads of a worker. cache_aware also reads ``kv_events_unsupported`` where a worker
    has it (an engine that answered SubscribeKvEvents with UNIMPLEMENTED)."""

    id: str

    def load_score(self) -> int: ...


@dataclasses.dataclass(slots=True)  # not frozen: made per request (see GenerationPlan, gateway/serving/generation.py)
class RoutingRequest:
    input_ids: "Sequence[int] | None" = None  # token ids (gRPC engines)
    text: str | None = None  # the text, for HTTP workers that get no ids
    routing_key: str | None = None  # from the routing-key header
    adapter: Any = None  # the LoRA adapter the answer needs (gateway/adapters' AdapterSpec): its workers only

    def units(self) -> "Sequence[int] | str":
        if self.input_ids is not None:
            return self.input_ids
        return self.text or ""


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    name: str = "cache_aware"
    # cache_aware (sgl-router's defaults): send to the worker with the longest
    # cached prefix when it covers at least cache_threshold of the request;
    # but when loads are imbalanced (max - min > balance_abs_threshold AND
    # max > balance_rel_threshold * min), send to the least loaded instead.
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    block_size: int = 16
    tree_blocks_max_per_worker: int = 1 << 18  # 4 M tokens of prefix per engine
    # cache_aware with KV events (every candidate publishes them): choose the lowest
    #   cost = kv_overlap_weight * blocks to prefill + kv_blocks_per_request * load,
    # in the spirit of Dynamo's overlap_weight * prefill_blocks + decode_blocks: a block
    # the engine already holds is free; each request already running or queued there
    # costs about kv_blocks_per_request blocks of work (8 x 16 tokens by default).
    # The load-imbalance override above still applies first.
    kv_overlap_weight: float = 1.0
    kv_blocks_per_request: float = 8.0
    # prefix_hash: how many leading tokens pick the worker.
    prefix_token_count: int = 256
    # manual: sessions remembered (LRU).
    sticky_sessions_max: int = 100_000
    seed: int | None = None


def _rendezvous(key: str, candidates: "Sequence[RoutableWorker]") -> RoutableWorker:
    """Highest-random-weight hashing: stable across processes, moves 1/n keys when n changes."""
    def weight(w: RoutableWorker) -> bytes:
        return hashlib.blake2b(f"{key}\x00{w.id}".encode(), digest_size=8).digest()
    return max(candidates, key=weight)


class Policy(abc.ABC):
    name: str

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)

    @abc.abstractmethod
    def choose(self, candidates: "Sequence[RoutableWorker]", request: RoutingRequest) -> RoutableWorker:
        """Pick one of a non-empty list of candidates."""

    def forget(self, worker_id: str) -> None:
        """The worker was removed; drop what was learnt about it."""

    def least_loaded(self, candidates: "Sequence[RoutableWorker]") -> RoutableWorker:
        best = min(w.load_score() for w in candidates)
        return self.rng.choice([w for w in candidates if w.load_score() == best])


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self._counter = itertools.count()

    def choose(self, candidates, request):
        return candidates[next(self._counter) % len(candidates)]


class Random(Policy):
    name = "random"

    def choose(self, candidates, request):
        return self.rng.choice(candidates)


class PowerOfTwo(Policy):
    name = "power_of_two"

    def choose(self, candidates, request):
        if len(candidates) == 1:
            return candidates[0]
        a, b = self.rng.sample(list(candidates), 2)
        return a if a.load_score() <= b.load_score() else b


class LeastLoad(Policy):
    name = "least_load"

    def choose(self, candidates, request):
        return self.least_loaded(candidates)


class ConsistentHashing(Policy):
    """Same routing key, same worker (while it is available); no key: round robin."""

    name = "consistent_hashing"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self._fallback = RoundRobin(config)

    def choose(self, candidates, request):
        if not request.routing_key:
            return self._fallback.choose(candidates, request)
        return _rendezvous(request.routing_key, candidates)


class PrefixHash(Policy):
    """Same first ``prefix_token_count`` tokens, same worker: cheap cache affinity."""

    name = "prefix_hash"

    def choose(self, candidates, request):
        units = request.units()[: self.config.prefix_token_count]
        key = units if isinstance(units, str) else ",".join(map(str, units))
        return _rendezvous(key, candidates)


class Manual(Policy):
    """Sticky sessions: a routing key stays on the worker it was first given."""

    name = "manual"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self._sessions: "collections.OrderedDict[str, str]" = collections.OrderedDict()

    def choose(self, candidates, request):
        key = request.routing_key
        if not key:
            return self.rng.choice(candidates)
        assigned = self._sessions.get(key)
        if assigned is not None:
            for w in candidates:
                if w.id == assigned:
                    self._sessions.move_to_end(key)
                    return w
        chosen = self.least_loaded(candidates)  # new session, or its worker is gone
        self._sessions[key] = chosen.id
        self._sessions.move_to_end(key)
        while len(self._sessions) > self.config.sticky_sessions_max:
            self._sessions.popitem(last=False)
        return chosen

    def forget(self, worker_id):
        for key in [k for k, v in self._sessions.items() if v == worker_id]:
            del self._sessions[key]


class CacheAware(Policy):
    """Route to the engine that already holds the prompt's prefix, balanced against load.

    With KV events for every candidate (``kv_index``), what engines really hold
    decides; otherwise an approximate tree of what this node sent where, which
    records only the requests routed without events.
    """

    name = "cache_aware"

    def __init__(self, config: PolicyConfig, kv_index: KvIndex | None = None) -> None:
        super().__init__(config)
        self.index = ApproxPrefixIndex(config.block_size, config.tree_blocks_max_per_worker)
        self.kv_index = kv_index

    def choose(self, candidates, request):
        c = self.config
        units = request.units()
        kv = self.kv_index
        if kv is not None and not isinstance(units, str):
            if len(candidates) == 1 and not getattr(candidates[0], "kv_events_unsupported", False):
                # No choice, and the engine's events say what it holds whenever there is one (they are
                # followed from when a second engine serves the model): hashing a 7,800-token prompt
                # into the approximate tree would cost ~0.7 ms for nothing.
                return candidates[0]
            if all(kv.block_size(w.id) for w in candidates):
                # What these engines hold is known from their events: the approximate tree is neither
                # read nor kept for them.
                return self._choose_by_events(candidates, units, kv)
        # Text (HTTP workers) gets bigger blocks: ~4 characters per token.
        block_size = c.block_size if not isinstance(units, str) else 4 * c.block_size
        hashes = chained_block_hashes(units, block_size, c.tree_blocks_max_per_worker)
        chosen = self._decide(candidates, hashes)
        if hashes:
            self.index.insert(chosen.id, hashes)
        return chosen

    def _decide(self, candidates: "Sequence[RoutableWorker]", hashes: "list[int]") -> RoutableWorker:
        c = self.config
        if len(candidates) == 1:
            return candidates[0]
        loads = [w.load_score() for w in candidates]
        lo, hi = min(loads), max(loads)
        if hi - lo > c.balance_abs_threshold and hi > c.balance_rel_threshold * lo:
            return self.least_loaded(candidates)
        if hashes:
            matches = [self.index.matched_blocks(w.id, hashes) for w in candidates]
            best = max(matches)
            if best / len(hashes) >= c.cache_threshold:
                tied = [w for w, m in zip(candidates, matches) if m == best]
                return min(tied, key=lambda w: w.load_score())
        # No engine holds enough of it: the one with the most room in its cache.
        smallest = min(self.index.size(w.id) for w in candidates)
        roomy = [w for w in candidates if self.index.size(w.id) == smallest]
        return self.least_loaded(roomy)

    def _choose_by_events(self, candidates: "Sequence[RoutableWorker]", units: "Sequence[int]",
                          kv: KvIndex) -> RoutableWorker:
        c = self.config
        loads = [w.load_score() for w in candidates]
        lo, hi = min(loads), max(loads)
        if hi - lo > c.balance_abs_threshold and hi > c.balance_rel_threshold * lo:
            return self.least_loaded(candidates)
        hashes_by_size: dict[int, list[int]] = {}
        best, best_cost = None, None
        for w, load in zip(candidates, loads):
            size = kv.block_size(w.id)
            hashes = hashes_by_size.get(size)
            if hashes is None:
                hashes = hashes_by_size[size] = prompt_block_hashes(units, size)
            prefill_blocks = len(hashes) - kv.matched_blocks(w.id, hashes)
            cost = c.kv_overlap_weight * prefill_blocks + c.kv_blocks_per_request * load
            if best_cost is None or cost < best_cost:
                best, best_cost = w, cost
        return best

    def forget(self, worker_id):
        self.index.remove_worker(worker_id)


# The policies (--policy, --prefill-policy, --decode-policy), by name: each registered here, beside its class.
POLICIES: Registry[type[Policy]] = Registry("routing policy")
POLICIES.add(CacheAware.name, CacheAware, "the engine already holding the longest prefix of the prompt (from its "
             "KV events, else an approximate tree of what was sent), balanced against load: the default")
POLICIES.add(RoundRobin.name, RoundRobin, "each worker in turn")
POLICIES.add(Random.name, Random, "a worker at random")
POLICIES.add(PowerOfTwo.name, PowerOfTwo, "the less loaded of two workers drawn at random")
POLICIES.add(LeastLoad.name, LeastLoad, "the least loaded worker")
POLICIES.add(ConsistentHashing.name, ConsistentHashing, "the same routing key (`x-smg-routing-key`) to the same "
             "worker while it is available; no key: round robin")
POLICIES.add(PrefixHash.name, PrefixHash, "the same first `--prefix-token-count` tokens to the same worker: "
             "cheap cache affinity")
POLICIES.add(Manual.name, Manual, "sticky sessions: a routing key stays on the worker it was first given")


def make_policy(config: PolicyConfig, kv_index: KvIndex | None = None) -> Policy:
    cls = POLICIES.get(config.name)
    if cls is None:
        raise ValueError(f"unknown policy {config.name!r}; choose one of {POLICIES.choices()}")
    return cls(config, kv_index) if cls is CacheAware else cls(config)


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--policy", "policy.name", str, "routing policy", "routing", choices=POLICIES),
    Option("--cache-threshold", "policy.cache_threshold", float, "cache_aware: prefix match to route by", "routing"),
    Option("--balance-abs-threshold", "policy.balance_abs_threshold", int, "cache_aware: load gap override", "routing"),
    Option("--balance-rel-threshold", "policy.balance_rel_threshold", float, "cache_aware: load ratio override",
           "routing"),
    Option("--prefix-token-count", "policy.prefix_token_count", int, "prefix_hash: tokens that pick the worker",
           "routing"),
)

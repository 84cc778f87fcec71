"""One worker as routing sees it: its client, models, health, circuit, load and in-flight count."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any, Protocol

import trio

from ..engine.grpc_engine import EngineLoad
from ..routing.breaker import CircuitBreaker
from .health import HealthTracker
from .pairing import REGULAR, PairingInfo


class WorkerClient(Protocol):
    """What the registry needs of any worker's client (``GrpcEngineClient``, ``HttpWorkerClient``).

    What a worker can do is said by its client's attributes rather than by comparing kinds:
    ``needs_tokenizer`` (token ids in and out: the gateway tokenizes), ``publishes_kv_events``.
    ``kind`` ("grpc" or "http") only names which API path serves it: token ids or a relay.
    """

    kind: str
    runtime_name: str
    needs_tokenizer: bool
    publishes_kv_events: bool
    architectures: tuple[str, ...]  # the model's classes (Qwen3ForCausalLM), when the engine says

    async def health(self, timeout_s: float) -> bool: ...

    async def loads(self, timeout_s: float) -> EngineLoad | None: ...

    async def aclose(self) -> None: ...


def worker_id_for(url: str) -> str:
    """A stable id from the URL: the same worker has the same id on every node."""
    return "w-" + hashlib.blake2b(url.encode(), digest_size=6).hexdigest()


class Worker:
    def __init__(self, url: str, client: Any, models: "tuple[str, ...]", max_context_tokens: int | None,
                 breaker: CircuitBreaker, labels: dict[str, str], health: HealthTracker, role: str = REGULAR,
                 bootstrap_port: int | None = None, pairing: PairingInfo = PairingInfo()) -> None:
        self.id = worker_id_for(url)
        self.url = url
        self.client = client  # a WorkerClient; Any, so generation can call GrpcEngineClient.generate on it
        self.kind: str = client.kind
        self.runtime: str = client.runtime_name
        self.handover: str = getattr(client, "handover", "")  # a gRPC engine's: how its PD legs meet (engine/runtimes)
        self.models = models
        self.max_context_tokens = max_context_tokens
        self.breaker = breaker
        self.labels = labels
        self.health = health
        # Prefill/decode disaggregation (pairing.py): regular, prefill or decode; a prefill's bootstrap port
        # (SGLang: where its decode fetches the KV); what the engine said pairing depends on.
        self.role = role
        self.bootstrap_port = bootstrap_port
        self.pairing = pairing
        self.draining = False
        self.in_flight = 0
        self.engine_load: EngineLoad | None = None
        self.in_flight_at_poll = 0
        self.registered_at = time.time()
        self.idle = trio.Event()  # set whenever in_flight is 0
        self.idle.set()
        self.cancel_scope: trio.CancelScope | None = None  # the health task
        self.kv_scope: trio.CancelScope | None = None  # the KV event task
        self.checked_by: str | None = None  # the node whose health checks decide (cluster mode)
        self.kv_following = False  # this node subscribes to the engine's KV events
        self.kv_events_unsupported = False  # the engine answered SubscribeKvEvents with UNIMPLEMENTED
        # The ids of the LoRA adapters loaded on the engine, as last known (gateway/adapters: the engine's own list,
        # its answers to loads, the cluster's document); empty for a kind that loads none.
        self.adapters: frozenset[str] = frozenset()

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    def load_score(self) -> int:
        if self.engine_load is None:
            return self.in_flight
        started_since_poll = max(0, self.in_flight - self.in_flight_at_poll)
        return self.engine_load.running + self.engine_load.waiting + started_since_poll

    def set_engine_load(self, load: EngineLoad | None) -> None:
        self.engine_load = load
        self.in_flight_at_poll = self.in_flight

    def begin_request(self) -> None:
        self.in_flight += 1
        if self.idle.is_set():
            self.idle = trio.Event()

    def end_request(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()

    def available(self, now: float) -> bool:
        return self.health.healthy and not self.draining and self.breaker.allows(now)

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id, "url": self.url, "kind": self.kind, "runtime": self.runtime, "models": list(self.models),
            "healthy": self.healthy, "draining": self.draining, "in_flight": self.in_flight,
            "circuit_state": self.breaker.current_state(now).name.lower(),
            "load": dataclasses.asdict(self.engine_load) if self.engine_load else None,
            "labels": self.labels, "max_context_tokens": self.max_context_tokens, "checked_by": self.checked_by,
            "worker_type": self.role, "bootstrap_port": self.bootstrap_port,
            **({"pairing": self.pairing.to_dict()} if self.role != REGULAR else {}),
            **({"adapters": sorted(self.adapters)} if self.adapters else {}),
        }


def load_bucket(worker: Worker) -> str:
    """A coarse load summary for the shared document: it changes rarely, so it costs little history.

    Routing uses each node's own fresh GetLoads polls; this is for people and dashboards.
    """
    load = worker.load_score()
    for bound, label in ((0, "idle"), (4, "light"), (32, "busy")):
        if load <= bound:
            return label
    return "saturated"

"""Everything a request handler may use, built once per node by ``gateway.node.server``."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import time
from typing import TYPE_CHECKING, Any

from ..engine.grpc_engine import SamplingOptions
from ..serving.generation import GenerationResult
from ..serving.chat import SamplingRequest

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..history import HistoryStore
    from ..mcp.sessions import McpSessions
    from ..media.service import MediaService
    from ..observe.metrics import GatewayMetrics
    from ..serving.admission import Admission
    from ..serving.generation import Generator
    from ..serving.models import ModelCatalog
    from ..workers import Router, WorkerRegistry
    from .background import BackgroundRuns
    from ..auth import Authenticator
    from ..auth.key_store import KeyStore
    from ..cluster import ClusterState
    from ..cluster.settings_doc import SettingsDocument
    from ..node.config import GatewayConfig
    from ..ratelimit.limiter import RateLimiter
    from ..cache import ResponseCache
    from ..spend import Spend
    from .proxy import HttpProxy
    from ..tracing import Tracing


RECENT_ERRORS_MAX = 100  # what the console lists; each ~300 bytes (a message is cut at ERROR_MESSAGE_CHARS_MAX)
ERROR_MESSAGE_CHARS_MAX = 200


@dataclasses.dataclass
class NodeStatus:
    """What changes while the node serves (the rest of the request context does not)."""

    shutting_down: bool = False  # readiness fails at once: balancers drain the node
    # Engines of --worker-urls that have not answered since the node started (their models are unknown yet):
    # requests for a model nobody serves answer 503 naming them rather than 404.
    unreachable_engines: set[str] = dataclasses.field(default_factory=set)
    # Where this node serves (http://host:port, once it listens): a worker at that address would be the node itself.
    own_url: str | None = None
    # The last error answers (time, route, status, code, message), newest last: the console shows them.
    recent_errors: "collections.deque[dict[str, Any]]" = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=RECENT_ERRORS_MAX))
    started_at: float = dataclasses.field(default_factory=time.time)


class GatewayState:
    """Everything a request handler may use: the node's config, every subsystem's service by its name
    (``state.generator``, ``state.history``, ``state.media``: gateway/node/subsystems.py lists them), built once
    and frozen, and the node's status (the one thing that changes). The node's own resources are here too
    (``state.metrics``, ``state.cluster``: None without a mesh)."""

    def __init__(self, config: "GatewayConfig", services: "Mapping[str, Any]") -> None:
        set_once = object.__setattr__
        set_once(self, "config", config)
        for name, service in services.items():
            set_once(self, name, service)
        set_once(self, "status", NodeStatus())
        # Engine request ids must be unique per engine; clients' ids need not be.
        set_once(self, "_engine_ids", itertools.count(1))
        set_once(self, "_engine_id_prefix", f"smg-{os.getpid():x}-{os.urandom(3).hex()}-")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the request context is built once: {name} cannot be set (a subsystem's service is "
                             "given what it uses when it starts)")

    if TYPE_CHECKING:  # what the API reads, for readers and type checkers (set from the services above)
        config: "GatewayConfig"
        status: NodeStatus
        registry: WorkerRegistry
        catalog: ModelCatalog
        router: Router
        generator: Generator
        admission: Admission
        metrics: GatewayMetrics
        proxy: "HttpProxy"
        rate_limiter: "RateLimiter"
        spend: "Spend"
        cache: "ResponseCache"
        cluster: "ClusterState | None"
        settings: "SettingsDocument"
        key_store: "KeyStore"
        authenticator: "Authenticator"
        tracing: "Tracing | None"
        history: "HistoryStore | None"
        background: BackgroundRuns
        media: MediaService
        mcp: McpSessions

    def new_engine_request_id(self) -> str:
        return f"{self._engine_id_prefix}{next(self._engine_ids)}"

    @staticmethod
    def engine_sampling(sampling: SamplingRequest, max_tokens: int) -> SamplingOptions:
        return SamplingOptions(
            max_new_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, min_p=sampling.min_p, frequency_penalty=sampling.frequency_penalty,
            presence_penalty=sampling.presence_penalty, repetition_penalty=sampling.repetition_penalty,
            seed=sampling.seed, stop_token_ids=sampling.stop_token_ids, ignore_eos=sampling.ignore_eos,
            min_new_tokens=sampling.min_tokens, constraint=sampling.constraint, logit_bias=sampling.logit_bias,
            logprobs=sampling.logprobs, prompt_logprobs=sampling.prompt_logprobs, n=sampling.n)

    def count_tokens(self, model: str, result: GenerationResult) -> None:
        metrics = self.metrics
        metrics.child(metrics.tokens, model, "prompt").inc(result.prompt_tokens)
        metrics.child(metrics.tokens, model, "completion").inc(result.completion_tokens)
        if result.cached_tokens:
            metrics.child(metrics.tokens, model, "cached").inc(result.cached_tokens)

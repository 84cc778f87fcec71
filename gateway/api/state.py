"""Everything a request handler may use, built once per node by ``gateway.node.server``."""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import TYPE_CHECKING

from ..serving.admission import Admission
from ..engine.grpc_engine import SamplingOptions
from ..serving.generation import GenerationResult, Generator
from ..history import HistoryStore, MemoryHistory
from ..media.config import MediaConfig
from ..mcp.config import McpConfig
from ..mcp.sessions import McpSessions
from ..media.service import MediaService
from ..observe.metrics import GatewayMetrics
from ..serving.models import ModelCatalog
from ..workers import Router, WorkerRegistry
from .background import BackgroundRuns
from .protocol import SamplingRequest

if TYPE_CHECKING:
    from ..auth.key_store import KeyStore
    from ..cluster import ClusterState
    from ..node.config import GatewayConfig
    from ..ratelimit.limiter import RateLimiter
    from .proxy import HttpProxy
    from ..tracing import Tracing


@dataclasses.dataclass
class GatewayState:
    config: "GatewayConfig"
    registry: WorkerRegistry
    catalog: ModelCatalog
    router: Router
    generator: Generator
    admission: Admission
    metrics: GatewayMetrics
    proxy: "HttpProxy"
    shutting_down: bool = False
    rate_limiter: "RateLimiter | None" = None
    cluster: "ClusterState | None" = None
    key_store: "KeyStore | None" = None
    tracing: "Tracing | None" = None  # --enable-trace: every instrumented step reads it (None: off)
    # Stored responses and conversations (gateway/history): the backend --history-backend chose, None
    # with "none". The default here (a lone node's memory) is for states built without a server.
    history: "HistoryStore | None" = dataclasses.field(default_factory=MemoryHistory)
    # Background responses generating on this node (api/background.py): their runs, cancels from any node,
    # their live streams. The default here (no mesh, not served) is for states built without a server.
    background: BackgroundRuns = dataclasses.field(default_factory=lambda: BackgroundRuns(None, False))
    # Images of vision requests: fetched (only where --media-allowed-hosts says), decoded, processed, cached.
    media: MediaService = dataclasses.field(default_factory=lambda: MediaService(MediaConfig()))
    # MCP tools (gateway/mcp): the configured servers, the policy for clients' server URLs, the sessions. The
    # default here (nothing configured, no client URL allowed) is for states built without a server.
    mcp: McpSessions = dataclasses.field(default_factory=lambda: McpSessions(McpConfig()))
    # Engines of --worker-urls that have not answered since the node started (their models are unknown yet):
    # requests for a model nobody serves answer 503 naming them rather than 404.
    unreachable_engines: set[str] = dataclasses.field(default_factory=set)

    def __post_init__(self) -> None:
        # Engine request ids must be unique per engine; clients' ids need not be.
        self._engine_ids = itertools.count(1)
        self._engine_id_prefix = f"smg-{os.getpid():x}-{os.urandom(3).hex()}-"

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

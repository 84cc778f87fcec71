"""The node's configuration: one frozen object, built from flags, environment and a TOML file.

Precedence, highest first: command-line flag, environment variable
(``SMG_NODE_`` + the flag name in upper case with underscores, e.g.
``SMG_NODE_MAX_CONCURRENT_REQUESTS=64``), the ``--config`` TOML file (keys are
flag names with underscores, e.g. ``max_concurrent_requests = 64``), defaults.

Flag names follow smg (and sgl-router) wherever the concept is the same, so
their users need not relearn them. Each subsystem's defaults are explained in
its own config class: ``AdmissionConfig``, ``PolicyConfig``, ``RetryConfig``,
``BreakerConfig``, ``HealthConfig``, ``TokenizerConfig``, ``RateLimitConfig``
(the limits themselves are a ``LimitSet``: see ``gateway/ratelimit/limits.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import ssl
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mesh.admin_token import AdminTokenError, default_token_path, load_or_create_token
from mesh.crypto import KeyringError, decode_key, derive_key
from mesh.options import MeshOptions, is_loopback, parse_tags
from mesh.transport import MeshTls

from .admission import AdmissionConfig
from .auth import AuthConfig, Authenticator
from .auth.authenticator import AuthConfigError
from .disaggregation import PdConfig
from .discovery.config import DiscoveryConfig, parse_selector
from .engine.engine_tls import EngineTlsConfig
from .engine.h2grpc import H2Config
from .history import RECORD_BYTES_MAX, HistoryConfig, PostgresConfig, PostgresNames, RedisConfig
from .parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, HarmonyUnavailable, harmony_encoding, is_harmony
from .ratelimit.limiter import RateLimitConfig
from .ratelimit.limits import FailurePolicy, LimitConfigError, LimitSet, parse_limit_set
from .routing.breaker import BreakerConfig
from .routing.policies import POLICIES, PolicyConfig
from .routing.retry import RetryConfig
from .tls import ServerTls, TlsConfig
from .tokenizer.service import TokenizerConfig
from .tracing import TracingConfig
from .workers import HealthConfig, WorkerAllowlist, WorkerUrlError, parse_worker_origin

ENV_PREFIX = "SMG_NODE_"


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    worker_urls: tuple[str, ...] = ()
    # The key --worker-urls' OpenAI-compatible HTTP workers expect (sent as a bearer token).
    worker_api_key: str | None = None
    # Client text spelling a special token (<|im_start|>...) is tokenized as plain text unless this is set
    # (gateway/tokenizer/literal_spans.py); admin callers may ask for it per request instead.
    allow_special_tokens_in_content: bool = False
    # Hosts (names, or networks such as 10.0.0.0/8) workers may be registered at; empty: any.
    worker_allowed_hosts: tuple[str, ...] = ()
    # Overrides the model name the engines report (smg: --model-path).
    model_path: str | None = None
    tokenizer_path: Path | None = None
    chat_template: Path | None = None
    # A separate listener for /metrics; None serves it on the main port only.
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int | None = None
    log_level: str = "info"
    log_json: bool = False
    # max_tokens when neither the request nor the engine's context bounds it.
    default_max_tokens: int = 4096
    # An answer held whole before it is sent (not streamed, or a Responses API answer kept to be stored) is
    # stopped past this many bytes of JSON (gateway.generation.LOGPROB_ENTRY_BYTES says how it is estimated):
    # 32 MiB of JSON is ~200 MiB of Python objects at its peak and ~0.5 s of the event loop to shape and
    # encode. Streams hold nothing: they are not bounded by it. An answer asked for outright beyond it is
    # refused before it runs.
    answer_bytes_max: int = 32 * 1024 * 1024
    # Header carrying the routing key of consistent_hashing and manual (sticky) routing.
    routing_key_header: str = "x-smg-routing-key"
    # SIGTERM: stop being ready, finish in-flight requests for up to this long, exit.
    shutdown_grace_period_s: float = 180.0
    # Demo mode: start this many simulated engines as child processes and use them.
    sim_engines: int = 0
    # Follow every gRPC engine's SubscribeKvEvents into the KV index cache_aware routes by.
    kv_events: bool = True
    kv_index_blocks_max: int = 4_000_000
    # Follow an engine's KV events even while no other engine serves its models. Off: routing has no
    # choice then, and following costs ~3 ms of CPU per 7,800-token prompt; the index catches up
    # (replay or snapshot) when a second engine joins. On: the status and smg_kv_index_blocks always
    # show what each engine holds. Must be the same on every member.
    kv_events_always: bool = False
    # Members that follow each engine's KV event stream (its first ring owners); the others receive the
    # resolved batches from them (gateway/cluster/kv_sharing.py). 2: when a follower dies the other still
    # publishes while the ring moves. Must be the same on every member. A node's private mesh of
    # --workers processes uses 1: its processes start and stop with one supervisor, and a second
    # follower would decode and index every batch twice and send the other a copy it drops.
    kv_event_followers: int = 2
    sim_engine_args: tuple[str, ...] = ()
    policy: PolicyConfig = PolicyConfig()
    admission: AdmissionConfig = AdmissionConfig()
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig = BreakerConfig()
    health: HealthConfig = HealthConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    mesh: MeshOptions = MeshOptions()
    # Rate limits: a TOML file of [[limits]] (gateway/ratelimit/limits.py), plus the shortcut
    # --global-rate-limit N (requests per second for the whole cluster) and a policy override.
    rate_limits_file: Path | None = None
    global_rate_limit: float | None = None
    rate_limit_policy: str | None = None
    rate_limit: RateLimitConfig = RateLimitConfig()
    # API keys, roles, the admin credential and the audit log (gateway/auth/authenticator.py).
    auth: AuthConfig = AuthConfig()
    # TLS for clients (gateway/tls.py): off unless a certificate is given.
    tls: TlsConfig = TlsConfig()
    # TLS to engines (grpcs://, https://): the CA to trust and our client certificate (engine_tls.py).
    engine_tls: EngineTlsConfig = EngineTlsConfig()
    # The HTTP/2 gRPC client's windows, timeouts and keepalive (gateway/engine/h2grpc.py H2Config).
    engine_h2: H2Config = H2Config()
    # Parsers of chat answers for every model (gateway/parsers/); None: chosen by each model's id
    # (gateway/parsers/choice.py), "none" or "passthrough": off.
    tool_call_parser: str | None = None
    # Where the Responses and Conversations APIs keep what they store (gateway/history): "memory"
    # (bounded by ``history``, each record on three nodes of the mesh) or "none" (nothing stored;
    # previous_response_id and conversations refused).
    history_backend: str = "memory"
    history: HistoryConfig = HistoryConfig()
    tracing: TracingConfig = TracingConfig()  # --enable-trace (gateway/tracing)
    pd: PdConfig = PdConfig()  # --pd-disaggregation: prefill/decode pairs (gateway/disaggregation.py)
    discovery: DiscoveryConfig = DiscoveryConfig()  # --service-discovery: engines as Kubernetes pods (gateway/discovery)
    postgres: PostgresConfig = PostgresConfig()  # --history-backend postgres
    redis: RedisConfig = RedisConfig()  # --history-backend redis
    reasoning_parser: str | None = None
    # "native": the gateway's own HTTP/1.1 server (gateway/http1/server.py, ~20x less CPU per request
    # than hypercorn on trio, BENCHMARKS.md); "hypercorn": hypercorn's, which also speaks HTTP/2.
    http_server: str = "native"
    # "h2": gRPC to engines over HTTP/2 from the event loop with our own framing
    # (gateway/engine/h2grpc.py, several times less CPU per call); "grpcio": through grpcio's asyncio
    # API on a thread of its own (engine/bridge.py).
    grpc_client: str = "h2"
    # Gateway processes serving the HTTP port (SO_REUSEPORT; gateway/supervisor.py says how they share
    # the node's state); 0 = one per core this process may use (CPU affinity and cgroup quota).
    workers: int = 0
    # Bind the HTTP port with SO_REUSEPORT (set for each process of --workers N).
    http_reuse_port: bool = False
    # Client connections one gateway process serves at once; past it a new one gets a 503 at once
    # (gateway/http1/server.py H1Config says why 8,192).
    max_connections: int = 8192
    # Which process of --workers N this is (0 for a single process); offsets its own ports.
    worker_index: int = 0

    def limit_set(self) -> LimitSet:
        """The limits this node starts with (ConfigError when the file or flags are wrong)."""
        limits = LimitSet()
        if self.rate_limits_file is not None:
            try:
                with open(self.rate_limits_file, "rb") as f:
                    limits = parse_limit_set(tomllib.load(f))
            except (OSError, tomllib.TOMLDecodeError, LimitConfigError) as e:
                raise ConfigError(f"--rate-limits {self.rate_limits_file}: {e}") from None
        if self.global_rate_limit is not None:
            if not self.global_rate_limit > 0:
                raise ConfigError("--global-rate-limit must be a positive number of requests per second")
            limits = limits.with_global_limit(self.global_rate_limit)
        if self.rate_limit_policy is not None:
            try:
                limits = dataclasses.replace(limits, failure_policy=FailurePolicy(self.rate_limit_policy))
            except ValueError:
                raise ConfigError("--rate-limit-policy must be proportional, open or closed") from None
        return limits


@dataclasses.dataclass(frozen=True)
class _Option:
    flag: str
    path: str  # "field" or "section.field" of GatewayConfig
    kind: Callable[[str], Any] | str  # a converter, or "bool" / "list" / "disable"
    help: str


def _secs_ms(value: str) -> float:
    return float(value) / 1000.0


_OPTIONS: list[_Option] = [
    _Option("--host", "host", str, "address to serve HTTP on"),
    _Option("--port", "port", int, "HTTP port"),
    _Option("--worker-urls", "worker_urls", "list", "engines: grpc://host:port (SGLang/vLLM gRPC) or "
                                                      "http://host:port (OpenAI-compatible, proxied as is)"),
    _Option("--allow-special-tokens-in-content", "allow_special_tokens_in_content", "bool", "tokenize special "
            "tokens spelled in messages as control tokens (default: as plain text, so no client forges a turn)"),
    _Option("--tls-cert-path", "tls.cert_path", Path, "serve HTTPS with this certificate chain (PEM); reloaded "
            "when the file changes"),
    _Option("--tls-key-path", "tls.key_path", Path, "the certificate's private key (PEM)"),
    _Option("--tls-client-ca-path", "tls.client_ca_path", Path, "require client certificates signed by this CA "
            "(mutual TLS)"),
    _Option("--tls-reload-interval-secs", "tls.reload_interval_s", float, "how often the certificate files are "
            "checked for a renewal (default 10)"),
    _Option("--engine-tls-ca-path", "engine_tls.ca_path", Path, "CA that signs grpcs:// and https:// workers' "
            "certificates (default: the system's)"),
    _Option("--engine-tls-cert-path", "engine_tls.cert_path", Path, "client certificate presented to engines "
            "(mutual TLS)"),
    _Option("--engine-tls-key-path", "engine_tls.key_path", Path, "its private key"),
    _Option("--engine-keepalive-interval-secs", "engine_h2.keepalive_interval_s", float, "PING an engine "
            "connection with open calls after this long without a byte from it; 0 turns keepalive off"),
    _Option("--engine-keepalive-timeout-secs", "engine_h2.keepalive_timeout_s", float, "drop the connection "
            "(its calls fail as retryable) when nothing answers the PING within this"),
    _Option("--tool-call-parser", "tool_call_parser", str, "tool-call format of the models' answers (qwen, "
            "qwen_coder, llama, pythonic, mistral, deepseek, deepseek31, deepseek32, kimik2, glm45_moe, glm47_moe, "
            "minimax_m2, step3, cohere, gpt_oss, json; vLLM's and SGLang's names too; none or passthrough: off); "
            "default: chosen by the model's id, else its architecture"),
    _Option("--reasoning-parser", "reasoning_parser", str, "reasoning format (qwen3, qwen3_thinking, deepseek_r1, "
            "deepseek_v31, glm45, kimi, minimax, step3, nano_v3, cohere_cmd, gpt_oss; none or passthrough: off); "
            "default: chosen by the model's id, else its architecture"),
    _Option("--worker-api-key", "worker_api_key", str, "the key of the HTTP workers in --worker-urls (clients' "
            "keys are never forwarded)"),
    _Option("--worker-allowed-hosts", "worker_allowed_hosts", "list", "hosts (names or networks like "
            "10.0.0.0/8) where workers may be registered; default: any"),
    _Option("--policy", "policy.name", str, f"routing policy: {', '.join(sorted(POLICIES))}"),
    _Option("--model-path", "model_path", str, "model name to serve (default: what the engines report)"),
    _Option("--tokenizer-path", "tokenizer_path", Path, "directory with tokenizer.json (default: fetched from "
                                                        "the engine with GetTokenizer)"),
    _Option("--chat-template", "chat_template", Path, "Jinja chat template file overriding the tokenizer's"),
    _Option("--prometheus-host", "prometheus_host", str, "address of the separate /metrics listener"),
    _Option("--prometheus-port", "prometheus_port", int, "port of a separate /metrics listener"),
    _Option("--max-concurrent-requests", "admission.max_concurrent_requests", int,
            "generations running at once; 0 = unlimited"),
    _Option("--queue-size", "admission.queue_size", int, "requests waiting for a slot before 429"),
    _Option("--max-concurrent-requests-per-tenant", "admission.tenant_max_concurrent", int, "generations one "
            "tenant (else key) may run at once per process (default: half of --max-concurrent-requests); also its "
            "background responses in progress"),
    _Option("--queue-size-per-tenant", "admission.tenant_queue_max", int, "requests of one tenant that may wait "
            "for a slot (default: half of --queue-size)"),
    _Option("--queue-timeout-secs", "admission.queue_timeout_s", float, "longest wait for a slot before 503"),
    _Option("--request-timeout-secs", "admission.request_timeout_s", float, "longest a request may take"),
    _Option("--max-payload-size", "admission.body_bytes_max", int, "largest request body in bytes (default: 32 "
            "bytes per token of the largest context served, at least 1 MiB; 8 MiB without a stated context)"),
    _Option("--history-backend", "history_backend", str, "where stored responses and conversations live: memory "
            "(replicated on three nodes of the mesh), postgres, redis or none"),
    _Option("--history-memory-max-responses", "history.max_responses", int, "stored responses kept in memory "
            "per node (least recently used out first)"),
    _Option("--history-memory-max-items", "history.max_items", int, "conversation items kept in memory per node"),
    _Option("--history-memory-retention-secs", "history.retention_s", float, "how long a stored response or "
            "conversation is kept after its last write"),
    _Option("--history-memory-max-bytes", "history.max_bytes", int, "bytes of stored responses and conversations "
            "kept in memory per node (default 256 MiB)"),
    _Option("--history-tenant-max-bytes", "history.tenant_max_bytes", int, "bytes one tenant (else key) may hold "
            "per node in the memory store, beyond which its writes get 429 (default: a quarter of the node's)"),
    _Option("--history-tenant-max-responses", "history.tenant_max_responses", int, "stored responses one tenant "
            "may hold per node (default: a quarter of --history-memory-max-responses)"),
    _Option("--history-tenant-max-conversations", "history.tenant_max_conversations", int, "conversations one "
            "tenant may hold per node (default: a quarter of --history-memory-max-responses)"),
    _Option("--history-tenant-max-items", "history.tenant_max_items", int, "conversation items one tenant may "
            "hold per node (default: a quarter of --history-memory-max-items)"),
    _Option("--history-record-max-bytes", "history.record_bytes_max", int, "largest stored response, and "
            "largest conversation with its items, in bytes (default 4 MiB, at most 6 MiB): larger ones get 413"),
    _Option("--postgres-db-url", "postgres.url", str, "postgres://user:password@host:port/db?sslmode=... (or "
            "SMG_POSTGRES_DB_URL, kept out of the process list)"),
    _Option("--postgres-pool-max-size", "postgres.pool_max_size", int, "connections to PostgreSQL"),
    _Option("--postgres-names", "postgres.names", "list", "table and column names, NAME=VALUE (responses, "
            "conversations, items, migrations, id, owner, body, created_at, conversation_id, item_id, position)"),
    _Option("--redis-url", "redis.url", str, "redis://[:password@]host:port/db, rediss:// for TLS (or "
            "SMG_REDIS_URL)"),
    _Option("--redis-pool-max-size", "redis.pool_max_size", int, "connections to Redis"),
    _Option("--redis-retention-days", "redis.retention_days", float, "how long Redis keeps a record after its "
            "last write; -1: forever"),
    _Option("--redis-key-prefix", "redis.key_prefix", str, "prefix of every key written to Redis"),
    _Option("--pd-disaggregation", "pd.enabled", "bool", "serve models on prefill/decode pairs of engines (SGLang: "
            "both at once with one bootstrap room; vLLM: prefill, then decode with its kv_transfer_params)"),
    _Option("--prefill", "pd.prefill", "prefill", "a prefill engine: URL [BOOTSTRAP_PORT] (repeat the flag for more; "
            "the bootstrap port defaults to 8998)"),
    _Option("--decode", "pd.decode", "append", "a decode engine: URL (repeat the flag for more)"),
    _Option("--prefill-policy", "pd.prefill_policy", str, "routing policy among prefill workers (default: --policy; "
            "cache_aware reads the KV index of the prefill engines)"),
    _Option("--decode-policy", "pd.decode_policy", str, "routing policy among decode workers (default: --policy)"),
    _Option("--pd-bootstrap-timeout-secs", "pd.bootstrap_timeout_s", float, "longest wait for a KV hand-over: from "
            "dispatch to the decode's first token, past which the attempt fails and is retried on another pair"),
    _Option("--service-discovery", "discovery.enabled", "bool", "find engines as Kubernetes pods by label: added "
            "once Ready with an IP, drained when they go (credentials: the pod's service account, else KUBECONFIG or "
            "~/.kube/config)"),
    _Option("--selector", "discovery.selector", "selector", "labels of the engines' pods: KEY=VALUE ... (Kubernetes' "
            "selectors: also KEY!=VALUE, 'KEY in (A,B)', 'KEY notin (A,B)', KEY, !KEY)"),
    _Option("--prefill-selector", "discovery.prefill_selector", "selector", "labels of prefill engines' pods (with "
            "--pd-disaggregation; bootstrap port from the sglang.ai/bootstrap-port annotation)"),
    _Option("--decode-selector", "discovery.decode_selector", "selector", "labels of decode engines' pods"),
    _Option("--router-selector", "discovery.router_selector", "selector", "labels of smg-node's own pods: the "
            "mesh joins them (port from the sglang.ai/mesh-port annotation, else this node's), no seed list needed"),
    _Option("--service-discovery-namespace", "discovery.namespace", str, "namespace to watch (default: every "
            "namespace, which needs a ClusterRole)"),
    _Option("--service-discovery-port", "discovery.port", int, "the engines' port on their pod IP (default 80)"),
    _Option("--service-discovery-protocol", "discovery.protocol", str, "grpc (default: token ids over gRPC) or "
            "http (OpenAI-compatible engines, proxied)"),
    _Option("--service-discovery-model-label", "discovery.model_label", str, "label (or annotation) naming a "
            "pod's model (default smg.ai/model); without it the engine says (GetModelInfo)"),
    _Option("--enable-trace", "tracing.enabled", "bool", "export traces of requests over OTLP (OpenTelemetry)"),
    _Option("--otlp-traces-endpoint", "tracing.endpoint", str, "where traces go: host:port is OTLP/gRPC "
            "(default localhost:4317), an http(s):// URL is OTLP/HTTP protobuf, posted to it as given"),
    _Option("--trace-sample-ratio", "tracing.sample_ratio", float, "share of the traces that start here to "
            "keep, 0 to 1 (a client's sampled traceparent is always followed)"),
    _Option("--trace-export-timeout-secs", "tracing.export_timeout_s", float, "one export to the collector, its "
            "retries included; spans that cannot wait are dropped and counted"),
    _Option("--log-level", "log_level", str, "debug, info, warning, error"),
    _Option("--log-json", "log_json", "bool", "log JSON lines instead of text"),
    _Option("--default-max-tokens", "default_max_tokens", int, "max_tokens when nothing else bounds it"),
    _Option("--max-answer-bytes", "answer_bytes_max", int, "largest answer held whole before it is sent (not "
            "streamed), estimated as its JSON: beyond it 400 answer_too_large (default 32 MiB); streams hold none"),
    _Option("--routing-key-header", "routing_key_header", str, "header with the routing key"),
    _Option("--shutdown-grace-period-secs", "shutdown_grace_period_s", float, "drain time on SIGTERM"),
    _Option("--cache-threshold", "policy.cache_threshold", float, "cache_aware: prefix match to route by"),
    _Option("--balance-abs-threshold", "policy.balance_abs_threshold", int, "cache_aware: load gap override"),
    _Option("--balance-rel-threshold", "policy.balance_rel_threshold", float, "cache_aware: load ratio override"),
    _Option("--prefix-token-count", "policy.prefix_token_count", int, "prefix_hash: tokens that pick the worker"),
    _Option("--cb-failure-threshold", "breaker.failure_threshold", int, "failures that open a circuit"),
    _Option("--cb-success-threshold", "breaker.success_threshold", int, "half-open successes that close it"),
    _Option("--cb-timeout-duration-secs", "breaker.open_duration_s", float, "open time before half-open"),
    _Option("--cb-window-duration-secs", "breaker.window_s", float, "window in which failures count"),
    _Option("--disable-circuit-breaker", "breaker.enabled", "disable", "no circuit breaking"),
    _Option("--retry-max-retries", "retry.max_retries", int, "retries of a failed attempt"),
    _Option("--retry-initial-backoff-ms", "retry.initial_backoff_s", _secs_ms, "first backoff"),
    _Option("--retry-max-backoff-ms", "retry.max_backoff_s", _secs_ms, "longest backoff"),
    _Option("--retry-backoff-multiplier", "retry.multiplier", float, "backoff growth per retry"),
    _Option("--retry-jitter-factor", "retry.jitter_factor", float, "random +- share of each backoff"),
    _Option("--disable-retries", "retry.enabled", "disable", "no retries"),
    _Option("--health-failure-threshold", "health.failure_threshold", int, "failed checks to mark unhealthy"),
    _Option("--health-success-threshold", "health.success_threshold", int, "good checks to mark healthy"),
    _Option("--health-check-timeout-secs", "health.timeout_s", float, "timeout of one check"),
    _Option("--health-check-interval-secs", "health.interval_s", float, "time between checks"),
    _Option("--health-check-endpoint", "health.endpoint", str, "health path of HTTP workers"),
    _Option("--disable-health-check", "health.enabled", "disable", "no background health checks"),
    _Option("--disable-kv-events", "kv_events", "disable", "do not follow the engines' KV events"),
    _Option("--kv-events-always", "kv_events_always", "bool", "follow an engine's KV events even when no "
                                                              "other engine serves its models"),
    _Option("--kv-index-blocks-max", "kv_index_blocks_max", int, "KV index size in blocks (LRU beyond)"),
    _Option("--kv-event-followers", "kv_event_followers", int, "members following each engine's KV events "
                                                                 "(same on every member; others receive them)"),
    _Option("--disable-fast-tokenizer", "tokenizer.fast_bpe", "disable", "always encode with tokenizers, even "
                                                                         "where tiktoken's BPE is identical"),
    _Option("--disable-fast-detokenizer", "tokenizer.fast_decode", "disable", "always detokenize with "
            "tokenizers' DecodeStream, even where the byte table decodes identically"),
    _Option("--disable-fast-chat-template", "tokenizer.fast_chat_template", "disable", "always render chat "
            "templates with Jinja2, even where MiniJinja renders them identically"),
    _Option("--encode-threads", "tokenizer.encode_threads", int, "threads encoding long texts, each with "
            "its own ~56 MB encoder (0: one per core, divided among the --workers processes)"),
    _Option("--chat-template-fuel", "tokenizer.chat_template_fuel", int, "instructions one MiniJinja render "
            "may run before the request fails (default 10,000,000)"),
    _Option("--tokenizer-cache-l0-entries", "tokenizer.l0_entries_max", int,
            "exact-text cache (L0, texts L1 cannot hold): entries; 0 turns it off"),
    _Option("--tokenizer-cache-l0-bytes", "tokenizer.l0_bytes_max", int, "exact-text cache (L0): size in bytes"),
    _Option("--tokenizer-cache-l1-bytes", "tokenizer.l1_bytes_max", int,
            "prefix cache (L1, prefixes ending at a special token): size in bytes; 0 turns it off"),
    _Option("--rate-limits", "rate_limits_file", Path, "TOML file of rate limits ([[limits]]; see README)"),
    _Option("--global-rate-limit", "global_rate_limit", float, "requests per second for the whole cluster"),
    _Option("--rate-limit-policy", "rate_limit_policy", str, "when a key's owner is unreachable: proportional "
                                                             "(default), open or closed"),
    _Option("--rate-limit-batch-wait-ms", "rate_limit.batch_wait_s", _secs_ms, "extra wait to coalesce "
                                                                               "forwarded decisions (default 0)"),
    _Option("--rate-limit-batch-max", "rate_limit.batch_items_max", int, "decisions per forwarded batch"),
    _Option("--rate-limit-sync-interval-ms", "rate_limit.sync_interval_s", _secs_ms, "replication round"),
    _Option("--rate-limit-forward-timeout-ms", "rate_limit.forward_timeout_s", _secs_ms,
            "owner silence before the failure policy decides"),
    _Option("--max-connections", "max_connections", int, "client connections served at once per process; more "
            "are answered 503 at once (default 8192)"),
    _Option("--http-server", "http_server", str, "native (default, HTTP/1.1) or hypercorn (HTTP/1.1 and h2)"),
    _Option("--grpc-client", "grpc_client", str, "h2 (default: from the event loop) or grpcio (on a thread)"),
    _Option("--workers", "workers", int, "gateway processes on the HTTP port (0: one per available core)"),
    _Option("--worker-index", "worker_index", int, "which process of --workers N this is (set by the node)"),
    _Option("--http-reuse-port", "http_reuse_port", "bool", "bind the HTTP port with SO_REUSEPORT (--workers)"),
    _Option("--admin-token", "auth.admin_token", str, "the node's admin credential (role admin; default: read "
            "from, or made into, --admin-token-file)"),
    _Option("--admin-token-file", "auth.admin_token_file", Path, "file holding the admin token when none is "
            "given (default ~/.local/state/smg-node/admin-token, mode 0600; the CLI reads it)"),
    _Option("--api-key", "auth.api_key", str, "one shared key for inference (role user); with any user key "
                                                "set, inference needs a key"),
    _Option("--tenant-api-key", "auth.tenant_api_keys", "list", "TENANT:KEY, a user key of that tenant "
                                                                  "(repeatable)"),
    _Option("--control-plane-api-keys", "auth.control_plane_api_keys", "list", "ID:NAME:ROLE:KEY keys, role "
            "admin (control plane and inference) or user (inference)"),
    _Option("--jwt-issuer", "jwt.issuer", str, "accept JWTs from this OIDC issuer (its keys from "
            "/.well-known/openid-configuration unless --jwt-jwks-uri)"),
    _Option("--jwt-audience", "jwt.audience", str, "the audience JWTs must name"),
    _Option("--jwt-jwks-uri", "jwt.jwks_uri", str, "where the issuer's keys are (default: discovered)"),
    _Option("--jwt-role-mapping", "jwt.role_mapping", "list", "IDP_ROLE=GATEWAY_ROLE (admin or user) pairs "
                                                              "for the roles claim; unmapped tokens are user"),
    _Option("--jwt-tenant-claim", "jwt.tenant_claim", str, "the claim naming the tenant (default tenant)"),
    _Option("--jwt-role-claim", "jwt.role_claim", str, "the claim listing roles (default roles)"),
    _Option("--jwt-keys-refresh-min-secs", "jwt.refresh_interval_min_s", float, "least time between two fetches "
            "of the issuer's keys for unknown kids (default 10)"),
    _Option("--control-plane-audit-enabled", "auth.audit", "bool", "log every control-plane change as a JSON "
                                                                     "line (logger gateway.audit)"),
    _Option("--tenant-header", "rate_limit.tenant_header", str, "header naming the tenant (rate limits)"),
    _Option("--sim-engines", "sim_engines", int, "demo: start this many simulated engines and use them"),
    _Option("--mesh-bind", "mesh.bind", str, "gossip (UDP) and push-pull (TCP) address, e.g. 0.0.0.0:7946"),
    _Option("--mesh-advertise", "mesh.advertise", str, "address other members reach this one at"),
    _Option("--join", "mesh.join", "list", "seeds host:port or dns:NAME:PORT, retried until one answers"),
    _Option("--retry-join", "mesh.retry_join_max", int, "join rounds before giving up (0: forever)"),
    _Option("--retry-join-interval-secs", "mesh.retry_join_interval_s", float, "first wait between join rounds"),
    _Option("--node-name", "mesh.node_name", str, "this member's name (default: host-port)"),
    _Option("--encrypt", "mesh.keys", "list", "gossip keys (base64 AES-256, first encrypts)"),
    _Option("--tag", "mesh.tags", "list", "member tags key=value (zone, role...)"),
    _Option("--mesh-preset", "mesh.preset", str, "protocol timers: lan (default) or local (one machine)"),
    _Option("--rpc-addr", "mesh.rpc_addr", str, "admin endpoint for the CLI (default 127.0.0.1:7373 with "
            "--mesh-bind, else a free port: the node records it for the CLI, one record per node)"),
    _Option("--rpc-token", "mesh.rpc_token", str, "bearer token the admin endpoint requires (default: the "
                                                    "admin token)"),
    _Option("--mesh-tls-ca-cert", "mesh.tls_ca_cert", str, "mutual TLS between members' streams: the CA"),
    _Option("--mesh-tls-cert", "mesh.tls_cert", str, "this member's certificate (signed by the mesh CA)"),
    _Option("--mesh-tls-key", "mesh.tls_key", str, "its private key"),
    _Option("--mesh-insecure", "mesh.insecure", "bool", "run the mesh in the clear (anyone who can send it a "
            "packet can read and change the cluster). Without it and without --encrypt, the gossip key is derived "
            "from the admin token; off loopback --encrypt is required"),
    # smg's mesh flags, accepted so its users can switch.
    _Option("--enable-mesh", "_enable_mesh", "bool", "smg alias: run the mesh (on 0.0.0.0:7946 by default)"),
    _Option("--mesh-host", "_mesh_host", str, "smg alias: host part of --mesh-bind"),
    _Option("--mesh-port", "_mesh_port", int, "smg alias: port part of --mesh-bind"),
    _Option("--mesh-advertise-host", "_mesh_advertise_host", str, "smg alias: host part of --mesh-advertise"),
    _Option("--mesh-peer-urls", "mesh.join", "list", "smg alias of --join"),
    _Option("--sim-engine-args", "sim_engine_args", "list", "extra flags for the simulated engines"),
]


# How ``serve --help`` presents the options: sections in this order, each flag in exactly one
# (tests/unit/test_cli.py checks), except those only the node sets for itself.
HELP_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("HTTP: the OpenAI-compatible front", (
        "--host", "--port", "--max-connections", "--max-payload-size", "--request-timeout-secs",
        "--default-max-tokens", "--max-answer-bytes", "--shutdown-grace-period-secs", "--http-server", "--prometheus-host",
        "--prometheus-port", "--history-backend", "--history-memory-max-responses", "--history-memory-max-items",
        "--history-memory-retention-secs", "--history-memory-max-bytes", "--history-tenant-max-bytes",
        "--history-tenant-max-responses", "--history-tenant-max-conversations", "--history-tenant-max-items",
        "--history-record-max-bytes", "--postgres-db-url", "--postgres-pool-max-size", "--postgres-names",
        "--redis-url", "--redis-pool-max-size", "--redis-retention-days", "--redis-key-prefix",
        "--log-level", "--log-json")),
    ("disaggregation: prefill and decode on separate engines", (
        "--pd-disaggregation", "--prefill", "--decode", "--prefill-policy", "--decode-policy",
        "--pd-bootstrap-timeout-secs")),
    ("discovery: engines and nodes found as Kubernetes pods", (
        "--service-discovery", "--selector", "--prefill-selector", "--decode-selector", "--router-selector",
        "--service-discovery-namespace", "--service-discovery-port", "--service-discovery-protocol",
        "--service-discovery-model-label")),
    ("tracing: OpenTelemetry over OTLP", (
        "--enable-trace", "--otlp-traces-endpoint", "--trace-sample-ratio", "--trace-export-timeout-secs")),
    ("engines: where generations run", (
        "--worker-urls", "--model-path", "--tokenizer-path", "--chat-template", "--worker-api-key",
        "--engine-tls-ca-path", "--engine-tls-cert-path", "--engine-tls-key-path", "--engine-keepalive-interval-secs",
        "--engine-keepalive-timeout-secs", "--tool-call-parser", "--reasoning-parser", "--health-failure-threshold",
        "--health-success-threshold", "--health-check-timeout-secs", "--health-check-interval-secs",
        "--health-check-endpoint", "--disable-health-check", "--sim-engines", "--sim-engine-args")),
    ("routing: which engine takes a request, admission, retries, circuits", (
        "--policy", "--cache-threshold", "--balance-abs-threshold", "--balance-rel-threshold",
        "--prefix-token-count", "--routing-key-header", "--disable-kv-events", "--kv-events-always",
        "--kv-index-blocks-max", "--kv-event-followers", "--max-concurrent-requests", "--queue-size",
        "--max-concurrent-requests-per-tenant", "--queue-size-per-tenant",
        "--queue-timeout-secs", "--retry-max-retries", "--retry-initial-backoff-ms", "--retry-max-backoff-ms",
        "--retry-backoff-multiplier", "--retry-jitter-factor", "--disable-retries", "--cb-failure-threshold",
        "--cb-success-threshold", "--cb-timeout-duration-secs", "--cb-window-duration-secs",
        "--disable-circuit-breaker")),
    ("cluster: the mesh of nodes", (
        "--mesh-bind", "--mesh-advertise", "--join", "--retry-join", "--retry-join-interval-secs", "--node-name",
        "--encrypt", "--tag", "--mesh-preset", "--rpc-addr", "--rpc-token", "--mesh-tls-ca-cert", "--mesh-tls-cert",
        "--mesh-tls-key", "--mesh-insecure", "--enable-mesh", "--mesh-host", "--mesh-port", "--mesh-advertise-host",
        "--mesh-peer-urls")),
    ("rate limits: cluster-wide, per key, tenant or model", (
        "--rate-limits", "--global-rate-limit", "--rate-limit-policy", "--tenant-header", "--rate-limit-batch-wait-ms",
        "--rate-limit-batch-max", "--rate-limit-sync-interval-ms", "--rate-limit-forward-timeout-ms")),
    ("security: credentials, TLS, what clients may send", (
        "--api-key", "--tenant-api-key", "--control-plane-api-keys", "--admin-token", "--admin-token-file",
        "--jwt-issuer", "--jwt-audience", "--jwt-jwks-uri", "--jwt-role-mapping", "--jwt-tenant-claim",
        "--jwt-role-claim", "--jwt-keys-refresh-min-secs", "--control-plane-audit-enabled", "--tls-cert-path",
        "--tls-key-path", "--tls-client-ca-path", "--tls-reload-interval-secs", "--worker-allowed-hosts",
        "--allow-special-tokens-in-content")),
    ("performance: processes, threads, caches, fast paths", (
        "--workers", "--grpc-client", "--encode-threads", "--disable-fast-tokenizer", "--disable-fast-detokenizer",
        "--disable-fast-chat-template", "--chat-template-fuel", "--tokenizer-cache-l0-entries",
        "--tokenizer-cache-l0-bytes", "--tokenizer-cache-l1-bytes")),
)
# Set by the node for the processes of --workers N, not by people.
INTERNAL_FLAGS = frozenset({"--worker-index", "--http-reuse-port"})


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    by_flag = {opt.flag: opt for opt in _OPTIONS}
    parser.add_argument("--config", type=Path, default=None, help="TOML file with the same options (keys: flag "
                        "names with underscores)")
    for title, flags in HELP_SECTIONS:
        group = parser.add_argument_group(title)
        for flag in flags:
            _add_option(group, by_flag[flag], _help_with_default(by_flag[flag]))
    for flag in sorted(INTERNAL_FLAGS):
        _add_option(parser, by_flag[flag], argparse.SUPPRESS)


def _add_option(parser: Any, opt: _Option, help_text: str) -> None:
    dest = opt.flag[2:].replace("-", "_")
    if opt.kind in ("bool", "disable"):
        parser.add_argument(opt.flag, dest=dest, action="store_const", const=True, default=None, help=help_text)
    elif opt.kind in ("list", "selector"):
        parser.add_argument(opt.flag, dest=dest, nargs="+", default=None, help=help_text)
    elif opt.kind == "prefill":
        parser.add_argument(opt.flag, dest=dest, nargs="+", action="append", default=None,
                            metavar=("URL", "BOOTSTRAP_PORT"), help=help_text)
    elif opt.kind == "append":
        parser.add_argument(opt.flag, dest=dest, nargs="+", action="append", default=None, metavar="URL",
                            help=help_text)
    else:
        parser.add_argument(opt.flag, dest=dest, default=None, help=help_text)


def _help_with_default(opt: _Option) -> str:
    """The option's help with its default, read from the config classes (the one source of defaults).

    Switches (on or off) and options whose absence means "none" say so in their help instead.
    """
    if opt.kind in ("bool", "disable") or "default" in opt.help:
        return opt.help
    value: Any = GatewayConfig()
    for part in opt.path.split("."):
        value = getattr(value, part, None)
    if value is None or value == ():
        return opt.help
    if opt.kind is _secs_ms:
        value = round(value * 1000, 3)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{opt.help} (default: {value})".replace("%", "%%")


class ConfigError(Exception):
    """An option has a value that cannot be used."""


# Options whose values are secrets (credentials, keys, URLs with passwords). On a command line every local user
# reads them (ps, /proc/PID/cmdline): give them by environment (SMG_NODE_<OPTION>) or in the --config file. The
# processes of --workers N get them by environment, never on their command lines (secrets_to_environment).
SECRET_FLAGS = frozenset({"--admin-token", "--api-key", "--tenant-api-key", "--control-plane-api-keys",
                          "--worker-api-key", "--rpc-token", "--encrypt", "--postgres-db-url", "--redis-url"})


def secrets_to_environment(argv: "list[str]") -> tuple[list[str], dict[str, str]]:
    """``argv`` without its secret options, and the environment that carries them instead (flags still win over
    the environment the process already had: these values are set over it)."""
    kinds = {opt.flag: opt.kind for opt in _OPTIONS}
    out: list[str] = []
    env: dict[str, str] = {}
    i = 0
    while i < len(argv):
        flag, eq, inline = argv[i].partition("=")
        i += 1
        if flag not in SECRET_FLAGS:
            out.append(argv[i - 1])
            continue
        values = [inline] if eq else []
        while not eq and i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
            if kinds.get(flag) != "list":
                break
        env[ENV_PREFIX + flag[2:].replace("-", "_").upper()] = \
            shlex.join(values) if kinds.get(flag) == "list" else (values[0] if values else "")
    return out, env


def secrets_on_command_line(argv: "list[str]") -> list[str]:
    """The secret options given as flags (to warn about: ps shows them to every local user)."""
    return sorted({token.partition("=")[0] for token in argv if token.partition("=")[0] in SECRET_FLAGS})


def _convert(opt: _Option, raw: Any) -> Any:
    try:
        if opt.kind == "bool":
            return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
        if opt.kind == "disable":
            disabled = raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
            return not disabled
        if opt.kind == "prefill":
            return _prefill_engines(raw)
        if opt.kind == "append":
            # Flags give [[url], [url, url]]; the environment and TOML "a, b" or ["a", "b"].
            groups = raw if isinstance(raw, list) else [str(raw).replace(",", " ")]
            return tuple(part for group in groups for item in (group if isinstance(group, list) else [group])
                         for part in str(item).replace(",", " ").split())
        if opt.kind == "selector":  # as flags, "a=b c=d", "a in (x, y),c=d", or a TOML list of such
            return parse_selector([str(item) for item in (raw if isinstance(raw, list) else [raw])])
        if opt.kind == "list":
            # "a b", ["a", "b"] and ["a b"] all mean two items (so --sim-engine-args="--x 1" works).
            items = raw if isinstance(raw, list) else [str(raw).replace(",", " ")]
            return tuple(part for item in items for part in shlex.split(str(item)))
        return opt.kind(raw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{opt.flag}: cannot use {raw!r}: {e}") from None


def _prefill_engines(raw: Any) -> "tuple[tuple[str, int | None], ...]":
    """--prefill's (URL, bootstrap port) pairs. Flags give [[url], [url, port]]; the environment and TOML
    "url port, url", or a TOML list of "url port" strings or [url, port] lists. A port of "none" is none."""
    if isinstance(raw, str):
        raw = [entry.split() for entry in raw.split(",") if entry.strip()]
    engines = []
    for entry in raw:
        parts = entry.split() if isinstance(entry, str) else list(entry)
        if not 1 <= len(parts) <= 2:
            raise ValueError(f"a prefill engine is URL [BOOTSTRAP_PORT], got {parts!r}")
        port = parts[1] if len(parts) == 2 else None
        port = None if port is None or str(port).lower() == "none" else int(port)
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"bootstrap port {port} is not a port")
        engines.append((str(parts[0]), port))
    return tuple(engines)


def build_config(args: argparse.Namespace, environ: "dict[str, str] | None" = None) -> GatewayConfig:
    environ = os.environ if environ is None else environ
    file_values: dict[str, Any] = {}
    if getattr(args, "config", None):
        try:
            file_values = tomllib.loads(Path(args.config).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"--config {args.config}: {e}") from None
        known = {o.flag[2:].replace("-", "_") for o in _OPTIONS}
        unknown = sorted(set(file_values) - known)
        if unknown:
            raise ConfigError(f"--config {args.config}: unknown keys {', '.join(unknown)}")
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for opt in _OPTIONS:
        key = opt.flag[2:].replace("-", "_")
        raw = getattr(args, key, None)
        if raw is None:
            raw = environ.get(ENV_PREFIX + key.upper())
        if raw is None:
            raw = file_values.get(key)
        if raw is None:
            continue
        value = _convert(opt, raw)
        if "." in opt.path:
            section, field = opt.path.split(".")
            sections.setdefault(section, {})[field] = value
        else:
            top[opt.path] = value
    _smg_mesh_aliases(top, sections.setdefault("mesh", {}))
    base = GatewayConfig()
    jwt_values = sections.pop("jwt", None)
    if jwt_values:  # a section of a section: auth.jwt
        sections.setdefault("auth", {})["jwt"] = dataclasses.replace(base.auth.jwt, **jwt_values)
    names = sections.get("postgres", {}).get("names")
    if names is not None:
        try:
            sections["postgres"]["names"] = PostgresNames().with_overrides(names)
        except ValueError as e:
            raise ConfigError(f"--postgres-names: {e}") from None
    for section, values in sections.items():
        top[section] = dataclasses.replace(getattr(base, section), **values)
    config = dataclasses.replace(base, **top)
    validate(config)
    return config


def _smg_mesh_aliases(top: dict[str, Any], mesh: dict[str, Any]) -> None:
    """Fold smg's --enable-mesh/--mesh-host/--mesh-port/--mesh-advertise-host into our options."""
    enable, host, port = top.pop("_enable_mesh", False), top.pop("_mesh_host", None), top.pop("_mesh_port", None)
    advertise_host = top.pop("_mesh_advertise_host", None)
    if "bind" not in mesh and (enable or host or port or mesh.get("join")):
        mesh["bind"] = f"{host or '0.0.0.0'}:{port or 7946}"
    if advertise_host and "advertise" not in mesh:
        mesh["advertise"] = f"{advertise_host}:{mesh['bind'].rpartition(':')[2] if 'bind' in mesh else 7946}"
    if "tags" in mesh:
        try:
            mesh["tags"] = parse_tags(mesh["tags"])
        except ValueError as e:
            raise ConfigError(f"--tag: {e}") from None
    for seed in mesh.get("join", ()):
        body = seed[4:] if seed.startswith("dns:") else seed
        if not body.rpartition(":")[2].isdigit():
            raise ConfigError(f"--join: a seed is host:port or dns:NAME:PORT, got {seed!r}")


HISTORY_BACKENDS = ("memory", "postgres", "redis", "none")


def validate(config: GatewayConfig) -> None:
    if config.policy.name not in POLICIES:
        raise ConfigError(f"--policy: unknown policy {config.policy.name!r}; choose one of "
                          f"{', '.join(sorted(POLICIES))}")
    if not 0 <= config.port <= 65535:
        raise ConfigError("--port must be between 0 and 65535")
    if config.history_backend not in HISTORY_BACKENDS:
        raise ConfigError(f"--history-backend: {config.history_backend!r}; choose one of "
                          f"{', '.join(HISTORY_BACKENDS)}")
    if config.history_backend == "postgres":
        if not config.postgres.url:
            raise ConfigError("--history-backend postgres needs --postgres-db-url (or SMG_POSTGRES_DB_URL)")
        problem = config.postgres.names.problem()
        if problem is not None:
            raise ConfigError(f"--postgres-names: {problem}")
        if config.postgres.pool_max_size < 1:
            raise ConfigError("--postgres-pool-max-size must be positive")
    if config.history_backend == "redis":
        if not config.redis.url:
            raise ConfigError("--history-backend redis needs --redis-url (or SMG_REDIS_URL)")
        if config.redis.pool_max_size < 1 or config.redis.retention_days == 0:
            raise ConfigError("--redis-pool-max-size must be positive and --redis-retention-days not 0")
    history = config.history
    if history.max_responses < 1 or history.max_items < 1 or history.retention_s <= 0 or history.max_bytes < 1:
        raise ConfigError("--history-memory-max-responses, --history-memory-max-items, --history-memory-max-bytes "
                          "and --history-memory-retention-secs must be positive")
    if any(v is not None and v < 1 for v in (history.tenant_max_bytes, history.tenant_max_responses,
                                             history.tenant_max_conversations, history.tenant_max_items)) \
            or not 1 <= history.record_bytes_max <= RECORD_BYTES_MAX:
        raise ConfigError(f"--history-tenant-max-* must be positive, and --history-record-max-bytes from 1 to "
                          f"{RECORD_BYTES_MAX} (a record travels between nodes in one mesh frame)")
    tracing = config.tracing
    if not 0.0 <= tracing.sample_ratio <= 1.0 or tracing.export_timeout_s <= 0 or not tracing.endpoint:
        raise ConfigError("--trace-sample-ratio must be from 0 to 1, --trace-export-timeout-secs positive, and "
                          "--otlp-traces-endpoint given")
    parsers_off = (None, "none", "passthrough")
    if config.tool_call_parser not in parsers_off and config.tool_call_parser not in TOOL_CALL_PARSERS:
        raise ConfigError(f"--tool-call-parser: unknown parser {config.tool_call_parser!r}; choose one of "
                          f"{', '.join(sorted(TOOL_CALL_PARSERS))}, passthrough or none")
    if config.reasoning_parser not in parsers_off and config.reasoning_parser not in REASONING_PARSERS:
        raise ConfigError(f"--reasoning-parser: unknown parser {config.reasoning_parser!r}; choose one of "
                          f"{', '.join(sorted(REASONING_PARSERS))}, passthrough or none")
    if is_harmony(config.tool_call_parser) or is_harmony(config.reasoning_parser):
        try:
            harmony_encoding()
        except HarmonyUnavailable as e:
            raise ConfigError(f"--tool-call-parser/--reasoning-parser gpt_oss: {e}") from None
    if config.engine_h2.keepalive_interval_s > 0 and not config.engine_h2.keepalive_timeout_s > 0:
        raise ConfigError("--engine-keepalive-timeout-secs must be positive while keepalive is on")
    if config.answer_bytes_max < 1:
        raise ConfigError("--max-answer-bytes must be positive")
    if config.admission.max_concurrent_requests < 0 or config.admission.queue_size < 0:
        raise ConfigError("--max-concurrent-requests and --queue-size must not be negative")
    if any(v is not None and v < 1 for v in (config.admission.tenant_max_concurrent,
                                             config.admission.tenant_queue_max)):
        raise ConfigError("--max-concurrent-requests-per-tenant and --queue-size-per-tenant must be positive")
    if config.admission.body_bytes_max is not None and config.admission.body_bytes_max <= 0:
        raise ConfigError("--max-payload-size must be positive")
    if config.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
        raise ConfigError("--log-level must be debug, info, warning, error or critical")
    if config.tokenizer_path is not None and not (config.tokenizer_path / "tokenizer.json").is_file():
        raise ConfigError(f"--tokenizer-path {config.tokenizer_path} has no tokenizer.json")
    if config.chat_template is not None and not config.chat_template.is_file():
        raise ConfigError(f"--chat-template {config.chat_template} is not a file")
    if config.http_server not in ("native", "hypercorn"):
        raise ConfigError("--http-server must be native or hypercorn")
    if config.grpc_client not in ("h2", "grpcio"):
        raise ConfigError("--grpc-client must be h2 or grpcio")
    if config.http_server == "hypercorn" and config.workers != 1:
        raise ConfigError("--http-server hypercorn serves one process: use --workers 1")
    if config.max_connections < 1:
        raise ConfigError("--max-connections must be at least 1")
    if config.workers < 0:
        raise ConfigError("--workers must not be negative (0: one per available core)")
    if config.kv_event_followers < 1:
        raise ConfigError("--kv-event-followers must be at least 1")
    if config.tokenizer.encode_threads < 0:
        raise ConfigError("--encode-threads must not be negative (0: one per core)")
    if config.tokenizer.chat_template_fuel < 1:
        raise ConfigError("--chat-template-fuel must be at least 1")
    if config.sim_engines < 0:
        raise ConfigError("--sim-engines must not be negative")
    config.limit_set()  # raises ConfigError on a bad file or flag
    rl = config.rate_limit
    if rl.batch_wait_s < 0 or rl.batch_items_max < 1 or rl.sync_interval_s <= 0 or rl.forward_timeout_s <= 0:
        raise ConfigError("--rate-limit-batch-wait-ms must be >= 0, --rate-limit-batch-max >= 1, and the sync "
                          "interval and forward timeout positive")
    mesh = config.mesh
    if mesh.enabled:
        if mesh.preset not in ("lan", "local"):
            raise ConfigError("--mesh-preset must be lan or local")
        try:
            for key in mesh.keys:
                decode_key(key)
        except KeyringError as e:
            raise ConfigError(f"--encrypt: {e}") from None
        tls_parts = [mesh.tls_ca_cert, mesh.tls_cert, mesh.tls_key]
        if any(tls_parts) and not all(tls_parts):
            raise ConfigError("--mesh-tls-ca-cert, --mesh-tls-cert and --mesh-tls-key go together")
        if all(tls_parts):
            try:
                MeshTls(*tls_parts)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"--mesh-tls-*: {e}") from None
        if not mesh.keys and not mesh.insecure and not (is_loopback(mesh.bind) and is_loopback(
                mesh.advertise or mesh.bind)):
            raise ConfigError(f"--mesh-bind {mesh.bind} is reachable from the network: pass --encrypt KEY "
                              "(smg-node keygen makes one), or --mesh-insecure to run it in the clear")
    for url in config.worker_urls:  # a mistake in a URL is the operator's to fix now, not a retry loop's
        try:
            parse_worker_origin(url)
        except WorkerUrlError as e:
            raise ConfigError(f"--worker-urls {url}: {e}") from None
    _validate_pd(config.pd)
    _validate_discovery(config.discovery, config.pd, config.mesh.enabled)
    try:
        Authenticator(config.auth)
        WorkerAllowlist(config.worker_allowed_hosts)
    except (AuthConfigError, ValueError) as e:
        raise ConfigError(str(e)) from None
    if config.tls.enabled or config.tls.key_path is not None:
        try:
            ServerTls(config.tls)  # the files load, and the key matches the certificate
        except (ValueError, OSError, ssl.SSLError) as e:
            raise ConfigError(f"--tls-cert-path/--tls-key-path: {e}") from None


def _validate_discovery(discovery: DiscoveryConfig, pd: PdConfig, meshed: bool) -> None:
    given = [flag for flag, selector in (("--selector", discovery.selector),
                                         ("--prefill-selector", discovery.prefill_selector),
                                         ("--decode-selector", discovery.decode_selector),
                                         ("--router-selector", discovery.router_selector)) if selector]
    if not discovery.enabled:
        if given:
            raise ConfigError(f"{given[0]} needs --service-discovery")
        return
    if not given:
        raise ConfigError("--service-discovery needs --selector (or --prefill-selector and --decode-selector, or "
                          "--router-selector): an empty selector would take every pod")
    if (discovery.prefill_selector or discovery.decode_selector) and not pd.enabled:
        raise ConfigError("--prefill-selector and --decode-selector need --pd-disaggregation")
    if discovery.router_selector and not meshed:
        raise ConfigError("--router-selector finds the mesh's seeds: it needs --mesh-bind")
    if discovery.protocol not in ("grpc", "http"):
        raise ConfigError(f"--service-discovery-protocol {discovery.protocol!r}: grpc or http")
    if discovery.protocol != "grpc" and (discovery.prefill_selector or discovery.decode_selector):
        raise ConfigError("prefill and decode engines are gRPC engines: --service-discovery-protocol grpc")
    if not 0 < discovery.port < 65536:
        raise ConfigError(f"--service-discovery-port {discovery.port} is not a port")


def _validate_pd(pd: PdConfig) -> None:
    if (pd.prefill or pd.decode) and not pd.enabled:
        raise ConfigError("--prefill and --decode need --pd-disaggregation")
    for flag, policy in (("--prefill-policy", pd.prefill_policy), ("--decode-policy", pd.decode_policy)):
        if policy is not None and policy not in POLICIES:
            raise ConfigError(f"{flag}: unknown policy {policy!r}; choose one of {', '.join(sorted(POLICIES))}")
    if not pd.bootstrap_timeout_s > 0:
        raise ConfigError("--pd-bootstrap-timeout-secs must be positive")
    for flag, url in [*(("--prefill", u) for u, _ in pd.prefill), *(("--decode", u) for u in pd.decode)]:
        try:
            if parse_worker_origin(url).kind != "grpc":
                raise WorkerUrlError("prefill and decode engines are gRPC engines (grpc://host:port)")
        except WorkerUrlError as e:
            raise ConfigError(f"{flag} {url}: {e}") from None


def with_admin_credentials(config: GatewayConfig) -> GatewayConfig:
    """The config with the admin token and the admin endpoint's token resolved.

    Without any admin credential, the admin token comes from --admin-token-file (made there
    if need be: mesh/admin_token.py). The mesh's admin endpoint takes --rpc-token, else the
    admin token, else the file's: it is never open, not even on loopback, because the gateway
    itself can be made to send requests to loopback addresses. Without --encrypt, and unless
    --mesh-insecure says otherwise, the gossip key is derived from the admin token.
    """
    auth, mesh = config.auth, config.mesh
    path = auth.admin_token_file or default_token_path()
    file_token = None
    if not auth.has_admin_credential() or (mesh.enabled and not mesh.rpc_token and not auth.admin_token):
        try:
            file_token, _ = load_or_create_token(path)
        except (AdminTokenError, OSError) as e:
            raise ConfigError(f"--admin-token-file: {e}") from None
    if not auth.has_admin_credential():
        auth = dataclasses.replace(auth, admin_token=file_token, admin_token_file=path)
    if mesh.enabled and not mesh.rpc_token:
        mesh = dataclasses.replace(mesh, rpc_token=auth.admin_token or file_token)
    if mesh.enabled and not mesh.keys and not mesh.insecure:
        # Never in the clear unless asked: a key from the admin token, which the nodes of one user on one
        # machine share through its file (and a cluster through SMG_NODE_ADMIN_TOKEN). Off loopback,
        # validate() already asked for --encrypt.
        secret = auth.admin_token
        if not secret:
            try:
                secret, _ = load_or_create_token(path)
            except (AdminTokenError, OSError) as e:
                raise ConfigError(f"--admin-token-file (the mesh's key is derived from it): {e}") from None
        mesh = dataclasses.replace(mesh, keys=(derive_key(secret),), key_source="admin-token")
    return dataclasses.replace(config, auth=auth, mesh=mesh)

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
import tomllib
from pathlib import Path
from typing import Any

from mesh.admin_token import AdminTokenError, cluster_salt, default_token_path, load_or_create_token, read_token
from mesh.crypto import WeakSecret, derive_key
from mesh.options import parse_tags

from ..base.options import HELP_SECTIONS, Option, secs_ms
from ..base.subsystem import ConfigProblem, Subsystem
from ..discovery.config import parse_selector
from ..history import HISTORY_BACKENDS
from ..ratelimit.limits import LimitSet
from ..ratelimit.subsystem import limit_set
from ..workers import WorkerUrlError, parse_worker_origin
from .subsystems import SUBSYSTEMS

ENV_PREFIX = "SMG_NODE_"


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """The node's own settings; ``GatewayConfig`` adds a section per registered subsystem (below)."""

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
    # stopped past this many bytes of JSON (gateway.serving.generation.LOGPROB_ENTRY_BYTES says how it is estimated):
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
    # Rate limits: a TOML file of [[limits]] (gateway/ratelimit/limits.py), plus the shortcut
    # --global-rate-limit N (requests per second for the whole cluster) and a policy override.
    rate_limits_file: Path | None = None
    global_rate_limit: float | None = None
    rate_limit_policy: str | None = None
    # Parsers of chat answers for every model (gateway/parsers/); None: chosen by each model's id
    # (gateway/parsers/choice.py), "none" or "passthrough": off.
    tool_call_parser: str | None = None
    # Where the Responses and Conversations APIs keep what they store (gateway/history): "memory"
    # (bounded by ``history``, each record on three nodes of the mesh) or "none" (nothing stored;
    # previous_response_id and conversations refused).
    history_backend: str = "memory"
    # The settings of registered plugins that bring a config section of their own (a history backend's:
    # ``postgres``, ``redis``), by section name; read as attributes (``config.postgres``) or with section().
    plugin_sections: tuple[tuple[str, Any], ...] = ()
    reasoning_parser: str | None = None
    # "native": the gateway's own HTTP/1.1 server (gateway/net/http1/server.py, ~20x less CPU per request
    # than hypercorn on trio, BENCHMARKS.md); "hypercorn": hypercorn's, which also speaks HTTP/2.
    http_server: str = "native"
    # "h2": gRPC to engines over HTTP/2 from the event loop with our own framing
    # (gateway/engine/h2grpc.py, several times less CPU per call); "grpcio": through grpcio's asyncio
    # API on a thread of its own (engine/bridge.py).
    grpc_client: str = "h2"
    # Gateway processes serving the HTTP port (SO_REUSEPORT; gateway/node/supervisor.py says how they share
    # the node's state); 0 = one per core this process may use (CPU affinity and cgroup quota) less one,
    # at least one: supervisor.default_worker_count says why.
    workers: int = 0
    # Bind the HTTP port with SO_REUSEPORT (set for each process of --workers N).
    http_reuse_port: bool = False
    # Client connections one gateway process serves at once; past it a new one gets a 503 at once
    # (gateway/net/http1/server.py H1Config says why 8,192).
    max_connections: int = 8192
    # Which process of --workers N this is (0 for a single process); offsets its own ports.
    worker_index: int = 0
    # Where the node keeps the cluster's state it holds across restarts (gateway/node/data_dir.py): None, a
    # directory of its own under the user's state directory; "none", nothing kept.
    data_dir: str | None = None
    # fsync every record before the change is acknowledged: survives a power cut, not only a crash (data_dir.py).
    data_fsync: bool = False

    def section(self, name: str) -> Any:
        """A plugin's config section: as set, else its defaults."""
        for key, value in self.plugin_sections:
            if key == name:
                return value
        return plugin_section_defaults()[name]

    def __getattr__(self, name: str) -> Any:
        # Only for names that are not fields: a plugin's section (config.postgres), nothing else.
        if name.startswith("_") or name not in plugin_section_defaults():
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")
        return self.section(name)

    def limit_set(self) -> LimitSet:
        """The limits this node starts with (ConfigError when the file or flags are wrong)."""
        try:
            return limit_set(self)
        except ConfigProblem as e:
            raise ConfigError(str(e)) from None


def config_class(subsystems: "tuple[Subsystem, ...]" = SUBSYSTEMS) -> type:
    """The node's config class: its own fields and one section per subsystem that has settings (``config.media``,
    ``config.mcp``...), each defaulting to the subsystem's config (gateway/node/subsystems.py)."""
    sections = [(s.name, type(s.config), dataclasses.field(default=s.config)) for s in subsystems if s.config is not None]
    return dataclasses.make_dataclass("GatewayConfig", sections, bases=(NodeConfig,), frozen=True, namespace={
        "__module__": __name__,
        "__doc__": "The node's configuration: its own settings and a section per subsystem; one frozen object."})


GatewayConfig = config_class()


# The node's own flags; every subsystem declares its own beside its config (``OPTIONS`` in its module).
_OWN_OPTIONS = (
    Option("--host", "host", str, "address to serve HTTP on", "http"),
    Option("--port", "port", int, "HTTP port", "http"),
    Option("--worker-urls", "worker_urls", "list", "engines: grpc://host:port (SGLang/vLLM gRPC) or "
           "http://host:port (OpenAI-compatible, proxied as is)", "engines"),
    Option("--allow-special-tokens-in-content", "allow_special_tokens_in_content", "bool", "tokenize special tokens "
           "spelled in messages as control tokens (default: as plain text, so no client forges a turn)", "security"),
    Option("--worker-api-key", "worker_api_key", str, "the key of the HTTP workers in --worker-urls (clients' keys "
           "are never forwarded)", "engines", secret=True),
    Option("--model-path", "model_path", str, "model name to serve (default: what the engines report)", "engines"),
    Option("--tokenizer-path", "tokenizer_path", Path, "directory with tokenizer.json (default: fetched from the "
           "engine with GetTokenizer)", "engines"),
    Option("--chat-template", "chat_template", Path, "Jinja chat template file overriding the tokenizer's", "engines"),
    Option("--prometheus-host", "prometheus_host", str, "address of the separate /metrics listener", "http"),
    Option("--prometheus-port", "prometheus_port", int, "port of a separate /metrics listener", "http"),
    Option("--log-level", "log_level", str, "debug, info, warning, error", "http"),
    Option("--log-json", "log_json", "bool", "log JSON lines instead of text", "http"),
    Option("--default-max-tokens", "default_max_tokens", int, "max_tokens when nothing else bounds it", "http"),
    Option("--max-answer-bytes", "answer_bytes_max", int, "largest answer held whole before it is sent (not "
           "streamed), estimated as its JSON: beyond it 400 answer_too_large (default 32 MiB); streams hold none",
           "http"),
    Option("--routing-key-header", "routing_key_header", str, "header with the routing key", "routing"),
    Option("--shutdown-grace-period-secs", "shutdown_grace_period_s", float, "drain time on SIGTERM", "http"),
    Option("--max-connections", "max_connections", int, "client connections served at once per process; more are "
           "answered 503 at once (default 8192)", "http"),
    Option("--http-server", "http_server", str, "native (default, HTTP/1.1) or hypercorn (HTTP/1.1 and h2)", "http"),
    Option("--grpc-client", "grpc_client", str, "h2 (default: from the event loop) or grpcio (on a thread)",
           "performance"),
    Option("--workers", "workers", int, "gateway processes on the HTTP port (0: one per available core less one, at "
           "least one: 1 on 2 cores, 15 on 16)",
           "performance"),
    Option("--data-dir", "data_dir", str, "where the node keeps run-time API keys, settings, workers, the gossip "
           "keyring and stored conversations across restarts (default: ~/.local/state/smg-node/nodes/NAME; none: "
           "keep nothing)", "cluster"),
    Option("--data-fsync", "data_fsync", "bool", "fsync each change to the data directory before answering "
           "(survives a power cut; by default a process crash loses nothing acknowledged)", "cluster"),
    Option("--worker-index", "worker_index", int, "which process of --workers N this is (set by the node)",
           "http", internal=True),
    Option("--http-reuse-port", "http_reuse_port", "bool", "bind the HTTP port with SO_REUSEPORT (--workers)",
           "http", internal=True),
    Option("--sim-engines", "sim_engines", int, "demo: start this many simulated engines and use them", "engines"),
    Option("--sim-engine-args", "sim_engine_args", "list", "extra flags for the simulated engines", "engines"),
)


def plugin_section_defaults() -> dict[str, Any]:
    """The config sections registered plugins bring (a history backend's settings), with their defaults."""
    return {plugin.make.section: plugin.make.defaults for plugin in HISTORY_BACKENDS.plugins() if plugin.make.section}


def all_options(subsystems: "tuple[Subsystem, ...]" = SUBSYSTEMS) -> tuple[Option, ...]:
    """Every flag of ``serve``: the node's own, then each registered subsystem's (its plugins' among them)."""
    return (*_OWN_OPTIONS, *(option for subsystem in subsystems for option in subsystem.options))


OPTIONS = all_options()
# Set by the node for the processes of --workers N, not by people.
INTERNAL_FLAGS = frozenset(option.flag for option in OPTIONS if option.internal)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """``serve``'s flags, in --help's sections (``gateway/base/options.py`` HELP_SECTIONS), each from its declaration."""
    parser.add_argument("--config", type=Path, default=None, help="TOML file with the same options (keys: flag "
                        "names with underscores)")
    for key, title in HELP_SECTIONS:
        group = parser.add_argument_group(title)
        for opt in OPTIONS:
            if opt.section == key and not opt.internal:
                _add_option(group, opt, _help_with_default(opt))
    for opt in OPTIONS:
        if opt.internal:
            _add_option(parser, opt, argparse.SUPPRESS)


def _add_option(parser: Any, opt: Option, help_text: str) -> None:
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


def _help_with_default(opt: Option) -> str:
    """The option's help with its choices and default, as argparse prints it (``%`` doubled)."""
    text, default = help_parts(opt)
    return (text if default is None else f"{text} (default: {default})").replace("%", "%%")


def help_parts(opt: Option) -> tuple[str, Any]:
    """The option's help with its choices (a registry's names), and its default read from the config classes (the
    one source of defaults), or None when it has none to show; --help and docs/options.md both say these.

    Switches (on or off) and options whose absence means "none" say so in their help instead.
    """
    text = opt.help
    if opt.choices is not None:
        text = f"{text}: {opt.choices.choices()}"
    if opt.kind in ("bool", "disable") or "default" in opt.help:
        return text, None
    value = _default_of(opt.path)
    if value is None or value == ():
        return text, None
    if opt.kind is secs_ms:
        value = round(value * 1000, 3)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    elif dataclasses.is_dataclass(value):  # a set of names (--postgres-names): as the flag takes them, KEY=VALUE
        value = " ".join(f"{field.name}={getattr(value, field.name)}" for field in dataclasses.fields(value))
    return text, value


def _default_of(path: str) -> Any:
    value: Any = GatewayConfig()
    for part in path.split("."):
        value = getattr(value, part, None)
    return value


class ConfigError(Exception):
    """An option has a value that cannot be used."""


# Options whose values are secrets (credentials, keys, URLs with passwords). On a command line every local user
# reads them (ps, /proc/PID/cmdline): give them by environment (SMG_NODE_<OPTION>) or in the --config file. The
# processes of --workers N get them by environment, never on their command lines (secrets_to_environment).
SECRET_FLAGS = frozenset(option.flag for option in OPTIONS if option.secret)


def secrets_to_environment(argv: "list[str]") -> tuple[list[str], dict[str, str]]:
    """``argv`` without its secret options, and the environment that carries them instead (flags still win over
    the environment the process already had: these values are set over it)."""
    kinds = {opt.flag: opt.kind for opt in OPTIONS}
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


def _convert(opt: Option, raw: Any) -> Any:
    value = _parse(opt, raw)
    if opt.then is None:
        return value
    try:
        return opt.then(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{opt.flag}: {e}") from None


def _parse(opt: Option, raw: Any) -> Any:
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
    """--prefill's (and --encode's) (URL, bootstrap port) pairs. Flags give [[url], [url, port]]; the environment
    and TOML "url port, url", or a TOML list of "url port" strings or [url, port] lists. A port of "none" is none."""
    if isinstance(raw, str):
        raw = [entry.split() for entry in raw.split(",") if entry.strip()]
    engines = []
    for entry in raw:
        parts = entry.split() if isinstance(entry, str) else list(entry)
        if not 1 <= len(parts) <= 2:
            raise ValueError(f"an engine with a bootstrap server is URL [BOOTSTRAP_PORT], got {parts!r}")
        port = parts[1] if len(parts) == 2 else None
        port = None if port is None or str(port).lower() == "none" else int(port)
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"bootstrap port {port} is not a port")
        engines.append((str(parts[0]), port))
    return tuple(engines)


def build_config(args: argparse.Namespace, environ: "dict[str, str] | None" = None,
                 subsystems: "tuple[Subsystem, ...]" = SUBSYSTEMS) -> GatewayConfig:
    """The config from flags (``args``), the environment and the --config file, checked (ConfigError). ``subsystems``:
    the node's registrations (a test may add one)."""
    options, config_type = (OPTIONS, GatewayConfig) if subsystems is SUBSYSTEMS else \
        (all_options(subsystems), config_class(subsystems))
    environ = os.environ if environ is None else environ
    file_values: dict[str, Any] = {}
    if getattr(args, "config", None):
        try:
            file_values = tomllib.loads(Path(args.config).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"--config {args.config}: {e}") from None
        known = {o.flag[2:].replace("-", "_") for o in options}
        unknown = sorted(set(file_values) - known)
        if unknown:
            raise ConfigError(f"--config {args.config}: unknown keys {', '.join(unknown)}")
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for opt in options:
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
    base = config_type()
    jwt_values = sections.pop("jwt", None)
    if jwt_values:  # a section of a section: auth.jwt
        sections.setdefault("auth", {})["jwt"] = dataclasses.replace(base.auth.jwt, **jwt_values)
    plugins = plugin_section_defaults()
    plugin_sections = []
    for section, values in sections.items():
        if section in plugins:
            plugin_sections.append((section, dataclasses.replace(plugins[section], **values)))
        else:
            top[section] = dataclasses.replace(getattr(base, section), **values)
    top["plugin_sections"] = tuple(plugin_sections)
    config = dataclasses.replace(base, **top)
    validate(config, subsystems)
    return config


def _value_of(config: GatewayConfig, path: str) -> Any:
    value: Any = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


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


def validate(config: GatewayConfig, subsystems: "tuple[Subsystem, ...]" = SUBSYSTEMS) -> None:
    """The node's own checks, then every subsystem's (gateway/node/subsystems.py): the first problem, in one line."""
    for opt in (OPTIONS if subsystems is SUBSYSTEMS else all_options(subsystems)):  # values naming a registered member
        if opt.choices is not None:
            problem = opt.choices.check(_value_of(config, opt.path), opt.flag)
            if problem is not None:
                raise ConfigError(problem)
    _validate_node(config)
    for subsystem in subsystems:
        if subsystem.check is not None:
            try:
                subsystem.check(config)
            except ConfigProblem as e:
                raise ConfigError(str(e)) from None


def _validate_node(config: GatewayConfig) -> None:
    if not 0 <= config.port <= 65535:
        raise ConfigError("--port must be between 0 and 65535")
    if config.answer_bytes_max < 1:
        raise ConfigError("--max-answer-bytes must be positive")
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
        raise ConfigError("--workers must not be negative (0: one per available core less one)")
    if config.sim_engines < 0:
        raise ConfigError("--sim-engines must not be negative")
    for url in config.worker_urls:  # a mistake in a URL is the operator's to fix now, not a retry loop's
        try:
            parse_worker_origin(url)
        except WorkerUrlError as e:
            raise ConfigError(f"--worker-urls {url}: {e}") from None


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
        try:
            if not secret:
                secret, _ = load_or_create_token(path)
            # The file's token takes the salt kept beside it (nodes sharing the file share it); a token given by
            # flag or environment, as a cluster on several machines shares it, the fixed one.
            salt = cluster_salt(path) if secret == read_token(path) else None
        except (AdminTokenError, OSError) as e:
            raise ConfigError(f"--admin-token-file (the mesh's key is derived from it): {e}") from None
        try:
            key = derive_key(secret, salt)
        except WeakSecret as e:
            raise ConfigError(f"the admin token is too weak to derive the mesh's gossip key from ({e}): give the "
                              "nodes a generated token (python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
                              ") or the mesh a key of its own (--encrypt $(smg-node keygen))") from None
        mesh = dataclasses.replace(mesh, keys=(key,), key_source="admin-token")
    return dataclasses.replace(config, auth=auth, mesh=mesh)

"""Running a node's gateway: wiring the parts together, serving HTTP, shutting down gracefully.

``serve_gateway(config, task_status=...)`` runs until cancelled or until
``shutdown`` is triggered; ``task_status.started`` reports the bound HTTP
address. SIGTERM/SIGINT (installed by ``run_gateway``): stop being ready,
stop accepting, finish in-flight requests for up to the grace period, exit; a
second signal exits at once.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
import ssl
import sys
from typing import Any

import httpx2
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from mesh.admin_token import forget_endpoint, record_endpoint
from mesh.asgi import answer_lifespan
from mesh.options import default_node_name
from mesh.service import MeshBindError, serve_mesh

from ..api.app import GatewayApp
from ..api.errors import transport_error_body
from ..api.state import GatewayState
from ..base.subsystem import StartContext, Subsystem, start_order
from ..cluster import ClusterState, SettingsDocument, follow_worker_document
from ..discovery.credentials import CredentialsError
from ..engine.bridge import GrpcBridge
from ..engine.engine_tls import client_context
from ..engine.h2grpc import H2GrpcClient
from ..history import StoreUnavailable
from ..net.http1 import H1Config, H1Server
from ..net.tls import ServerTls, TlsConfig
from ..observe.logs import setup_logging
from ..observe.loop_lag import SlowStepLog
from ..observe.metrics import GatewayMetrics
from ..workers import WorkerError, WorkerExists, parse_worker_url, worker_id_for
from .config import GatewayConfig
from .data_dir import DataDir, DataDirError, data_dir_of
from .mesh_metrics import cluster_metric_families, mesh_metric_families
from .subsystems import NODE_RESOURCES, SUBSYSTEMS
from .supervisor import SUPERVISED_ENV, exit_when_supervisor_dies
from .trio_instruments import use_dict_instruments

log = logging.getLogger("gateway.server")

# Initial workers that cannot be reached are retried in the background, so a node
# may start before its engines; the wait between tries grows to this.
WORKER_RETRY_BACKOFF_MAX_S = 10.0
GIL_SWITCH_INTERVAL_S = 0.0005
# A young collection after this many new container objects, not CPython's 700. Each one walks every
# live young object, and the lists requests hold (a long prompt's 7,800 ids) are walked entry by entry:
# at 700, ~3 % of a node's CPU under long prompts went to the collector (perf). Reference counting frees
# all but cycles at once; cyclic garbage now waits for up to this many allocations (a few MB).
GC_YOUNG_THRESHOLD = 50_000


@dataclasses.dataclass
class RunningGateway:
    """What ``serve_gateway`` reports once it listens."""

    url: str  # http://host:port
    state: GatewayState
    shutdown: trio.Event  # set it to begin a graceful shutdown


async def _register_initial(state: GatewayState, url: str, model: str | None, role: str = "regular",
                            bootstrap_port: int | None = None) -> None:
    """Registers a --worker-urls (or --prefill, --decode) engine, trying until it answers. It counts as
    unreachable (its model's requests answer 503 naming it) from the node's start until then."""
    delay = 0.5
    while True:
        try:
            worker = await state.registry.add(url, model=model, api_key=state.config.worker_api_key, role=role,
                                              bootstrap_port=bootstrap_port, from_flags=True)
            await state.catalog.ensure(worker, int(worker.registered_at))
            if delay > 0.5:
                log.info("worker %s answers now: registered", url)
            state.status.unreachable_engines.discard(url)
            return
        except WorkerExists:
            state.status.unreachable_engines.discard(url)
            return
        except WorkerError as e:
            log.warning("worker %s not registered yet: %s (retrying in %.1fs; requests for its model answer 503 "
                        "until it answers)", url, e, delay)
        await trio.sleep(delay)
        delay = min(delay * 2, WORKER_RETRY_BACKOFF_MAX_S)


def retract_unnamed(cluster: ClusterState, urls: "list[str]") -> None:
    """Remove the workers this node registered from its flags at an earlier start (its document, kept on disk,
    still lists them) that its flags no longer name: an engine moved or dropped from --worker-urls (each start of
    --sim-engines has new ports) would otherwise stay registered for ever. This node wrote those entries, so only
    it retracts them; workers added at run time (POST /workers) stay until removed."""
    named = set()
    for url in urls:
        try:
            named.add(worker_id_for(parse_worker_url(url)[2]))
        except WorkerError:
            continue
    for worker_id, spec in cluster.doc.workers().items():
        if spec.get("flags") and spec.get("by") == cluster.node_name and worker_id not in named:
            log.info("worker %s (%s): registered from this node's flags at an earlier start, which its flags no "
                     "longer name: removed", worker_id, spec.get("url"))
            cluster.remove(worker_id)


async def _serve_http(config: GatewayConfig, app: Any, shutdown: trio.Event, metrics: GatewayMetrics, *,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the API until ``shutdown``, then drain in-flight requests for up to the grace period."""
    if config.http_server == "hypercorn":
        hc = _hypercorn_config(config)
        async with trio.open_nursery() as nursery:
            async def run_hypercorn(task_status=trio.TASK_STATUS_IGNORED) -> None:
                await hypercorn_serve(app, hc, shutdown_trigger=shutdown.wait, task_status=task_status)
                nursery.cancel_scope.cancel()  # served and drained: the certificate watch stops too

            binds = await nursery.start(run_hypercorn)
            if hc.reloader is not None:  # hypercorn made its context at start: reload its chain in place
                nursery.start_soon(hc.reloader.serve_reloads)
            task_status.started(binds[0])
        return
    tls = ServerTls(config.tls) if config.tls.enabled else None
    server = H1Server(app, H1Config(graceful_timeout_s=config.shutdown_grace_period_s,
                                    reuse_port=config.http_reuse_port, max_connections=config.max_connections,
                                    ssl_context=tls.context if tls is not None else None,
                                    tls_handshake_timeout_s=config.tls.handshake_timeout_s,
                                    error_body=transport_error_body))
    metrics.add_state_source(server.metric_families)
    async with trio.open_nursery() as nursery:
        if tls is not None:
            nursery.start_soon(tls.serve_reloads)  # a renewed certificate is used without a restart
        await server.serve(config.host, config.port, shutdown, task_status=task_status)
        nursery.cancel_scope.cancel()


class _ReloadingHypercornConfig(HypercornConfig):
    """hypercorn's config, keeping the TLS context hypercorn makes so that a renewed certificate can be
    loaded into it (gateway/net/tls.py), as the native server does."""

    tls_config: TlsConfig | None = None
    reloader: ServerTls | None = None

    def create_ssl_context(self):
        context = super().create_ssl_context()
        if context is not None and self.tls_config is not None:
            self.reloader = ServerTls(self.tls_config, context)
        return context


def _hypercorn_config(config: GatewayConfig) -> HypercornConfig:
    hc = _ReloadingHypercornConfig()
    host = f"[{config.host}]" if ":" in config.host else config.host
    hc.bind = [f"{host}:{config.port}"]
    hc.graceful_timeout = config.shutdown_grace_period_s
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.keep_alive_timeout = 75.0  # longer than nginx's and HAProxy's upstream keep-alive defaults
    if config.tls.enabled:  # hypercorn builds its own context (its ALPN, h2 included); we reload its chain
        hc.tls_config = config.tls
        hc.certfile, hc.keyfile = str(config.tls.cert_path), str(config.tls.key_path)
        if config.tls.client_ca_path is not None:
            hc.ca_certs = str(config.tls.client_ca_path)
            hc.verify_mode = ssl.CERT_REQUIRED
    hc.backlog = 2048
    hc.include_server_header = False
    return hc


def ready_note(state: GatewayState, cluster: "ClusterState | None") -> str:
    """What the READY line adds after the URL: the workers it has, and what it still misses (engines that do not
    answer, a cluster not joined yet), so a node that serves nothing yet says so where the operator looks."""
    count = len(state.registry.all())
    parts = [f"{count} worker{'' if count == 1 else 's'}"]
    waiting = sorted(state.status.unreachable_engines)
    if waiting:
        parts.append(f"not answering yet: {', '.join(waiting[:4])}" + (f" and {len(waiting) - 4} more"
                                                                       if len(waiting) > 4 else ""))
    else:
        routes = getattr(getattr(state, "providers", None), "routes", None)
        if count == 0 and not (routes is not None and routes.routes):  # nothing to answer with at all
            parts.append("no engine: add one with smg-node workers add URL")
    if cluster is not None:
        parts.append("cluster joined" if cluster.registry_received else "not joined yet")
    settings = getattr(state, "settings", None)
    kept = settings.keys_read_back if settings is not None else 0
    if kept:  # a node that starts with keys from an earlier start requires them: said where the operator looks
        parts.append(f"{kept} API key{'' if kept == 1 else 's'} kept from an earlier start")
    if settings is not None and settings.keys_may_be_lost:
        parts.append("inference refused: kept keys unreadable (smg-node data status)")
    return ", ".join(parts)


async def serve_gateway(config: GatewayConfig, cluster: ClusterState | None = None, *,
                        settings: SettingsDocument | None = None, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until shut down. ``settings``: a lone node's settings document (the cluster's is ``cluster``), read
    back from its data directory already; None: one in memory."""
    settings = cluster or settings or SettingsDocument(f"port-{config.port}")
    metrics = GatewayMetrics()
    limits = httpx2.Limits(max_connections=1024, max_keepalive_connections=256)
    # https:// workers are verified with the engines' CA (else the system's) and see our client certificate.
    tls = config.engine_tls
    verify = client_context(tls) if tls.ca_path or tls.cert_path else True
    async with httpx2.AsyncClient(limits=limits, timeout=None, verify=verify) as http_client, \
            trio.open_nursery() as outer:
        # The gRPC client's connections are read by tasks of their own, outside the nursery that is
        # cancelled at shutdown, so closing it stays orderly.
        bridge = H2GrpcClient(outer, tls, config.engine_h2) if config.grpc_client == "h2" else GrpcBridge(tls)
        try:
            await _serve_with(config, cluster, settings, metrics, http_client, bridge, task_status)
        finally:
            with trio.CancelScope(shield=True):
                await bridge.aclose()
            outer.cancel_scope.cancel()


async def _serve_with(config: GatewayConfig, cluster: ClusterState | None, settings: SettingsDocument,
                      metrics: GatewayMetrics, http_client: httpx2.AsyncClient, bridge: Any, task_status) -> None:
    async with trio.open_nursery() as nursery:
        services = await start_subsystems(config, nursery, {
            "config": config, "metrics": metrics, "cluster": cluster, "settings": settings, "http_client": http_client,
            "engine_bridge": bridge})
        state = GatewayState(config, services)
        metrics.add_state_source(settings.metric_families)
        registry, catalog = services["registry"], services["catalog"]
        # (URL, role, bootstrap port) of every engine the flags name: --worker-urls, --prefill, --decode.
        engines = [(url, "regular", None) for url in config.worker_urls]
        engines += [(url, "prefill", port) for url, port in config.pd.prefill]
        engines += [(url, "decode", None) for url in config.pd.decode]
        if cluster is not None:
            retract_unnamed(cluster, [url for url, _, _ in engines])
        # Register the configured workers before serving when they answer; keep trying those that don't.
        state.status.unreachable_engines.update(url for url, _, _ in engines)
        with trio.move_on_after(config.health.timeout_s * 2):
            async with trio.open_nursery() as first:
                for url, role, port in engines:
                    first.start_soon(_register_initial, state, url, config.model_path, role, port)
        for url, role, port in engines:
            if not any(w.url == url for w in registry.all()):
                nursery.start_soon(_register_initial, state, url, config.model_path, role, port)
        if cluster is not None:
            nursery.start_soon(follow_worker_document, registry, cluster,
                               lambda worker: catalog.ensure(worker, int(worker.registered_at)))
        # What start-up made (modules, templates, tokenizers) lives as long as the process: moved out of
        # the collector's sight, so full collections scan only what serving creates (gc.freeze).
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])

        shutdown = trio.Event()
        if config.prometheus_port is not None:
            await nursery.start(_serve_metrics_only, config, metrics)
        app = GatewayApp(state, nursery, services["authenticator"])
        url = await nursery.start(_serve_http, config, app, shutdown, metrics)
        state.status.own_url = url
        log.info("smg-node gateway serving on %s (%d workers, policy %s)", url, len(registry),
                 config.policy.name)
        task_status.started(RunningGateway(url, state, shutdown))
        await shutdown.wait()
        state.status.shutting_down = True
        # hypercorn drains its connections for up to graceful_timeout after the trigger;
        # then everything else (health tasks, engines) is cancelled.
        with trio.move_on_after(config.shutdown_grace_period_s + 1):
            await services["admission"].wait_idle()
        nursery.cancel_scope.cancel()


async def start_subsystems(config: GatewayConfig, nursery: trio.Nursery, resources: "dict[str, Any]",
                           subsystems: "tuple[Subsystem, ...]" = SUBSYSTEMS) -> "dict[str, Any]":
    """Every registered subsystem's service (gateway/node/subsystems.py), each started after what it needs and
    given only that; a service with metric_families is scraped with the node's metrics. The node's own resources
    (NODE_RESOURCES) come first."""
    services = dict(resources)
    metrics = resources["metrics"]
    for subsystem in start_order(subsystems, NODE_RESOURCES):
        given = {name: services[name] for name in subsystem.needs}
        service = await subsystem.start(StartContext(config, nursery, given))
        services[subsystem.name] = service
        metric_families = getattr(service, "metric_families", None)
        if metric_families is not None:
            metrics.add_state_source(metric_families)
    return services


async def _serve_metrics_only(config: GatewayConfig, metrics: GatewayMetrics, *,
                              task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A second listener with only /metrics, for scrapers kept off the API port."""
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = metrics.render()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4")]})
        await send({"type": "http.response.body", "body": body})

    port = config.prometheus_port + config.worker_index  # each process of --workers N has its own
    await H1Server(app, H1Config()).serve(config.prometheus_host, port, trio.Event(), task_status=task_status)


async def _follow_router_pods(config: GatewayConfig, agent: Any) -> None:
    """--router-selector: the mesh joins the cluster's other pods as the API server lists them."""
    from ..discovery.credentials import load_credentials
    from ..discovery.service import run_mesh_seeds
    own_port = int(agent.transport.addr.rpartition(":")[2])  # the router pods' mesh port unless annotated
    await run_mesh_seeds(config.discovery, load_credentials(), agent, own_port)


def run_gateway(config: GatewayConfig) -> int:
    """Blocking entry point of ``smg-node serve``: logging, signals, trio.run."""
    setup_logging(config.log_level, config.log_json)

    # A thread holding the GIL (a tokenizer thread turning 8,000 ids into a list, say) keeps the event
    # loop waiting up to the switch interval before it must hand over: 5 ms by default, the whole lag
    # budget. 0.5 ms bounds that wait; the threads hand over more often only while they are busy.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)

    async def main() -> None:
        nonlocal config
        use_dict_instruments()  # trio's per-step hook checks at a dict's speed (gateway/node/trio_instruments.py)
        if os.environ.get("SMG_NODE_SLOW_STEP_MS"):
            trio.lowlevel.add_instrument(SlowStepLog(float(os.environ["SMG_NODE_SLOW_STEP_MS"]) / 1000, log))
        async with trio.open_nursery() as nursery:
            if os.environ.get(SUPERVISED_ENV):
                nursery.start_soon(exit_when_supervisor_dies, nursery.cancel_scope)
            async def serve_then_stop(cluster, settings, task_status=trio.TASK_STATUS_IGNORED) -> None:
                await serve_gateway(config, cluster, settings=settings, task_status=task_status)
                nursery.cancel_scope.cancel()  # drained: stop listening for signals too

            cluster = mesh = None
            if config.mesh.enabled:
                cluster = ClusterState(config.mesh.node_name or default_node_name(
                    config.mesh.advertise or config.mesh.bind))
            settings = cluster or SettingsDocument(f"port-{config.port}")
            data_path = data_dir_of(config)
            if data_path is not None:
                # Read back before anything serves or joins (gateway/node/data_dir.py).
                data.append(DataDir(data_path, config.data_fsync))
                keyring_dir = None if config.mesh.private else str(data_path)  # a private mesh's key is new each start
                config = dataclasses.replace(
                    config, mesh=dataclasses.replace(config.mesh, data_dir=keyring_dir),
                    history=dataclasses.replace(config.history, data_dir=data_path, data_fsync=config.data_fsync))
                settings.keep_on_disk(data_path, config.data_fsync)
            else:
                log.warning("no data directory (--data-dir none, or --port 0 without --data-dir): nothing is kept "
                            "across a restart (run-time API keys, workers, stored conversations)")
            running: RunningGateway = await nursery.start(serve_then_stop, cluster, settings)
            if cluster is not None:

                async def mesh_then_stop(task_status=trio.TASK_STATUS_IGNORED) -> None:
                    await serve_mesh(config.mesh, {"http": running.url, "proto": "1"}, cluster, cluster.node_name,
                                     cluster.attach, cluster.mark_joined, task_status=task_status)
                    running.state.status.shutting_down = True
                    running.shutdown.set()  # the node left the cluster (smg-node leave): it goes too

                mesh = await nursery.start(mesh_then_stop)
                if config.worker_index == 0:  # where `smg-node members|join|leave` find this node, by its HTTP port
                    recorded.append((running.url.rpartition(":")[2], mesh.admin_url.removeprefix("http://")))
                    record_endpoint(recorded[0][1], recorded[0][0])
                running.state.metrics.add_state_source(lambda: mesh_metric_families(mesh.agent))
                running.state.metrics.add_state_source(lambda: cluster_metric_families(cluster))
                if config.discovery.enabled and config.discovery.router_selector:
                    nursery.start_soon(_follow_router_pods, config, mesh.agent)
            # One line on stdout, whatever the log level: scripts and supervisors wait for it.
            print(f"READY {running.url}  ({ready_note(running.state, cluster)})", flush=True)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                signals_seen = 0
                async for signum in signals:
                    signals_seen += 1
                    if signals_seen > 1:
                        log.warning("second signal: exiting now")
                        nursery.cancel_scope.cancel()
                        return
                    if running.shutdown.is_set() or running.state.status.shutting_down:
                        # Already leaving (`smg-node leave`, e.g. from a Kubernetes preStop hook, then the
                        # kubelet's SIGTERM): keep draining; only a second signal cuts it short.
                        log.info("signal %s: already leaving; draining goes on", signal.Signals(signum).name)
                        continue
                    log.info("signal %s: leaving and draining for up to %.0fs", signal.Signals(signum).name,
                             config.shutdown_grace_period_s)
                    running.state.status.shutting_down = True  # readiness fails at once: load balancers drain us
                    if mesh is not None:
                        nursery.start_soon(mesh.agent.leave)  # when it is done, the gateway drains
                    else:
                        running.shutdown.set()

    cannot_start: list[str] = []  # why the node could not start, said in one line rather than a traceback
    recorded: list[tuple[str, str]] = []  # (HTTP port, admin endpoint) this node recorded for the CLI
    data: list[DataDir] = []  # the data directory this process holds (locked), once opened
    try:
        trio.run(main)
    except* StoreUnavailable as failed:  # the history database or Redis cannot be reached at start
        cannot_start.append(f"{_first_of(failed)}; the node does not start without its history store")
    except* MeshBindError as failed:  # the mesh's ports are another process's
        cannot_start.append(str(_first_of(failed)))
    except* CredentialsError as failed:  # --service-discovery with no way to reach the API server
        cannot_start.append(str(_first_of(failed)))
    except* DataDirError as failed:  # the data directory is another node's, or cannot be made
        cannot_start.append(str(_first_of(failed)))
    finally:
        for directory in data:
            directory.close()
        for port, addr in recorded:
            forget_endpoint(port, addr)
    if cannot_start:
        print(f"smg-node serve: {cannot_start[0]}", file=sys.stderr)
        return 1
    return 0


def _first_of(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group

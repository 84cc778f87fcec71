"""``smg-node serve --workers N``: N gateway processes on one HTTP port, each a mesh member.

One Python process uses one core (the GIL), so a node runs N full gateway
processes. They share the HTTP port through SO_REUSEPORT: the kernel spreads
incoming connections over the processes' listening sockets. The supervisor
(this module) holds the port reserved (a bound, never listening socket, so
``--port 0`` resolves once for every process), starts the processes, restarts
one that dies, and relays signals.

How the processes share the node's state — each is a member of the mesh in
its own right, not a client of one agent per node:

* Every piece of shared state (worker registry, KV index, rate-limit
  counters, settings) already has a replication path that is correct between
  members; a worker process is one more member, so no second protocol
  (process-to-agent IPC) exists to get wrong, and a crashed process is
  detected and handed over exactly like a crashed node.
* Rate limits stay exact cluster-wide: a key has one owner among all
  processes of all nodes.
* A KV event stream is followed by its ring owners only, whatever the number
  of processes; the others receive the forwarded batches. In a node's private
  mesh one process follows each engine (``--kv-event-followers 1``): with two
  followers two processes both decoded and indexed every batch and sent each
  other copies to drop, which made a long request cost 2.3x the CPU of one
  process (tests/bench/workers_scaling.py).

What it costs: members = nodes x processes (gossip and push-pull grow with it;
a 5-node cluster of 8-core machines is 40 members, well within SWIM's reach),
and each process keeps its own replica of the KV index and registry (memory x
N). Requests are not shared: a process's admission queue and tokenizer caches
are its own.

Ports: process i uses the HTTP port (shared), the mesh port + i, the admin
(``--rpc-addr``) port + i and the separate metrics port + i; process 0 keeps
the configured name and ports, so ``smg-node members`` and friends reach it as
before, and the others are named ``NAME-w<i>``. Processes 1..N-1 join
process 0 (and the configured seeds). Without ``--mesh-bind`` the processes
form a private mesh on loopback (ports picked free, a random gossip key), so
that workers added at run time and rate limits still reach every process.

Signals: SIGTERM/SIGINT go to every process (each leaves and drains; a second
signal cuts them short). A process that exits 0 left the cluster
(``smg-node leave``): the node stops. A process that dies otherwise is
restarted (backoff 1 s doubling to 30 s). If the supervisor itself is killed,
its processes see their stdin pipe close and stop at once.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import trio

from mesh.crypto import generate_key
from mesh.options import default_node_name
from mesh.transport import split_addr

from .config import GatewayConfig, secrets_to_environment
from ..observe.logs import setup_logging

log = logging.getLogger("gateway.supervisor")

RESTART_BACKOFF_FIRST_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
# A process that ran this long before dying restarts after the first backoff again.
RESTART_BACKOFF_RESET_AFTER_S = 60.0
# Set in the environment of the processes the supervisor starts.
SUPERVISED_ENV = "SMG_NODE_SUPERVISED"
# The longest the other processes wait for process 0 to be up before they start anyway (their joins retry).
FIRST_PROCESS_WAIT_S = 120.0


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, bounded by a cgroup v2 CPU quota (containers)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max", encoding="ascii").read().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def default_worker_count(cores: int) -> int:
    """``--workers 0``: one process per core less one, at least one (1 on 2 cores, 3 on 4, 15 on 16).

    A process is more than its event loop: its encoder and media threads (long prompts and images,
    outside the GIL), the kernel's work on its sockets and the mesh beside it use another core's worth
    between them when it is busy. And every process adds its own costs to the node's (measured as a
    whole: among them its wake-ups for each engine decode step that carries one of its streams, its
    health and load polls, its share of the private mesh): on 2 cores, one process per core cost
    1.15-1.49x the CPU per request of one process on a mix of chats at 64 and 256 clients, in three
    runs (tests/bench/mixed_traffic.py, BENCHMARKS), for a second event loop that only a load above
    one core's worth of the gateway's own work uses; ``--workers 2`` keeps it for such a load."""
    return max(1, cores - 1)


def worker_count(config: GatewayConfig) -> int:
    return config.workers or default_worker_count(available_cores())


async def exit_when_supervisor_dies(cancel_scope: trio.CancelScope) -> None:
    """In a worker process: the supervisor's end of our stdin closes when it dies; then stop at once."""
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    try:
        while await stdin.receive_some(4096):
            pass
    except (trio.BrokenResourceError, OSError):
        pass
    log.error("the supervisor is gone: this worker process stops")
    cancel_scope.cancel()


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (never listen) host:port with SO_REUSEPORT: the port is ours, and the processes may share it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def ephemeral_port_low() -> int:
    """The first port of the kernel's range for outgoing connections (Linux default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_udp_tcp_port(host: str, rng: random.Random | None = None) -> int:
    """A port free for both UDP (gossip) and TCP (push-pull) on host, as the mesh transport needs.

    Picked below the kernel's range for outgoing connections: a port from that range (what binding
    port 0 gives) is free for any outgoing connection while its process is being restarted, and one
    taking it made the restarted process fail to bind its mesh port (EADDRINUSE) and die again.
    """
    rng = rng or random.Random()
    high = ephemeral_port_low()
    low = max(1024, high - 16384)
    candidates = [rng.randrange(low, high) for _ in range(200)] if high - low >= 1024 else []
    for port in candidates + [0] * 50:  # port 0 (the kernel's pick) only if nothing below is free
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            try:
                udp.bind((host, port))
            except OSError:
                continue
            port = udp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind((host, port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no free port for the workers' mesh")


def _with_port(addr: str, offset: int) -> str:
    host, port = split_addr(addr)
    host_text = f"[{host}]" if ":" in host else host
    return f"{host_text}:{port + offset}"


def worker_arguments(config: GatewayConfig, count: int, http_port: int) -> tuple[list[list[str]], dict[str, str]]:
    """The flags each process adds to the supervisor's own command line (later flags win), and what
    their environment gains (a private mesh's key: not on command lines, which every local user sees)."""
    mesh = config.mesh
    shared: list[str] = []
    env: dict[str, str] = {}
    if mesh.enabled:
        bind_host, bind_port = split_addr(mesh.bind)
        base_name = mesh.node_name or default_node_name(mesh.advertise or mesh.bind)
        rpc_addr = mesh.rpc_bind
        if bind_port == 0:
            bind_port = free_udp_tcp_port(bind_host)
        binds = [f"{bind_host}:{bind_port + i}" for i in range(count)]
        advertises = [_with_port(mesh.advertise, i) if mesh.advertise else None for i in range(count)]
    else:
        # A private mesh on loopback, so that run-time worker registrations and rate limits reach every
        # process; nobody outside the node knows its key.
        bind_host = "127.0.0.1"
        binds = [f"{bind_host}:{free_udp_tcp_port(bind_host)}" for _ in range(count)]
        advertises = [None] * count
        base_name = f"{socket.gethostname()}-{http_port}"
        rpc_addr = mesh.rpc_addr or "127.0.0.1:0"  # --rpc-addr when given (it was ignored here), else the kernel's
        shared += ["--mesh-preset", "local", "--kv-event-followers", "1", "--mesh-private"]
        env["SMG_NODE_ENCRYPT"] = generate_key()
    if config.tokenizer.encode_threads == 0:
        # Each process's share of the cores: one encoder thread per core in every process would
        # build N x cores encoders (~56 MB each) for cores that are already N processes' loops.
        shared += ["--encode-threads", str(math.ceil(available_cores() / count))]
    # Every process carries the node's name as a tag: `smg-node members` groups a node's processes.
    shared += ["--tag", *(f"{k}={v}" for k, v in mesh.tags if k != "node"), f"node={base_name}"]
    first_address = advertises[0] or binds[0]
    out = []
    for i in range(count):
        args = ["--workers", "1", "--http-reuse-port", "--worker-index", str(i), "--port", str(http_port),
                "--mesh-bind", binds[i], "--node-name", base_name if i == 0 else f"{base_name}-w{i}", *shared]
        if advertises[i]:
            args += ["--mesh-advertise", advertises[i]]
        args += ["--rpc-addr", rpc_addr if i == 0 or rpc_addr.endswith(":0") else _with_port(rpc_addr, i)]
        seeds = list(mesh.join) + ([first_address] if i > 0 else [])
        if seeds:
            args += ["--join", *seeds]
        if i > 0:
            args += ["--retry-join-interval-secs", "0.5"]  # process 0 may still be starting
        out.append(args)
    return out, env


class _Worker:
    def __init__(self, index: int, argv: list[str]) -> None:
        self.index = index
        self.argv = argv
        self.process: trio.Process | None = None
        self.ready = trio.Event()
        self.ready_note = ""  # what its READY line said after the URL: "  (1 worker, ...)"
        self.started_at = 0.0
        self.backoff_s = RESTART_BACKOFF_FIRST_S


class Supervisor:
    def __init__(self, config: GatewayConfig, serve_argv: list[str]) -> None:
        self.config = config
        self.count = worker_count(config)
        self._serve_argv = serve_argv
        self._stopping = False
        self._url = ""
        self._workers: list[_Worker] = []
        self._env: dict[str, str] = {}
        self._stopped = trio.Event()
        self._announced = False  # READY said: from then on a process that exits is restarted
        self.exit_code = 0

    async def run(self) -> None:
        host = self.config.host
        reserved = reserve_port(host, self.config.port)
        http_port = reserved.getsockname()[1]
        host_text = f"[{host}]" if ":" in host else host
        self._url = f"http://{host_text}:{http_port}"
        try:
            async with trio.open_nursery() as outer:
                per_process, self._env = worker_arguments(self.config, self.count, http_port)
                # Secrets given as flags reach the processes by environment: their command lines are public.
                serve_argv, secrets = secrets_to_environment(self._serve_argv)
                self._env.update(secrets)
                self._workers = [_Worker(i, [sys.executable, "-m", "gateway.cli", "serve", *serve_argv, *extra])
                                 for i, extra in enumerate(per_process)]
                outer.start_soon(self._relay_signals)
                outer.start_soon(self._announce_ready, self._workers)
                async with trio.open_nursery() as running:
                    # Process 0 first: the others join its mesh, and a seed that is not up yet made every start
                    # log "join attempt 1 failed" between a node's own processes.
                    running.start_soon(self._keep_running, self._workers[0])
                    with trio.move_on_after(FIRST_PROCESS_WAIT_S):
                        await self._first_ready_or_stopping()
                    for worker in self._workers[1:]:
                        running.start_soon(self._keep_running, worker)
                outer.cancel_scope.cancel()  # every process is gone
        finally:
            reserved.close()

    async def _first_ready_or_stopping(self) -> None:
        async with trio.open_nursery() as either:
            async def first_ready() -> None:
                await self._workers[0].ready.wait()
                either.cancel_scope.cancel()

            async def stopping() -> None:
                await self._stopped.wait()
                either.cancel_scope.cancel()

            either.start_soon(first_ready)
            either.start_soon(stopping)

    async def _announce_ready(self, workers: list[_Worker]) -> None:
        for worker in workers:
            await worker.ready.wait()
        self._announced = True
        log.info("smg-node serving on %s with %d worker processes", self._url, self.count)
        # One line on stdout, whatever the log level: scripts and supervisors wait for it.
        print(f"READY {self._url}{workers[0].ready_note if workers else ''}", flush=True)

    async def _keep_running(self, worker: _Worker) -> None:
        while not self._stopping:
            worker.started_at = time.monotonic()
            # stdin is a pipe nobody writes to: when the supervisor dies, however it dies, the process
            # reads end-of-file and exits (PR_SET_PDEATHSIG would fire when the spawning *thread* exits,
            # and trio spawns from its worker threads).
            # A session of its own: the terminal's Ctrl-C (SIGINT to the foreground process group) reaches the
            # supervisor alone, which passes one SIGTERM on. It reached every process too, and each then took
            # the supervisor's SIGTERM as a second signal: exit now, streams in flight cut, no drain.
            process = await trio.lowlevel.open_process(worker.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                       env={**os.environ, **self._env, SUPERVISED_ENV: "1"},
                                                       start_new_session=True)
            worker.process = process
            async with trio.open_nursery() as relay:
                relay.start_soon(self._relay_output, worker, process)
                code = await process.wait()
            if self._stopping:
                return
            if code == 0:
                log.info("worker process %d left the cluster: the node stops", worker.index)
                self._stop()
                return
            if not self._announced:
                # It failed before the node ever served (a port another process holds, a store that cannot be
                # reached): restarting would loop on the same error while the node never says READY nor exits.
                log.error("worker process %d could not start (exit %s, its reason above): the node stops",
                          worker.index, code)
                self.exit_code = 1
                self._stop()
                return
            lived_s = time.monotonic() - worker.started_at
            if lived_s > RESTART_BACKOFF_RESET_AFTER_S:
                worker.backoff_s = RESTART_BACKOFF_FIRST_S
            log.error("worker process %d exited with %s after %.0fs; restarting in %.0fs", worker.index, code,
                      lived_s, worker.backoff_s)
            await trio.sleep(worker.backoff_s)
            worker.backoff_s = min(worker.backoff_s * 2, RESTART_BACKOFF_MAX_S)

    @staticmethod
    async def _relay_output(worker: _Worker, process: trio.Process) -> None:
        """The processes' stdout: their READY lines are ours to count; anything else passes through."""
        buffered = b""
        async for chunk in process.stdout:
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                if line.startswith(b"READY "):
                    _, _, note = line.decode("utf-8", "replace").partition(" ")[2].partition(" ")
                    worker.ready_note = " " + note if note else ""
                    worker.ready.set()
                else:
                    sys.stdout.buffer.write(line + b"\n")
                    sys.stdout.flush()

    def _stop(self) -> None:
        self._stopping = True
        self._stopped.set()
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, signum: int) -> None:
        for worker in self._workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signum)

    async def _relay_signals(self) -> None:
        """The first SIGTERM or SIGINT (Ctrl-C) drains: one SIGTERM to each process. A second exits now: a second
        SIGTERM, which each process takes as such."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self._stopping:
                    log.warning("signal %s again: the worker processes exit now", name)
                else:
                    log.info("signal %s: the worker processes drain, then exit (again: at once)", name)
                self._stop()


def run_supervisor(config: GatewayConfig, serve_argv: list[str]) -> int:
    """Blocking entry point of ``smg-node serve --workers N`` (N > 1)."""
    setup_logging(config.log_level, config.log_json)
    supervisor = Supervisor(config, serve_argv)
    trio.run(supervisor.run)
    return supervisor.exit_code

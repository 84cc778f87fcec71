"""The supervisor: real smg-node processes, simulated engines and a load balancer on 127.0.0.1.

Every node has fixed ports (HTTP, gossip, admin) so that a restarted node comes
back with the same name and address, and the load balancer's config stays
valid. Process faults are signals: SIGKILL, SIGSTOP/SIGCONT, restart. Network
faults are rules files, one per node, read by the node's mesh transport
(``mesh/faults.py``): the supervisor writes both sides of every cut link.
"""

from __future__ import annotations

import dataclasses
import os
import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx2

from chaos.processes import EngineProcess, NodeProcess
from deploy.balancer import start_balancer, stop_balancer
from gateway import port_holder
from mesh.crypto import generate_key
from mesh.faults import FAULTS_ENV, SEED_ENV

LIMITS_TOML = """
failure_policy = "proportional"

[[limits]]
name = "per-key"
scope = "api_key"
limit = {per_key_limit}
burst = {per_key_burst}
"""


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 5
    engines: int = 2
    # Models the engines serve: engine j serves MODELS[j % models]. One by default; a model's outage
    # (kill-model-engines) needs two, on separate engines.
    models: int = 1
    # Prefill/decode disaggregation: the first half of the engines run as prefill engines, the others as decode
    # engines (SGLang's contract: one bootstrap room per request), registered in those roles.
    pd: bool = False
    # Processes per node (--workers): a node's processes are one machine's, killed and paused together.
    workers: int = 1
    seed: int = 42
    # node i: HTTP base+i, gossip base+100+i*workers (+k for its process k), admin base+200+i*workers (+k); LB
    # base+300. Below 32768: the kernel
    # hands out ports above it to outgoing connections, which could take a fixed port first.
    base_port: int = 21000
    lb: str = "nginx"
    # The nodes' mesh timers: `local` (5x memberlist's, for one machine) unless a scenario measures the deployed
    # `lan` preset (kill-in-turn's crash detection).
    mesh_preset: str = "local"
    # How often the observer reads every node's view: the resolution of what the checks see.
    observe_interval_s: float = 0.5
    per_key_limit: float = 20.0  # requests per second per API key, cluster-wide
    per_key_burst: float = 5.0
    # Engines: a few milliseconds per token, so requests are in flight when faults strike.
    engine_args: tuple[str, ...] = ("--itl-base-s", "0.002", "--itl-per-running-s", "0", "--eos-after-tokens", "64",
                                    "--block-size", "16")


MODELS = ("qwen3-sim", "qwen3-sim-b")  # the first is the simulated engine's default name


class PortsTaken(RuntimeError):
    """A fixed port of the cluster is held by something else: nothing was started."""


class ChaosCluster:
    def __init__(self, spec: ClusterSpec, run_dir: Path) -> None:
        self.spec = spec
        self.dir = run_dir.resolve()  # nginx -p wants absolute paths
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = generate_key()
        self.engines: list[EngineProcess | None] = []
        self.engine_ports: list[int] = []
        self.bootstrap_ports: list[int] = []  # prefill engines' (0 for the others)
        self.nodes: list[NodeProcess | None] = [None] * spec.nodes
        self.paused: set[int] = set()
        self.balancer: subprocess.Popen | None = None
        self.limits_file = self.dir / "limits.toml"
        self.limits_file.write_text(LIMITS_TOML.format(per_key_limit=spec.per_key_limit,
                                                       per_key_burst=spec.per_key_burst))
        self._cut: set[frozenset[int]] = set()
        self._loss = 0.0
        # The nodes' shared admin token (set when the first node starts): for /workers, /admin/...
        # and the mesh's admin endpoint.
        self.admin_headers: dict[str, str] = {}

    # -- addresses --------------------------------------------------------

    def name(self, i: int) -> str:
        return f"node{i}"

    def http_port(self, i: int) -> int:
        return self.spec.base_port + i

    def gossip_addr(self, i: int, k: int = 0) -> str:
        """Node i's process k's gossip address (the supervisor gives process k the node's port + k)."""
        return f"127.0.0.1:{self.spec.base_port + 100 + i * self.spec.workers + k}"

    def admin_addr(self, i: int, k: int = 0) -> str:
        return f"127.0.0.1:{self.spec.base_port + 200 + i * self.spec.workers + k}"

    def members(self, i: int) -> list[str]:
        """The mesh members node i's processes are (the supervisor names process k node-wk)."""
        return [self.name(i)] + [f"{self.name(i)}-w{k}" for k in range(1, self.spec.workers)]

    def node_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.http_port(i)}"

    @property
    def lb_url(self) -> str:
        return f"http://127.0.0.1:{self.spec.base_port + 300}"

    @property
    def models(self) -> list[str]:
        return list(MODELS[:self.spec.models])

    def model_of(self, j: int) -> str:
        """The model engine ``j`` serves."""
        return MODELS[j % self.spec.models]

    def engines_of(self, model: str) -> list[int]:
        return [j for j in range(self.spec.engines) if self.model_of(j) == model]

    def engine_args(self, j: int) -> list[str]:
        args = [*self.spec.engine_args, "--model-name", self.model_of(j)]
        if self.spec.pd:
            args += ["--services", "sglang", "--role", self.role_of(j), "--handover-timeout-s", "5"]
            if j < len(self.bootstrap_ports):  # a restarted prefill listens where the nodes expect it
                args += ["--bootstrap-port", str(self.bootstrap_ports[j])]
        return args

    def role_of(self, j: int) -> str:
        """Engine ``j``'s role: regular, or in a PD cluster prefill (the first half) or decode."""
        if not self.spec.pd:
            return "regular"
        return "prefill" if j < self.spec.engines // 2 else "decode"

    def rules_path(self, i: int) -> Path:
        return self.dir / f"faults-node{i}.json"

    # -- lifecycle ----------------------------------------------------------

    def ports(self) -> list[tuple[str, int]]:
        """Every fixed port the cluster takes: (kind, port), TCP unless said."""
        out = []
        for i in range(self.spec.nodes):
            out.append(("tcp", self.http_port(i)))
            for k in range(self.spec.workers):
                gossip = int(self.gossip_addr(i, k).rpartition(":")[2])
                out += [("tcp", gossip), ("udp", gossip), ("tcp", int(self.admin_addr(i, k).rpartition(":")[2]))]
        return out + [("tcp", self.spec.base_port + 300)]

    def taken_ports(self) -> list[str]:
        """The fixed ports something else holds now (a previous run's processes, another program): described."""
        taken = []
        for kind, port in self.ports():
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
            try:
                if kind == "tcp":  # as the nodes bind theirs: a connection in TIME_WAIT holds nothing
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("127.0.0.1", port))
            except OSError:
                holder = port_holder(port) if kind == "tcp" else None
                taken.append(f"{kind} {port}" + (f" (held by {holder})" if holder else ""))
            finally:
                probe.close()
        return taken

    def start(self) -> None:
        taken = self.taken_ports()
        if taken:
            raise PortsTaken(f"the cluster's ports from {self.spec.base_port} are not free: {', '.join(taken[:4])}"
                             + (f" and {len(taken) - 4} more" if len(taken) > 4 else ""))
        try:
            for j in range(self.spec.engines):
                self.engines.append(EngineProcess(self.engine_args(j), self.dir, f"engine{j}"))
                self.engine_ports.append(int(self.engines[j].url.rpartition(":")[2]))
                self.bootstrap_ports.append(self.engines[j].bootstrap_port or 0)
            self._write_rules()
            for i in range(self.spec.nodes):
                self.start_node(i)
            addrs = [f"127.0.0.1:{self.http_port(i)}" for i in range(self.spec.nodes)]
            self.balancer = start_balancer(self.spec.lb, self.dir / self.spec.lb, self.spec.base_port + 300, addrs)
        except BaseException:
            self.stop()
            raise

    def start_node(self, i: int) -> None:
        args = ["--port", str(self.http_port(i)), "--node-name", self.name(i), "--mesh-bind", self.gossip_addr(i),
                "--join", self.gossip_addr(0), self.gossip_addr(1 % self.spec.nodes),
                "--mesh-preset", self.spec.mesh_preset, "--rpc-addr", self.admin_addr(i), "--retry-join-interval-secs", "0.5",
                "--rate-limits", str(self.limits_file), "--health-check-interval-secs", "0.5",
                "--health-failure-threshold", "2", "--log-level", os.environ.get("SMG_CHAOS_NODE_LOG_LEVEL", "warning"),
                "--shutdown-grace-period-secs", "10", "--workers", str(self.spec.workers)]
        if i == 0 and self.spec.pd:  # engines are registered on one node; the others get them through the mesh
            args += ["--pd-disaggregation"]
            for j, port in enumerate(self.engine_ports):
                args += ["--prefill", f"grpc://127.0.0.1:{port}", str(self.bootstrap_ports[j])] \
                    if self.role_of(j) == "prefill" else ["--decode", f"grpc://127.0.0.1:{port}"]
        elif i == 0:
            args += ["--worker-urls", *[f"grpc://127.0.0.1:{p}" for p in self.engine_ports]]
        # The gossip key by environment: a command line is every local user's to read.
        env = {FAULTS_ENV: str(self.rules_path(i)), SEED_ENV: str(self.spec.seed), "SMG_NODE_ENCRYPT": self.key}
        # A node started again keeps its data directory, as a restarted machine keeps its disk.
        self.nodes[i] = NodeProcess(args, self.dir, f"{self.name(i)}", env=env,
                                    data_dir=self.dir / f"data-{self.name(i)}")
        self.admin_headers = self.nodes[i].admin_headers

    def stop(self) -> None:
        for i in list(self.paused):
            self.resume(i)
        if self.balancer is not None:
            stop_balancer(self.spec.lb, self.balancer)
        for node in self.nodes:
            if node is not None:
                node.kill_machine()
        for engine in self.engines:
            if engine is not None:
                engine.kill()

    # -- process faults -----------------------------------------------------

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None:
            node.kill_machine()

    def pause(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None and node.alive:
            node.signal_machine(signal.SIGSTOP)
            self.paused.add(i)

    def resume(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None and i in self.paused:
            node.signal_machine(signal.SIGCONT)
            self.paused.discard(i)

    def restart(self, i: int, graceful: bool = True) -> None:
        node = self.nodes[i]
        if node is not None:
            if graceful:
                node.stop(15)
            else:
                node.kill_machine()
        self.start_node(i)

    def wait_ready(self, i: int, bound_s: float = 30.0) -> bool:
        """Until node ``i`` says it is ready (``/readiness``: joined, the cluster's registry received), polling, at most
        ``bound_s``; whether it did. What an operator waits for before taking the next node down."""
        deadline = time.monotonic() + bound_s
        with httpx2.Client(timeout=2) as client:
            while time.monotonic() < deadline:
                node = self.nodes[i]
                try:
                    if node is not None and client.get(node.url + "/readiness").status_code == 200:
                        return True
                except httpx2.HTTPError:
                    pass
                time.sleep(0.1)
        return False

    def force_leave(self, at: int, victim: int, wait_s: float = 30.0) -> None:
        """What an operator does for a node gone for good: once node ``at`` holds it failed (``smg-node members``),
        ``smg-node force-leave`` there (its admin endpoint). Waits, polling, while the victim is only suspected."""
        deadline = time.monotonic() + wait_s
        with httpx2.Client(timeout=5, headers=self.admin_headers) as client:
            while True:
                r = client.post(f"http://{self.admin_addr(at)}/v1/force-leave", json={"member": self.name(victim)})
                if r.status_code == 200:
                    return
                if r.status_code != 409 or time.monotonic() > deadline:
                    raise RuntimeError(f"force-leave of {self.name(victim)} on {self.name(at)}: {r.status_code} "
                                       f"{r.text[:300]}")
                time.sleep(0.2)  # still alive or suspected there: the operator waits for "failed"

    def restart_engine(self, j: int) -> None:
        self.kill_engine(j)
        self.start_engine(j)

    def kill_engine(self, j: int) -> None:
        engine = self.engines[j]
        if engine is not None:
            engine.kill()

    def start_engine(self, j: int) -> None:
        """Engine ``j`` again, on its port (the nodes know it by its address)."""
        args = [*self.engine_args(j), "--port", str(self.engine_ports[j])]
        self.engines[j] = EngineProcess(args, self.dir, f"engine{j}")

    def running(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n is not None and n.alive]

    # -- network faults -----------------------------------------------------

    def partition(self, *groups: "list[int]") -> None:
        for a, group in enumerate(groups):
            for other in groups[a + 1:]:
                self._cut |= {frozenset((x, y)) for x in group for y in other}
        self._write_rules()

    def set_loss(self, drop: float) -> None:
        self._loss = drop
        self._write_rules()

    def heal(self) -> None:
        self._cut.clear()
        self._loss = 0.0
        self._write_rules()

    def _write_rules(self) -> None:
        for i in range(self.spec.nodes):
            peers = {self.gossip_addr(j, k): {"drop": 1.0} for j in range(self.spec.nodes)
                     for k in range(self.spec.workers) if frozenset((i, j)) in self._cut}
            rules = {"default": {"drop": self._loss}, "peers": peers}
            tmp = self.rules_path(i).with_suffix(".tmp")
            tmp.write_text(json.dumps(rules))
            tmp.replace(self.rules_path(i))  # atomic: a node never reads half a file

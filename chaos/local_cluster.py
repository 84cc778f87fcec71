"""A cluster on one machine: N smg-node processes, simulated engines, and a real load balancer in front.

    python -m chaos.local_cluster --nodes 3 --engines 2 [--port 8080] [--lb nginx|haproxy]

Everything listens on 127.0.0.1; Ctrl-C stops it all. The nodes form a mesh
(``local`` preset), share their workers (the engines are registered on the
first node only and reach the others through the mesh) and sit behind nginx
(``deploy/nginx/smg-node.conf.template``) or HAProxy
(``deploy/haproxy/smg-node.cfg.template``), both Debian packages, rendered by
``deploy/balancer.py``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from deploy.balancer import LOAD_BALANCERS, start_balancer, stop_balancer
from mesh.crypto import generate_key

from .processes import EngineProcess, NodeProcess


class LocalCluster:
    def __init__(self, nodes: int, engines: int, port: int, mesh_base_port: int = 17946,
                 log_dir: Path | None = None, engine_args: "list[str] | None" = None, lb: str = "nginx") -> None:
        if lb not in LOAD_BALANCERS:
            raise ValueError(f"lb must be one of {', '.join(LOAD_BALANCERS)}")
        if shutil.which(lb) is None:
            raise RuntimeError(f"{lb} is not installed (Debian: apt-get install {lb})")
        self.lb = lb
        self.dir = log_dir or Path(tempfile.mkdtemp(prefix="smg-local-cluster-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.engines: list[EngineProcess] = []
        self.nodes: list[NodeProcess] = []
        self._node_args: list[list[str]] = []
        self.balancer: subprocess.Popen | None = None
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        try:
            self._start(nodes, engines, mesh_base_port, engine_args or [])
        except BaseException:
            self.stop()  # nothing half-started is left behind
            raise

    def _start(self, nodes: int, engines: int, mesh_base_port: int, engine_args: "list[str]") -> None:
        self.engines = [EngineProcess(engine_args, self.dir, f"engine{i}") for i in range(engines)]
        self._env = {"SMG_NODE_ENCRYPT": generate_key()}  # by environment: a command line is public
        for i in range(nodes):
            args = ["--mesh-bind", f"127.0.0.1:{mesh_base_port + i}", "--join", f"127.0.0.1:{mesh_base_port}",
                    "--node-name", f"node{i}", "--mesh-preset", "local",
                    "--rpc-addr", f"127.0.0.1:{mesh_base_port + 100 + i}", "--retry-join-interval-secs", "0.5"]
            if i == 0:
                args += ["--worker-urls", *[e.url for e in self.engines]]
            self._node_args.append(args)
            self.nodes.append(NodeProcess(args, self.dir, f"node{i}", env=self._env))
        self.balancer = self._start_balancer()

    def restart(self, i: int) -> NodeProcess:
        """Node ``i`` again (after a kill): same name, mesh address and data directory, a fresh process and memory.
        Its HTTP port is new, so the balancer does not know it: reach it at ``nodes[i].url``."""
        self.nodes[i].stop()
        self.nodes[i] = NodeProcess(self._node_args[i], self.dir, f"node{i}-again", env=self._env,
                                    data_dir=self.nodes[i].data_dir)
        return self.nodes[i]

    def _start_balancer(self) -> subprocess.Popen:
        addrs = [n.url.removeprefix("http://") for n in self.nodes]
        return start_balancer(self.lb, self.dir / self.lb, self.port, addrs)

    def stop(self) -> None:
        if self.balancer is not None:
            stop_balancer(self.lb, self.balancer)
        for n in self.nodes:
            n.stop()
        for e in self.engines:
            e.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--lb", choices=LOAD_BALANCERS, default="nginx")
    args = parser.parse_args()
    cluster = LocalCluster(args.nodes, args.engines, args.port, engine_args=["--eos-after-tokens", "64"], lb=args.lb)
    print(f"READY {cluster.url}  (nodes: {', '.join(n.url for n in cluster.nodes)}; logs: {cluster.dir})",
          flush=True)
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()

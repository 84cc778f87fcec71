"""A cluster on one machine: N smg-node processes, simulated engines, and a real load balancer in front.

    python deploy/local_cluster.py --nodes 3 --engines 2 [--port 8080] [--lb nginx|haproxy]

Everything listens on 127.0.0.1; Ctrl-C stops it all. The nodes form a mesh
(``local`` preset), share their workers (the engines are registered on the
first node only and reach the others through the mesh) and sit behind nginx
(``deploy/nginx/smg-node.conf.template``) or HAProxy
(``deploy/haproxy/smg-node.cfg.template``), both Debian packages.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chaos.processes import EngineProcess, NodeProcess  # noqa: E402
from mesh.crypto import generate_key  # noqa: E402

NGINX_TEMPLATE = Path(__file__).parent / "nginx" / "smg-node.conf.template"
HAPROXY_TEMPLATE = Path(__file__).parent / "haproxy" / "smg-node.cfg.template"
LOAD_BALANCERS = ("nginx", "haproxy")


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
        key = generate_key()
        for i in range(nodes):
            args = ["--mesh-bind", f"127.0.0.1:{mesh_base_port + i}", "--join", f"127.0.0.1:{mesh_base_port}",
                    "--node-name", f"node{i}", "--encrypt", key, "--mesh-preset", "local",
                    "--rpc-addr", f"127.0.0.1:{mesh_base_port + 100 + i}", "--retry-join-interval-secs", "0.5"]
            if i == 0:
                args += ["--worker-urls", *[e.url for e in self.engines]]
            self.nodes.append(NodeProcess(args, self.dir, f"node{i}"))
        self.balancer = self._start_balancer()

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


def balancer_argv(lb: str, prefix: Path, port: int, node_addrs: "list[str]") -> list[str]:
    """The command line of nginx or HAProxy in front of ``node_addrs`` (host:port), its config in ``prefix``."""
    prefix.mkdir(parents=True, exist_ok=True)
    listen = f"127.0.0.1:{port}"
    if lb == "nginx":
        servers = "\n".join(f"        server {a} max_fails=1 fail_timeout=5s;" for a in node_addrs)
        conf = prefix / "nginx.conf"
        conf.write_text(NGINX_TEMPLATE.read_text().format(listen=listen, upstream_servers=servers, prefix=prefix))
        return ["nginx", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"]
    servers = "\n".join(f"    server node{i} {a}" for i, a in enumerate(node_addrs))
    conf = prefix / "haproxy.cfg"
    conf.write_text(HAPROXY_TEMPLATE.read_text().format(listen=listen, servers=servers, prefix=prefix))
    check = subprocess.run(["haproxy", "-c", "-f", str(conf)], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"haproxy refused its config: {check.stdout}{check.stderr}")
    return ["haproxy", "-db", "-f", str(conf)]  # -db: foreground


def start_balancer(lb: str, prefix: Path, port: int, node_addrs: "list[str]") -> subprocess.Popen:
    """Start nginx or HAProxy and return once it listens on 127.0.0.1:``port``."""
    if shutil.which(lb) is None:
        raise RuntimeError(f"{lb} is not installed (Debian: apt-get install {lb})")
    process = subprocess.Popen(balancer_argv(lb, prefix, port, node_addrs), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{lb} exited: {process.stderr.read().decode()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.05)  # neither prints anything when ready: wait for its port
    process.kill()
    raise RuntimeError(f"{lb} did not listen in time")


def stop_balancer(lb: str, process: subprocess.Popen) -> None:
    if process.poll() is None:
        # nginx finishes what it serves on SIGQUIT; HAProxy stops at once on SIGTERM.
        process.send_signal(signal.SIGQUIT if lb == "nginx" else signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


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

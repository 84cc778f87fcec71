"""nginx or HAProxy in front of N smg-node processes, from the templates beside this file.

``deploy/nginx/smg-node.conf.template`` and ``deploy/haproxy/smg-node.cfg.template``
are what an operator copies for a real cluster; the local cluster
(``chaos/local_cluster.py``) and the chaos harness render them for processes on
127.0.0.1. Both balancers are Debian packages (``apt-get install nginx haproxy``).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NGINX_TEMPLATE = Path(__file__).parent / "nginx" / "smg-node.conf.template"
HAPROXY_TEMPLATE = Path(__file__).parent / "haproxy" / "smg-node.cfg.template"
LOAD_BALANCERS = ("nginx", "haproxy")


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

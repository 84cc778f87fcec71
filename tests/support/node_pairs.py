"""Two nodes started together for a test: on their own (sharing a database), or meshed (sharing the memory
store, rate limits and the registry), returned once each sees the other."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx2

from chaos.processes import NodeProcess

from gateway.node.supervisor import free_udp_tcp_port
from tests.support.waiting import eventually


def mesh_args(i: int, ports: "list[int]", prefix: str) -> list[str]:
    """Node ``i`` of a meshed group (named ``{prefix}{i}``), from the group's free ports (two a node: the first half
    gossip, the second the admin RPC)."""
    count = len(ports) // 2
    return ["--mesh-bind", f"127.0.0.1:{ports[i]}", "--join", f"127.0.0.1:{ports[0]}", "--node-name", f"{prefix}{i}",
            "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{ports[count + i]}", "--retry-join-interval-secs",
            "0.5"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports below the kernel's range for outgoing connections, free for UDP and TCP: a port
    bound and released (free_port) was taken by some connection's ephemeral port before the node bound it (CI:
    the second node of a pair exited on EADDRINUSE)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_udp_tcp_port("127.0.0.1")
        if port not in ports:
            ports.append(port)
    return ports


def start_pair(argv: "Callable[[int, list[int]], list[str]]", log_dir: Path, name: str,
               count: int = 2, env: "dict[str, str] | None" = None) -> list[NodeProcess]:
    """``argv(i, ports)``: node i's serve arguments, given two free ports a node for the group's mesh (``count``
    nodes: a pair unless said); ``env``: the nodes' environment besides the test's."""
    nodes: list[NodeProcess] = []
    ports = free_ports(2 * count)
    try:
        for i in range(count):
            nodes.append(NodeProcess(argv(i, ports), log_dir, f"{name}{i}", env=env))
        if "--mesh-bind" in nodes[0].argv:  # each sees all: each record is on two of them
            eventually(lambda: all(alive_members(n) == count for n in nodes), 30, "the group's mesh did not form",
                       interval_s=0.1)
        return nodes
    except BaseException:
        for n in nodes:
            n.stop()
        raise


def alive_members(node: NodeProcess) -> float:
    text = httpx2.get(node.url + "/metrics").text
    match = re.search(r'^smg_mesh_members\{state="alive"\} (\S+)', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def admin(node: NodeProcess, method: str, path: str, body: "dict | None" = None) -> httpx2.Response:
    """A call to the node's control plane with its admin credential."""
    return httpx2.request(method, node.url + path, json=body, headers=node.admin_headers, timeout=30)

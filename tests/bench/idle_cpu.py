"""What a node costs with no requests: CPU per second of idle nodes, alone and meshed.

Not a test: it prints figures. Starts one zero-cost simulated engine and ``--nodes`` nodes in front
of it (meshed when more than one: gossip, push-pull, health checks by ring owner, the worker
document), waits ``--settle-s`` for joins and first syncs, then reads each node's CPU (user +
system, every thread of its process, from /proc) over ``--window-s`` with no request sent, and the
gossip bytes each sent meanwhile (``smg_mesh_bytes_total`` on its metrics).

    python tests/bench/idle_cpu.py [--nodes 1 3] [--window-s 60] [--settle-s 15]

/proc counts CPU in clock ticks (10 ms here): over 60 s a figure is good to ~0.2 ms/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import EngineProcess, NodeProcess, default_log_dir  # noqa: E402
from tests.bench.smg_compare import MODEL, model_dir  # noqa: E402
from tests.support.node_pairs import free_ports  # noqa: E402

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def gossip_bytes_sent(node: NodeProcess) -> float:
    """The node's gossip bytes sent so far (``smg_mesh_bytes_total``; 0 without a mesh)."""
    text = httpx2.get(f"{node.url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('smg_mesh_bytes_total{direction="sent"}'))


def node_args(i: int, count: int, ports: "list[int]", engine_url: str, model: Path) -> list[str]:
    args = ["--worker-urls", engine_url, "--tokenizer-path", str(model), "--log-level", "warning"]
    if count > 1:  # the LAN preset (the default), as a real cluster runs
        args += ["--mesh-bind", f"127.0.0.1:{ports[i]}", "--node-name", f"n{i}",
                 "--rpc-addr", f"127.0.0.1:{ports[count + i]}"]
        if i:
            args += ["--join", f"127.0.0.1:{ports[0]}"]
    return args


def measure(count: int, engine: EngineProcess, model: Path, log_dir: Path, settle_s: float,
            window_s: float) -> "list[tuple[str, float, float]]":
    """(node, CPU ms per idle second, gossip bytes sent per second) of each of ``count`` nodes."""
    ports = free_ports(2 * count)
    nodes: list[NodeProcess] = []
    try:
        for i in range(count):
            nodes.append(NodeProcess(node_args(i, count, ports, engine.url, model), log_dir, f"idle{count}-n{i}"))
        time.sleep(settle_s)
        cpu_before = [process_cpu_s(n.process.pid) for n in nodes]
        bytes_before = [gossip_bytes_sent(n) for n in nodes]
        started = time.monotonic()
        time.sleep(window_s)
        took_s = time.monotonic() - started
        cpu_after = [process_cpu_s(n.process.pid) for n in nodes]
        bytes_after = [gossip_bytes_sent(n) for n in nodes]
    finally:
        for n in nodes:
            n.stop()
    return [(n.name, (a - b) / took_s * 1000, (ba - bb) / took_s)
            for n, b, a, bb, ba in zip(nodes, cpu_before, cpu_after, bytes_before, bytes_after)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--settle-s", type=float, default=15.0)
    args = parser.parse_args()
    log_dir = default_log_dir()
    model = model_dir(log_dir)
    engine = EngineProcess(["--zero-cost", "--model-name", MODEL, "--tokenizer-path", str(model)], log_dir)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        rows = [(count, *row) for count in args.nodes
                for row in measure(count, engine, model, log_dir, args.settle_s, args.window_s)]
    finally:
        engine.stop()
    print(f"\nIdle nodes, one engine, no requests; {args.window_s:.0f} s after {args.settle_s:.0f} s to settle; "
          f"started {started}. Logs: {log_dir}\n")
    print("| nodes | node | CPU ms per s | gossip bytes sent per s |")
    print("|---|---|---|---|")
    for count, name, cpu_ms, gossip in rows:
        print(f"| {count} | {name} | {cpu_ms:.2f} | {gossip:.0f} |")


if __name__ == "__main__":
    main()

"""Store latency of the history backends, through real nodes: not a test, it prints figures.

    python tests/bench/history_bench.py [--ops 1000] [--backends lone memory3 memory5 redis postgres]

For each backend, real smg-node processes on 127.0.0.1 (no engine: the Conversations API needs none)
and one keep-alive client sending, one after the other, ``--ops`` writes (POST .../items: one 1 KiB
message added to a conversation) then ``--ops`` reads (GET .../items?limit=20), each to the next
node in turn; p50 and p99 of each, in milliseconds.

    lone      one node, memory backend, no mesh: the HTTP path with a store that costs ~nothing
    memory3   three nodes in a mesh: every node holds every conversation (reads local; a write
              runs at the primary, forwarded when it is another node, and waits for two copies)
    memory5   five nodes: 3 of 5 hold a conversation (some reads go to an owner, too)
    redis     one node, a real redis-server started here
    postgres  one node, a real PostgreSQL started here (fsync off: the machine's disk is not the point)

What a row minus ``lone`` is: the store's own latency on this machine, the network hop included.
Runs on two cores with every process on them: figures for comparing backends, not absolutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.processes import NodeProcess, default_log_dir  # noqa: E402
from mesh.crypto import generate_key  # noqa: E402
from tests.support.real_servers import postgres_server, redis_server  # noqa: E402

BASE_PORT = 39946
ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * 1024}]}


def pct(values: "list[float]", q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def mesh_args(i: int, key: str) -> "list[str]":
    return ["--mesh-bind", f"127.0.0.1:{BASE_PORT + i}", "--join", f"127.0.0.1:{BASE_PORT}", "--node-name", f"h{i}",
            "--encrypt", key, "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{BASE_PORT + 100 + i}",
            "--retry-join-interval-secs", "0.5", "--log-level", "warning"]


def start_nodes(backend: str, stack: ExitStack, log_dir: Path) -> "list[NodeProcess]":
    common = ["--log-level", "warning"]
    if backend in ("memory3", "memory5"):
        key, count = generate_key(), int(backend[-1])
        nodes = [NodeProcess(mesh_args(i, key), log_dir, f"{backend}-{i}") for i in range(count)]
    elif backend == "redis":
        url = stack.enter_context(redis_server(Path(tempfile.mkdtemp(prefix="bench-redis-"))))
        nodes = [NodeProcess([*common, "--history-backend", "redis", "--redis-url", url], log_dir, backend)]
    elif backend == "postgres":
        url = stack.enter_context(postgres_server(Path(tempfile.mkdtemp(prefix="bench-pg-"))))
        nodes = [NodeProcess([*common, "--history-backend", "postgres", "--postgres-db-url", url], log_dir, backend)]
    else:
        nodes = [NodeProcess(common, log_dir, backend)]
    for node in nodes:
        stack.callback(node.stop)
    if len(nodes) > 1:  # every node sees every other before we measure
        deadline = time.monotonic() + 60
        while not all(_ring_size(n) == len(nodes) for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the mesh did not form")
            time.sleep(0.2)
    return nodes


def _ring_size(node: NodeProcess) -> int:
    text = httpx2.get(node.url + "/metrics").text
    for line in text.splitlines():
        if line.startswith("smg_mesh_members{") and 'state="alive"' in line:
            return int(float(line.split()[-1]))
    return 0


def measure(nodes: "list[NodeProcess]", ops: int) -> "dict[str, list[float]]":
    times: dict[str, list[float]] = {"write": [], "read": []}
    with httpx2.Client(timeout=30) as client:
        conversations = [client.post(nodes[0].url + "/v1/conversations", json={}).json()["id"] for _ in range(50)]
        for phase in ("write", "read"):
            for k in range(ops + ops // 10):
                node = nodes[k % len(nodes)]
                conversation = conversations[k % len(conversations)]
                url = f"{node.url}/v1/conversations/{conversation}/items"
                start = time.perf_counter()
                if phase == "write":
                    r = client.post(url, json={"items": [ITEM]})
                else:
                    r = client.get(url, params={"limit": 20})
                elapsed = time.perf_counter() - start
                if r.status_code != 200:
                    raise RuntimeError(f"{phase} on {node.url}: {r.status_code} {r.text[:200]}")
                if k >= ops // 10:  # the first tenth warms up
                    times[phase].append(elapsed * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--backends", nargs="+", default=["lone", "memory3", "memory5", "redis", "postgres"])
    args = parser.parse_args()
    log_dir = default_log_dir()
    print(f"{args.ops} writes (one 1 KiB item added) then {args.ops} reads (20 items) per backend, ms; logs {log_dir}")
    print(f"{'backend':10} {'write p50':>10} {'write p99':>10} {'read p50':>10} {'read p99':>10}")
    for backend in args.backends:
        with ExitStack() as stack:
            nodes = start_nodes(backend, stack, log_dir)
            times = measure(nodes, args.ops)
        print(f"{backend:10} {pct(times['write'], 50):10.2f} {pct(times['write'], 99):10.2f} "
              f"{pct(times['read'], 50):10.2f} {pct(times['read'], 99):10.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Response cache figures: not a test, it prints figures.

    python tests/bench/cache_bench.py [--requests 300]

Three ``smg-node serve --response-cache`` processes in one cluster in front of one simulated engine with its
default timings (prefill and per-token delays of a small GPU model), one sequential keep-alive client. For a
chat request of 16 output tokens it measures, p50 and p99 of the latency and the CPU the nodes spent per request
(utime + stime of their processes, /proc, less what they spend idle over the same time):

* a miss, streamed: the time to the first token (what a hit must beat) and to the end; every request another
  prompt, so none is a hit;
* a hit on a node that holds the answer (one of its key's two owners);
* a hit through a peer: the node asked holds no copy and fetches it from the key's owner over the mesh.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import httpx2
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.processes import EngineProcess, NodeProcess, default_log_dir  # noqa: E402
from gateway.cache import cache_key  # noqa: E402
from mesh.ring import HashRing  # noqa: E402

MODEL = "qwen3-sim"
BASE = 18850
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: "list[int]") -> float:
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return total


def body(text: str, stream: bool) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 16, "temperature": 0,
            "stream": stream, "ignore_eos": True}


def percentiles(values: "list[float]") -> str:
    values = sorted(values)
    return f"{1000 * statistics.median(values):.2f} | {1000 * values[int(0.99 * (len(values) - 1))]:.2f}"


def main(args: argparse.Namespace) -> None:
    log_dir = default_log_dir()
    engine = EngineProcess([], log_dir, "cache-bench-engine")
    nodes = []
    try:
        for i in range(3):
            nodes.append(NodeProcess(["--mesh-bind", f"127.0.0.1:{BASE + i}", "--join", f"127.0.0.1:{BASE}",
                                      "--node-name", f"b{i}", "--mesh-preset", "local", "--rpc-addr",
                                      f"127.0.0.1:{BASE + 50 + i}", "--worker-urls", engine.url,
                                      "--response-cache", "--workers", "1", "--log-level", "warning"],
                                     log_dir, f"cache-bench-{i}"))
        time.sleep(3)
        names = [f"b{i}" for i in range(3)]
        pids = [n.process.pid for n in nodes]
        clients = {name: httpx2.Client(base_url=n.url, timeout=60) for name, n in zip(names, nodes)}
        # The nodes' own CPU while nothing is asked (gossip, health checks): taken out of each row's CPU.
        cpu, started_s = cpu_seconds(pids), time.perf_counter()
        time.sleep(5.0)
        idle_per_s = (cpu_seconds(pids) - cpu) / (time.perf_counter() - started_s)

        def spent(cpu_before: float, wall_s: float) -> float:
            return max(0.0, cpu_seconds(pids) - cpu_before - idle_per_s * wall_s) / args.requests

        print(f"# {time.strftime('%Y-%m-%d')}, {args.requests} sequential requests per row, 16 output tokens, "
              "simulated engine with its default timings")
        print(f"# the nodes' idle CPU, taken out: {1000 * idle_per_s:.1f} ms/s")
        print("| case | p50 ms | p99 ms | CPU ms per request (all nodes) |")
        print("|---|---|---|---|")

        # Misses: another prompt each time; the first token's time and the whole answer's.
        first_token, whole = [], []
        cpu, started_s = cpu_seconds(pids), time.perf_counter()
        for i in range(args.requests):
            started = time.perf_counter()
            with clients["b0"].stream("POST", "/v1/chat/completions", content=orjson.dumps(
                    body(f"miss {i} {time.time()}", True))) as r:
                first = None
                for chunk in r.iter_bytes():
                    if first is None and b'"content":"' in chunk:
                        first = time.perf_counter() - started
                first_token.append(first or 0.0)
            whole.append(time.perf_counter() - started)
        miss_cpu = spent(cpu, time.perf_counter() - started_s)
        print(f"| miss, streamed: first token | {percentiles(first_token)} | |")
        print(f"| miss, streamed: whole answer | {percentiles(whole)} | {1000 * miss_cpu:.2f} |")

        for case in ("local", "peer"):
            text = f"the cached one {case} {time.time()}"
            key = cache_key("chat", "anonymous", body(text, False))
            owners = HashRing.build(names).placement(key, 2, lambda m: m)
            asked = owners[0] if case == "local" else next(n for n in names if n not in owners)
            client = clients[asked]
            primed = client.post("/v1/chat/completions", content=orjson.dumps(body(text, False)))
            assert primed.status_code == 200, primed.text
            for _ in range(50):  # the answer is put on its owners in the background
                if client.post("/v1/chat/completions", content=orjson.dumps(
                        body(text, False))).headers.get("x-smg-cache") == "hit":
                    break
                time.sleep(0.05)
            latencies = []
            cpu, started_s = cpu_seconds(pids), time.perf_counter()
            for _ in range(args.requests):
                started = time.perf_counter()
                r = client.post("/v1/chat/completions", content=orjson.dumps(body(text, False)))
                latencies.append(time.perf_counter() - started)
                assert r.headers["x-smg-cache"] == "hit", r.headers
            hit_cpu = spent(cpu, time.perf_counter() - started_s)
            label = "hit, on an owner" if case == "local" else "hit, through a peer"
            print(f"| {label} ({asked}) | {percentiles(latencies)} | {1000 * hit_cpu:.2f} |")
    finally:
        for n in nodes:
            n.kill()
        engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    main(parser.parse_args())

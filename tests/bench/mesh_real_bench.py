"""Mesh figures with real smg-node processes on 127.0.0.1 (lan preset): not a test, it prints figures.

    python tests/bench/mesh_real_bench.py [--trials 10] [--large 30] [--nodes 5]   (--large 0: no dissemination run)

* crash detection: SIGKILL one of --nodes nodes (5); time until every survivor's admin
  endpoint lists it dead (polled every 50 ms); restart it; repeat.
* gossip bytes per second per node, idle, from the nodes' own metrics.
* dissemination: one of --large nodes changes its tags; time until every node
  lists the new tag.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.processes import NodeProcess, default_log_dir  # noqa: E402
from mesh.crypto import generate_key  # noqa: E402

BASE = 37946


def args_for(i: int, key: str, log_level: str = "warning") -> list[str]:
    return ["--mesh-bind", f"127.0.0.1:{BASE + i}", "--join", f"127.0.0.1:{BASE}", "--node-name", f"n{i}",
            "--encrypt", key, "--rpc-addr", f"127.0.0.1:{BASE + 1000 + i}", "--log-level", log_level,
            "--retry-join-interval-secs", "0.5"]


def members(client: httpx2.Client, i: int) -> dict[str, dict]:
    r = client.get(f"http://127.0.0.1:{BASE + 1000 + i}/v1/members", timeout=5)
    return {m["name"]: m for m in r.json()["members"]}


def wait(predicate, timeout_s: float, step_s: float = 0.05) -> float:
    start = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - start
        except (httpx2.HTTPError, KeyError, ValueError):
            pass
        if time.monotonic() - start > timeout_s:
            raise TimeoutError
        time.sleep(step_s)


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def start_many(n: int, key: str, log_dir: Path) -> dict[int, NodeProcess]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        procs = list(pool.map(lambda i: NodeProcess(args_for(i, key), log_dir, f"n{i}"), range(n)))
    return dict(enumerate(procs))


def crash_trials(trials: int, log_dir: Path, n: int = 5) -> tuple[list[float], float]:
    key = generate_key()
    nodes = start_many(n, key, log_dir)
    client = httpx2.Client(headers=nodes[0].admin_headers)  # the admin API needs the nodes' shared token
    try:
        wait(lambda: all(len([m for m in members(client, i).values() if m["state"] == "alive"]) == n
                         for i in range(n)), 60)
        b0 = sum(_bytes_sent(client, node.url) for node in nodes.values())
        time.sleep(20)
        rate = (sum(_bytes_sent(client, node.url) for node in nodes.values()) - b0) / 20 / n
        took = []
        for t in range(trials):
            victim = 1 + t % (n - 1)
            nodes[victim].signal(signal.SIGKILL)
            nodes[victim].process.wait()
            survivors = [i for i in range(n) if i != victim]
            took.append(wait(lambda: all(members(client, i)[f"n{victim}"]["state"] == "dead" for i in survivors),
                             90))
            print(f"  trial {t + 1}: n{victim} dead everywhere after {took[-1]:.2f} s", file=sys.stderr, flush=True)
            nodes[victim] = NodeProcess(args_for(victim, key), log_dir, f"n{victim}-{t}")
            wait(lambda: all(members(client, i)[f"n{victim}"]["state"] == "alive" for i in range(n)), 90)
        return took, rate
    finally:
        client.close()
        for node in nodes.values():
            node.kill()


def _bytes_sent(client: httpx2.Client, url: str) -> float:
    text = client.get(url + "/metrics", timeout=5).text
    return float(re.search(r'smg_mesh_bytes_total\{direction="sent"\} (\S+)', text).group(1))


def dissemination_trials(n: int, trials: int, log_dir: Path) -> list[float]:
    key = generate_key()
    nodes = start_many(n, key, log_dir)
    client = httpx2.Client(headers=nodes[0].admin_headers)
    try:
        wait(lambda: all(len(members(client, i)) == n for i in range(n)), 120, step_s=0.5)
        took = []
        for t in range(trials):
            value = f"v{t}"
            client.post(f"http://127.0.0.1:{BASE + 1000}/v1/tags", json={"tags": {"round": value}})
            start = time.monotonic()
            pending = set(range(n))
            while pending:
                pending = {i for i in pending if members(client, i)["n0"]["tags"].get("round") != value}
                if time.monotonic() - start > 60:
                    raise TimeoutError
            took.append(time.monotonic() - start)
            print(f"  round {t + 1}: all {n} nodes saw the change after {took[-1]:.2f} s", file=sys.stderr,
                  flush=True)
            time.sleep(2)
        return took
    finally:
        client.close()
        for node in nodes.values():
            node.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--large", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=5, help="cluster size of the crash trials (at least 2)")
    args = parser.parse_args()
    log_dir = default_log_dir()
    print(f"# Mesh with real processes, lan preset, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores\n")
    took, rate = crash_trials(args.trials, log_dir, args.nodes)
    print(f"Crash detection, {args.nodes} nodes, {len(took)} SIGKILLs: p50 {statistics.median(took):.2f} s, "
          f"p99 {pct(took, 99):.2f} s, max {max(took):.2f} s (until every survivor lists it dead)\n")
    print(f"Gossip load, {args.nodes} idle nodes: {rate:.0f} bytes/s sent per node (encrypted, probes and acks included)\n")
    if not args.large:  # --large 0: the crash and gossip figures only
        return
    spread = dissemination_trials(args.large, 5, log_dir)
    print(f"Dissemination, {args.large} nodes, one tag change, 5 rounds: p50 {statistics.median(spread):.2f} s, "
          f"max {max(spread):.2f} s until all {args.large} nodes list it (includes ~{args.large} sequential "
          f"admin polls per round)")


if __name__ == "__main__":
    main()

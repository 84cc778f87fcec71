"""Prefix-cache hit rate behind a load balancer: shared KV index vs per-node trees vs round robin.

    python tests/bench/cluster_cache_bench.py [--conversations 12] [--turns 6]

Three simulated engines with their timing model on (prefill costs 50 us per
uncached prompt token, so TTFT shows cache hits), and for each mode fresh
engines and nodes. A multi-turn chat workload (each conversation has one of
four long system prompts and grows turn by turn) is sent through the nodes in
turn, as a round-robin load balancer would. Reported: the engines' prefix-cache
hit rate (cached prompt tokens / prompt tokens, from the answers' usage) and
TTFT p50/p99.

Modes: ``single`` (one node: the best a gateway can do), ``shared`` (three
nodes, one KV index from the engines' events, shared over the mesh),
``approx`` (three nodes, each with its own approximate tree, no events: what
SMG does across gateways), ``round_robin`` (three nodes, no cache affinity).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.processes import EngineProcess, NodeProcess, default_log_dir  # noqa: E402
from mesh.crypto import generate_key  # noqa: E402

MODEL = "qwen3-sim"
ENGINE_ARGS = ["--prefill-s-per-token", "0.00005", "--itl-base-s", "0.002", "--itl-per-running-s", "0"]
MODES = {
    "single": (1, []),
    "shared": (3, []),
    "approx": (3, ["--disable-kv-events"]),
    "round_robin": (3, ["--policy", "round_robin"]),
}
SYSTEM_PROMPTS = [f"You are assistant number {i}. " + "Answer carefully, cite sources, and explain each step. " * 40
                  for i in range(4)]


def _node_args(i: int, n: int, base: int, key: str, extra: list[str]) -> list[str]:
    if n == 1:
        return ["--log-level", "warning", *extra]
    return ["--mesh-bind", f"127.0.0.1:{base + i}", "--join", f"127.0.0.1:{base}", "--node-name", f"b{i}",
            "--encrypt", key, "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{base + 100 + i}",
            "--retry-join-interval-secs", "0.5", "--log-level", "warning", *extra]


def run_mode(mode: str, conversations: int, turns: int, log_dir: Path, base_port: int = 29946,
             seed: int = 7) -> dict:
    n, extra = MODES[mode]
    rng = random.Random(seed)
    engines = [EngineProcess(ENGINE_ARGS, log_dir, f"{mode}-engine{i}") for i in range(3)]
    key = generate_key()
    nodes = []
    try:
        urls = [e.url for e in engines]
        for i in range(n):
            args = _node_args(i, n, base_port, key, extra)
            nodes.append(NodeProcess(["--worker-urls", *urls, *args], log_dir, f"{mode}-node{i}"))
        if n > 1:
            _wait_for_members(nodes, n)
        clients = [openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=60)
                   for node in nodes]
        histories = [[{"role": "system", "content": SYSTEM_PROMPTS[c % len(SYSTEM_PROMPTS)]}]
                     for c in range(conversations)]
        prompt_tokens = cached_tokens = 0
        ttfts = []
        turn_requests = 0
        for turn in range(turns):
            order = list(range(conversations))
            rng.shuffle(order)
            for c in order:
                history = histories[c]
                history.append({"role": "user", "content": f"Turn {turn}: question {rng.randrange(10**6)}?"})
                client = clients[turn_requests % len(clients)]  # the load balancer's round robin
                turn_requests += 1
                start = time.perf_counter()
                first = None
                text = []
                usage = None
                for chunk in client.chat.completions.create(model=MODEL, messages=history, max_tokens=24,
                                                            stream=True, stream_options={"include_usage": True}):
                    if chunk.choices and chunk.choices[0].delta.content and first is None:
                        first = time.perf_counter() - start
                    if chunk.choices:
                        text.append(chunk.choices[0].delta.content or "")
                    if chunk.usage is not None:
                        usage = chunk.usage
                ttfts.append(first or 0.0)
                prompt_tokens += usage.prompt_tokens
                cached_tokens += usage.prompt_tokens_details.cached_tokens or 0
                history.append({"role": "assistant", "content": "".join(text)})
        return {"mode": mode, "requests": turn_requests, "hit_rate": cached_tokens / prompt_tokens,
                "ttft_p50_ms": statistics.median(ttfts) * 1000,
                "ttft_p99_ms": statistics.quantiles(ttfts, n=100, method="inclusive")[98] * 1000}
    finally:
        for node in nodes:
            node.kill()
        for e in engines:
            e.kill()


def _wait_for_members(nodes: list, n: int) -> None:
    import httpx2
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if all(sum(1 for w in httpx2.get(node.url + "/metrics", timeout=5).text.splitlines()
                       if w.startswith('smg_mesh_members{state="alive"} ' + f"{n}.0")) for node in nodes):
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the nodes did not see each other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    args = parser.parse_args()
    log_dir = default_log_dir()
    print(f"# Prefix-cache hit rate behind round-robin load balancing, {time.strftime('%Y-%m-%d')}\n")
    print(f"{args.conversations} conversations x {args.turns} turns, 4 system prompts of ~500 tokens, "
          f"3 simulated engines (prefill 50 us/uncached token), 24 output tokens, sequential requests.\n")
    print("| mode | nodes | requests | engine prefix-cache hit rate | TTFT p50 ms | TTFT p99 ms |")
    print("|---|---|---|---|---|---|")
    for i, mode in enumerate(args.modes):
        r = run_mode(mode, args.conversations, args.turns, log_dir, base_port=29946 + 20 * i)
        print(f"| {mode} | {MODES[mode][0]} | {r['requests']} | {r['hit_rate'] * 100:.1f} % | "
              f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} |", flush=True)


if __name__ == "__main__":
    main()

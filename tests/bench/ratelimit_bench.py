"""Rate-limit decision figures: not a test, it prints figures.

    python tests/bench/ratelimit_bench.py [--seconds 5] [--concurrency 1,16,256]

Two mesh members on 127.0.0.1: a real ``smg-node serve`` process (the owner of
half the keys) and this driver, which runs its own MeshAgent, ClusterState and
RateLimiter (the same objects a node runs) and joins it. Gossip is sealed with
AES-256-GCM, as in production. For each path and concurrency the driver's tasks
call ``RateLimiter.check`` back to back for keys that

* the driver owns (``local``: decided in-process), or
* the other process owns (``forwarded``: coalesced per batch window, sent over
  the mesh's sealed TCP streams, decided there),

and report decisions per second, the latency p50/p99 of one decision, and for
the forwarded path the batch size and the time per forwarded item (wall time /
items). Limits are high so every decision is an admit (the cost is the same).

``--kind budgets`` decides budgets' counters instead (gateway/spend/budgets.py: a
key's monthly budget, a reservation in dollars per decision, through
``RateLimiter.check_keys`` as a request's budgets are).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.processes import NodeProcess, default_log_dir  # noqa: E402
from gateway.cluster import ClusterState  # noqa: E402
from gateway.ratelimit import RateLimitConfig, RateLimiter, parse_limit_set  # noqa: E402
from gateway.spend import parse_budget  # noqa: E402
from mesh.agent import MeshAgent  # noqa: E402
from mesh.config import MeshConfig  # noqa: E402
from mesh.crypto import Keyring, generate_key  # noqa: E402
from mesh.transport import UdpTcpTransport  # noqa: E402

OWNER_PORT = 18946
DRIVER_PORT = 18947
LIMITS = {"limits": [{"name": "per-key", "scope": "api_key", "limit": 1e9, "burst": 1e9}]}


def keys_owned_by(cluster: ClusterState, limiter: RateLimiter, owner: str, n: int) -> list:
    out = []
    i = 0
    spec = limiter.limits.limits[0]
    while len(out) < n:
        identity = limiter.identity(f"Bearer key-{i}", None, "m")
        if cluster.ring.owner(spec.key_for(identity)) == owner:
            out.append(identity)
        i += 1
    return out


def budgets_owned_by(cluster: ClusterState, owner: str, n: int) -> list:
    """Counters of keys' monthly budgets whose owner is ``owner``: (spec, key, dollars) as a request reserves."""
    out = []
    i = 0
    now = time.time()
    while len(out) < n:
        spec, key, _ = parse_budget({"key": f"{i:x}", "amount_usd": 1e9, "period": "month"}, "b").counter(now)
        if cluster.ring.owner(key) == owner:
            out.append([(spec, key, 0.0125)])
        i += 1
    return out


async def measure(limiter: RateLimiter, identities: list, concurrency: int, seconds: float, path: str) -> dict:
    latencies: list[float] = []
    other_path = 0
    batches_before = limiter.batcher.stats.batches
    items_before = limiter.batcher.stats.items
    end = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        j = k
        while time.perf_counter() < end:
            identity = identities[j % len(identities)]
            j += concurrency
            started = time.perf_counter()
            if isinstance(identity, list):  # budgets' counters
                verdict = await limiter.check_keys(identity)
            else:
                verdict = await limiter.check(identity, 1)
            latencies.append(time.perf_counter() - started)
            assert verdict.allowed, verdict
            if verdict.outcomes[0].path != ("owned" if path == "local" else path):
                nonlocal other_path
                other_path += 1  # the ring changed under us (a member suspected dead): row is void

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(concurrency):
            nursery.start_soon(worker, k)
    wall = time.perf_counter() - started
    latencies.sort()
    batches = limiter.batcher.stats.batches - batches_before
    items = limiter.batcher.stats.items - items_before
    return {"other_path": other_path, "decisions_per_s": len(latencies) / wall, "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
            "batch_items": items / batches if batches else 0.0,
            "us_per_forwarded_item": 1e6 * wall / items if items else 0.0}


async def main(args: argparse.Namespace) -> None:
    key = generate_key()
    limits_file = Path(tempfile.mkdtemp()) / "limits.toml"
    limits_file.write_text('[[limits]]\nname = "per-key"\nscope = "api_key"\nlimit = 1e9\nburst = 1e9\n')
    owner = NodeProcess(["--mesh-bind", f"127.0.0.1:{OWNER_PORT}", "--node-name", "owner", "--encrypt", key,
                         "--mesh-preset", "local", "--rpc-addr", "127.0.0.1:18980", "--rate-limits", str(limits_file),
                         "--log-level", "warning"], default_log_dir(), "bench-owner")
    try:
        cluster = ClusterState("driver")
        agent = MeshAgent(MeshConfig.local(), "driver", UdpTcpTransport(f"127.0.0.1:{DRIVER_PORT}"), Keyring([key]),
                          hooks=cluster)
        cluster.attach(agent)
        limiter = RateLimiter(RateLimitConfig(batch_wait_s=args.batch_wait_us / 1e6), parse_limit_set(LIMITS), cluster=cluster)
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            await agent.join([f"127.0.0.1:{OWNER_PORT}"])
            await nursery.start(limiter.run)
            while len(cluster.ring) < 2:
                await trio.sleep(0.05)
            if args.kind == "budgets":
                local = budgets_owned_by(cluster, "driver", args.keys)
                remote = budgets_owned_by(cluster, "owner", args.keys)
            else:
                local = keys_owned_by(cluster, limiter, "driver", args.keys)
                remote = keys_owned_by(cluster, limiter, "owner", args.keys)
            print(f"# {args.kind}, {time.strftime('%Y-%m-%d')}, {args.seconds}s per row, sealed mesh streams, batch wait "
                  f"{limiter.config.batch_wait_s * 1e6:.0f} us")
            print("| path | concurrency | decisions/s | p50 ms | p99 ms | items/batch | us per forwarded item |")
            print("|---|---|---|---|---|---|---|")
            for path, identities in (("local", local), ("forwarded", remote)):
                for concurrency in args.concurrency:
                    for _ in range(3):
                        while len(cluster.ring) < 2:
                            await trio.sleep(0.1)
                        r = await measure(limiter, identities, concurrency, args.seconds, path)
                        if not r["other_path"]:
                            break
                        print(f"# {path} x{concurrency}: {r['other_path']} decisions took another path "
                              f"(ring changed); measuring again", flush=True)
                    print(f"| {path} | {concurrency} | {r['decisions_per_s']:,.0f} | {r['p50_ms']:.3f} | "
                          f"{r['p99_ms']:.3f} | {r['batch_items']:.1f} | {r['us_per_forwarded_item']:.1f} |",
                          flush=True)
            nursery.cancel_scope.cancel()
    finally:
        owner.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys per path (API keys)")
    parser.add_argument("--batch-wait-us", type=float, default=RateLimitConfig().batch_wait_s * 1e6)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 256])
    parser.add_argument("--kind", choices=("limits", "budgets"), default="limits")
    trio.run(main, parser.parse_args())

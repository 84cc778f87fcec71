"""CPU per gRPC call to a zero-cost simulated engine: the h2 client against the grpcio bridge.

Not a test: it prints figures. One process, one engine (a real process on 127.0.0.1); each client
makes Generate calls (16 output tokens, streamed or not) back to back; the CPU is this process's
(all threads), so it includes everything the gateway pays per call and nothing of the engine.

    python tests/bench/bridge_bench.py [--calls 300] [--clients 1 16]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.processes import EngineProcess, default_log_dir  # noqa: E402
from gateway.engine.bridge import GrpcBridge  # noqa: E402
from gateway.engine.grpc_engine import GrpcEngineClient, SamplingOptions  # noqa: E402
from gateway.engine.h2grpc import H2GrpcClient  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(kind: str, target: str, calls: int, clients_list: list[int]) -> list[tuple]:
    rows = []
    async with trio.open_nursery() as outer:
        bridge = H2GrpcClient(outer) if kind == "h2" else GrpcBridge()
        client = GrpcEngineClient(bridge, target, "sglang")
        ids = list(range(100, 120))

        async def one(i: int, stream: bool) -> None:
            options = SamplingOptions(max_new_tokens=16, ignore_eos=True)
            async with client.generate(f"{kind}-{i}", ids, options, stream, 10) as batches:
                async for _ in batches:
                    pass

        serial = iter(range(10**9))
        for stream in (False, True):
            for clients in clients_list:
                await one(next(serial), stream)
                done = 0

                async def worker() -> None:
                    nonlocal done
                    for _ in range(calls):
                        await one(next(serial), stream)
                        done += 1

                cpu0, wall0 = cpu_seconds(), time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for _ in range(clients):
                        nursery.start_soon(worker)
                wall = time.perf_counter() - wall0
                rows.append((kind, stream, clients, (cpu_seconds() - cpu0) / done * 1e6, done / wall))
        await bridge.aclose()
        outer.cancel_scope.cancel()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per client")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    engine = EngineProcess(["--zero-cost"], default_log_dir())
    try:
        rows = []
        for kind in ("grpcio", "h2", "grpcio", "h2"):  # alternating, twice
            rows += trio.run(measure, kind, engine.target, args.calls, args.clients)
    finally:
        engine.stop()
    print("| client | stream (16 tokens) | concurrent calls | CPU µs per call | calls/s |")
    print("|---|---|---|---|---|")
    for kind, stream, clients, cpu_us, rate in rows:
        print(f"| {kind} | {'yes' if stream else 'no'} | {clients} | {cpu_us:.0f} | {rate:.0f} |")


if __name__ == "__main__":
    main()

"""KV index figures on one core: not a test, it prints figures.

    python tests/bench/kv_index_bench.py

Insertions/s and removals/s of 16-token blocks arriving as engines send them
(stored events of 32 chained blocks), memory per indexed block (tracemalloc),
the latency of a routing query for a 7,800-token prompt against 8 engines, and
what one of the simulated engine's real batches costs to parse, decode and apply.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from smg_grpc_proto.generated import common_pb2  # noqa: E402

from chaos.sim_engine.kv_cache import PrefixCache  # noqa: E402
from gateway.routing.kv_index import (  # noqa: E402
    KvIndex,
    RemovedBlocks,
    StoredBlocks,
    prompt_block_hashes,
)
from gateway.workers.kv_events import decode_batch  # noqa: E402

BLOCK = 16
CHAIN = 32


def make_events(rng: random.Random, chains: int) -> list[StoredBlocks]:
    events = []
    for c in range(chains):
        blocks = tuple((c * CHAIN + i + 1, tuple(rng.randrange(150_000) for _ in range(BLOCK))) for i in range(CHAIN))
        events.append(StoredBlocks(None, blocks))
    return events


def engine_batches(rng: random.Random, prompts: int) -> list[bytes]:
    """The simulated engine's own KvEventBatch messages (serialized) for unique 7,800-token prompts, its
    cache full (65,536 blocks of 16): each batch stores a prompt's 487 blocks and evicts as many."""
    cache = PrefixCache(block_size=BLOCK, capacity_blocks=65_536, replay_batches_max=prompts + 1)
    for _ in range(prompts):
        cache.release(cache.acquire([rng.randrange(150_000) for _ in range(7_800)], 0), 0)
    return [batch.SerializeToString() for batch in cache.batches_since(1)]


def real_batch_costs(rng: random.Random) -> tuple[float, float, float]:
    """Median seconds to parse, decode and apply one real batch, once index and engine are full."""
    batches = engine_batches(rng, 400)
    index = KvIndex()
    costs: list[tuple[float, float, float]] = []
    for wire in batches:
        t0 = time.perf_counter()
        batch = common_pb2.KvEventBatch.FromString(wire)
        t1 = time.perf_counter()
        events, snapshot = decode_batch(batch)
        t2 = time.perf_counter()
        index.apply_batch("e", batch.sequence_number, events, snapshot)
        costs.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    full = costs[len(costs) // 2:]  # the engine evicts as much as it stores from batch ~135 on
    return tuple(statistics.median(c[i] for c in full) for i in range(3))


def main() -> None:
    rng = random.Random(1)
    events = make_events(rng, 20_000)  # 640,000 blocks
    blocks = len(events) * CHAIN
    index = KvIndex(blocks_max=10_000_000)
    engines = [f"e{i}" for i in range(8)]
    # Every engine's batches are numbered 1, 2, 3, ... in the order it sends them.
    inserts = [(engines[i % 8], i // 8 + 1, [e]) for i, e in enumerate(events)]
    removals = [(engines[i % 8], len(events) // 8 + i // 8 + 1, [RemovedBlocks(tuple(b[0] for b in e.blocks))])
                for i, e in enumerate(events)]
    start = time.perf_counter()
    for engine, seq, batch in inserts:
        index.apply_batch(engine, seq, batch)
    insert_s = time.perf_counter() - start
    assert index.inserted == blocks, index.inserted

    start = time.perf_counter()
    for engine, seq, batch in removals:
        index.apply_batch(engine, seq, batch)
    remove_s = time.perf_counter() - start
    assert index.removed == blocks and index.block_count() == 0, index.removed

    tracemalloc.start()
    small = KvIndex(blocks_max=10_000_000)
    before = tracemalloc.get_traced_memory()[0]
    for seq, event in enumerate(events[:2000], 1):
        small.apply_batch("e", seq, [event])
    per_block = (tracemalloc.get_traced_memory()[0] - before) / small.block_count()
    tracemalloc.stop()

    # Query: a 7,800-token prompt whose first 6,400 tokens engine e3 holds, 8 engines.
    query_index = KvIndex()
    prompt = [rng.randrange(150_000) for _ in range(7_800)]
    held = tuple((i + 1, tuple(prompt[i * BLOCK:(i + 1) * BLOCK])) for i in range(6_400 // BLOCK))
    query_index.apply_batch("e3", 1, [StoredBlocks(None, held)])
    for e in range(8):
        if e != 3:
            query_index.apply_batch(f"e{e}", 1, make_events(rng, 50))
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        hashes = prompt_block_hashes(prompt, BLOCK)
        matched = [query_index.matched_blocks(f"e{e}", hashes) for e in range(8)]
        times.append(time.perf_counter() - t0)
    assert matched[3] == 400

    print(f"# KV index, {time.strftime('%Y-%m-%d')}, one core, Python {sys.version.split()[0]}\n")
    print(f"- insertions: {blocks / insert_s:,.0f} blocks/s ({blocks:,} blocks of {BLOCK} tokens, 8 engines)")
    print(f"- removals: {blocks / remove_s:,.0f} blocks/s")
    print(f"- memory: {per_block:.0f} bytes per indexed block (index structures, tracemalloc)")
    print(f"- query, 7,800-token prompt (487 blocks) against 8 engines, hashing included: "
          f"p50 {statistics.median(times) * 1e3:.2f} ms, p99 {sorted(times)[197] * 1e3:.2f} ms")
    parse_s, decode_s, apply_s = real_batch_costs(rng)
    print(f"- one real batch of the simulated engine (a unique 7,800-token prompt: 487 blocks stored, as many "
          f"evicted), median: parse {parse_s * 1e3:.2f} ms, decode {decode_s * 1e3:.2f} ms, "
          f"apply {apply_s * 1e3:.2f} ms")
    print("\nAnchor: SMG's Rust tree, 216,000 insertions/s and ~1.4 KB per tree node (its release notes).")


if __name__ == "__main__":
    main()

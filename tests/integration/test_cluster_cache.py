"""Behind round-robin load balancing, the shared KV index keeps the hit rate of a single gateway."""

from __future__ import annotations

import httpx2
import openai

from chaos.processes import EngineProcess, NodeProcess
from tests.bench.cluster_cache_bench import run_mode

from tests.support.nodes import MODEL
from tests.support.nodes import registry_node_args as node_args, workers
from tests.support.waiting import eventually


def test_shared_index_reaches_the_hit_rate_of_a_single_gateway(log_dir):
    # Routing also weighs load, which depends on timing: the margins allow for it. Measured
    # here: single 86 %, shared 83-86 %, per-node approximate trees 73-77 % (BENCHMARKS.md), but one
    # CI run on a slow hour (2026-11-23, 14-41 % hypervisor steal) had shared 82.6 % and approximate
    # trees 81.2 %: the shared index must not do worse than the trees; by how much it does better
    # depends on the machine's timing.
    single = run_mode("single", conversations=12, turns=5, log_dir=log_dir, base_port=30946)
    shared = run_mode("shared", conversations=12, turns=5, log_dir=log_dir, base_port=30966)
    approx = run_mode("approx", conversations=12, turns=5, log_dir=log_dir, base_port=30986)
    assert shared["hit_rate"] >= single["hit_rate"] - 0.05, (single, shared)
    assert shared["hit_rate"] >= approx["hit_rate"], (shared, approx)


def test_killing_a_stream_owner_keeps_the_index_advancing(log_dir):
    engine = EngineProcess(["--zero-cost", "--block-size", "16"], log_dir, "owner-kill-engine")
    # One engine: its events are followed only with --kv-events-always (no routing choice otherwise).
    always = "--kv-events-always"
    nodes = [NodeProcess(node_args(20, "--worker-urls", engine.url, always, seed=20), log_dir, "ok-c0")]
    nodes += [NodeProcess(node_args(20 + i, always, seed=20), log_dir, f"ok-c{i}") for i in (1, 2)]
    try:
        eventually(lambda: all(engine.url in workers(n) for n in nodes), 30)
        eventually(lambda: sum(workers(n)[engine.url]["kv_index"]["following"] for n in nodes) == 2, 20)
        follower = next(n for n in nodes if workers(n)[engine.url]["kv_index"]["following"])
        follower.kill()
        rest = [n for n in nodes if n is not follower]
        client = openai.OpenAI(base_url=rest[0].url + "/v1", api_key="x", max_retries=0)
        before = workers(rest[0])[engine.url]["kv_index"]["next_sequence"]
        for i in range(5):  # new prompts: new blocks, new event batches
            client.completions.create(model=MODEL, prompt=f"{i} " + "fresh text for new blocks " * 30, max_tokens=1)
        # Within a stated bound (failure detection ~2 s with the local preset, then resubscription),
        # both survivors apply the new batches and agree.
        eventually(lambda: all(workers(n)[engine.url]["kv_index"]["next_sequence"] >= before + 5 for n in rest)
                   and len({workers(n)[engine.url]["kv_index"]["fingerprint"] for n in rest}) == 1, 20,
                   lambda: [workers(n)[engine.url]["kv_index"] for n in rest])
        # Once the dead owner is declared dead (not while merely suspected), its successor follows too.
        eventually(lambda: sum(workers(n)[engine.url]["kv_index"]["following"] for n in rest) == 2, 20)
    finally:
        for n in nodes:
            n.kill()
        engine.kill()
        httpx2.Client().close()

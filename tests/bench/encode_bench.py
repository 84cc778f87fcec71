"""Long-prompt encoding: which thread encodes, and the tokenizer service under concurrent callers.

Not a test: it prints figures. Two parts, on smg_compare.py's ~7,800-token chat text and its
Qwen3 tokenizer files:

1. One fast encoder (tiktoken's core) timed on the thread that used it first, then on another
   thread, then a fork (``FastBpe.fork``) on a thread that used it first: the regex engine's
   scratch pools belong to their first user, and other threads take a slower path
   (``gateway/tokenizer/encoder_threads.py`` says why that matters). Then, on its owner thread,
   the original pre-tokenizer against the lookahead-free one (``lookahead_free.py``), which the
   encoder threads use for texts like this one.
2. ``TokenizerService.encode`` of unique long texts (a counter leads each, so no cache
   holds any) from ``--concurrency`` trio tasks: process CPU and wall time per text.

    python tests/bench/encode_bench.py [--concurrency 16] [--texts 640] [--repeats 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import orjson
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import default_log_dir  # noqa: E402
from gateway.tokenizer.lookahead_free import splits_alike  # noqa: E402
from gateway.tokenizer.service import TokenizerService  # noqa: E402
from tests.bench.smg_compare import conversation_bodies, model_dir  # noqa: E402


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def median_us(fn, runs: int = 30) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def by_thread(service: TokenizerService, text: str) -> None:
    fast = service.fast
    if fast is None:
        print("no fast encoder for this tokenizer: part 1 skipped")
        return
    owner = median_us(lambda: fast.encode(text))  # this thread used it first (the service's fork)
    with concurrent.futures.ThreadPoolExecutor(1) as other:
        another = median_us(lambda: other.submit(fast.encode, text).result())
        fork = fast.fork(lookahead_free=False)  # the same pre-tokenizer as `fast`
        forked = median_us(lambda: other.submit(fork.encode, text).result())
    print(f"one {len(text):,}-character text: owner thread {owner:.0f} us, another thread {another:.0f} us, "
          f"a fork on that other thread {forked:.0f} us (includes the hand-off)")
    original, dual = fast.fork(lookahead_free=False), fast.fork(lookahead_free=True)
    if not dual.has_lookahead_free_core or not splits_alike(text):
        print("the lookahead-free pre-tokenizer does not apply to this tokenizer or text")
        return
    assert dual.encode(text) == original.encode(text)
    by_core = {}
    for _ in range(3):  # alternating, medians of medians: the host's speed drifts
        by_core.setdefault("original", []).append(median_us(lambda: original.encode(text)))
        by_core.setdefault("lookahead-free", []).append(median_us(lambda: dual.encode(text)))
    print("the same text on its owner thread: " + ", ".join(
        f"{name} pre-tokenizer {statistics.median(times):.0f} us" for name, times in by_core.items()))


async def concurrent_encodes(service: TokenizerService, text: str, concurrency: int, texts: int,
                             repeats: int) -> None:
    counter = 0

    async def caller(count: int) -> None:
        nonlocal counter
        for _ in range(count):
            counter += 1
            await service.encode(f"{counter} {text}")

    for _ in range(repeats):
        cpu_started, started = cpu_s(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(caller, texts // concurrency)
        done = texts // concurrency * concurrency
        print(f"{concurrency} callers, {done} unique texts: {(cpu_s() - cpu_started) / done * 1e6:.0f} us CPU "
              f"and {(time.perf_counter() - started) / done * 1e6:.0f} us wall per text")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--texts", type=int, default=640)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    service = TokenizerService.from_directory(model_dir(default_log_dir()))
    body = orjson.loads(next(conversation_bodies("long", False)))
    text = "\n".join(m["content"] for m in body["messages"])
    print(f"{platform.machine()}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    by_thread(service, text)
    trio.run(concurrent_encodes, service, text, args.concurrency, args.texts, args.repeats)


if __name__ == "__main__":
    main()

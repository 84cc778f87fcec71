"""What ``serve --workers N`` costs with no requests: idle CPU, memory and threads of a node by N.

Not a test: it prints figures, for the model of a larger machine in docs/performance.md (what grows
with N). For each N in ``--workers``, one node ``serve --workers N`` (a supervisor and N gateway
processes in a private mesh) in front of one zero-cost simulated engine: after ``--settle-s`` for the
processes to start, join and sync, the CPU of the whole process tree (user + system, from /proc) over
``--window-s`` with no request, its proportional memory (PSS, /proc/PID/smaps_rollup: pages shared
between processes counted once in all) and its threads. N may exceed the cores: idle processes do
not compete for them.

    python tests/bench/workers_idle.py [--workers 1 2 4 8] [--window-s 30] [--settle-s 20]

/proc counts CPU in clock ticks (10 ms here): over 30 s a figure is good to ~0.4 ms/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import EngineProcess, NodeProcess, default_log_dir  # noqa: E402
from tests.bench.smg_compare import MODEL, model_dir, tree_cpu_seconds, tree_pids  # noqa: E402


def pss_mib_and_threads(pid: int) -> "tuple[float, int]":
    pss_kib, threads = 0, 0
    for member in tree_pids(pid):
        try:
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss_kib += int(line.split()[1])
            threads += len(list(Path(f"/proc/{member}/task").iterdir()))
        except OSError:
            continue  # it exited meanwhile
    return pss_kib / 1024, threads


def measure(workers: int, engine: EngineProcess, model: Path, log_dir: Path, settle_s: float,
            window_s: float) -> dict:
    node = NodeProcess(["--workers", str(workers), "--worker-urls", engine.url, "--tokenizer-path", str(model),
                        "--log-level", "warning"], log_dir, f"idle-w{workers}")
    try:
        time.sleep(settle_s)
        pid = node.process.pid
        cpu0, wall0 = tree_cpu_seconds(pid), time.monotonic()
        time.sleep(window_s)
        cpu_ms_per_s = (tree_cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0) * 1000
        pss_mib, threads = pss_mib_and_threads(pid)
        processes = len(tree_pids(pid))
    finally:
        node.stop()
    return {"workers": workers, "cpu_ms_per_s": cpu_ms_per_s, "pss_mib": pss_mib, "threads": threads,
            "processes": processes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=20.0)
    args = parser.parse_args()
    log_dir = default_log_dir()
    model = model_dir(log_dir)
    engine = EngineProcess(["--zero-cost", "--model-name", MODEL, "--tokenizer-path", str(model)], log_dir)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    try:
        for workers in args.workers:
            rows.append(measure(workers, engine, model, log_dir, args.settle_s, args.window_s))
            print(rows[-1], file=sys.stderr, flush=True)
    finally:
        engine.stop()
    print(f"\nOne node by --workers, one zero-cost engine, no requests; {args.window_s:.0f} s after "
          f"{args.settle_s:.0f} s to settle; started {started}.\n")
    print("| --workers | processes | idle CPU ms per s | per gateway process | memory (PSS) MiB | per gateway process "
          "| threads |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        n = row["workers"]
        print(f"| {n} | {row['processes']} | {row['cpu_ms_per_s']:.1f} | {row['cpu_ms_per_s'] / n:.1f} | "
              f"{row['pss_mib']:.0f} | {row['pss_mib'] / n:.0f} | {row['threads']} |")


if __name__ == "__main__":
    main()

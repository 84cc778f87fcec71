"""System calls per request: smg-node against smg 1.13.0, counted by ``strace -c -f``.

Not a test: it prints figures. Whole-process CPU counts the kernel's time too, which
``instructions.py`` (user space only) leaves out; this counts what the gateway asks of the kernel
for the same sequential requests. Each gateway runs in front of the same zero-cost simulated engine
and tokenizer files as ``instructions.py``; after ``--warmup`` requests ``strace -f -c`` attaches to
every thread of its process, one keep-alive client sends ``--requests`` requests one after the other,
and strace's summary is divided by them. The gateway's own timers run meanwhile (a few calls a second:
within the figures' last digit at these rates). strace slows each call, so its times are not the
gateway's; the counts are.

    python tests/bench/syscalls.py [--requests 1000] [--scenarios short long] [--stream both|yes|no]
        [--gateways smg-node smg] [--smg-venv DIR]

Needs strace (Debian's ``strace`` package) and makes smg's venv like smg_compare.py.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import EngineProcess, default_log_dir  # noqa: E402
from tests.bench.instructions import API_PATHS, gateway_argv, send_requests, wait_serving  # noqa: E402
from tests.bench.smg_compare import (  # noqa: E402
    MODEL, SMG_VERSION, conversation_bodies, engine_pacing_args, ensure_smg, free_port, model_dir, stop_process)

ATTACH_SETTLE_S = 1.0  # strace -p attaches to each thread in turn before it reports anything


def strace_summary(path: Path) -> "dict[str, int]":
    """calls by system call name, from ``strace -c``'s table."""
    calls: dict[str, int] = collections.Counter()
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            calls[parts[-1]] += int(parts[3])
    return calls


def count_calls(name: str, scenario: str, stream: bool, args, engine_url: str, model: Path, smg: Path,
                log_dir: Path) -> "dict[str, int]":
    port = free_port()
    tag = f"{name}-{scenario}-{'stream' if stream else 'unary'}"
    log, summary = log_dir / f"{tag}.log", log_dir / f"strace.{tag}"
    node_args = ["--tool-call-parser", "none", "--reasoning-parser", "none"] if name == "smg-node" else []
    with open(log, "ab") as log_file:
        process = subprocess.Popen(gateway_argv(name, port, engine_url, model, smg, node_args),
                                   stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, cwd=ROOT)
    path = API_PATHS["chat"]
    try:
        bodies = conversation_bodies(scenario, stream)
        wait_serving(port, bodies, process, log, [], None, path)
        trio.run(send_requests, port, bodies, args.warmup, [], None, path)
        tracer = subprocess.Popen(["strace", "-f", "-c", "-o", str(summary), "-p", str(process.pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(ATTACH_SETTLE_S)
        trio.run(send_requests, port, bodies, args.requests, [], None, path)
        tracer.send_signal(signal.SIGINT)
        tracer.wait(60)
    finally:
        stop_process(process, 60)
    return strace_summary(summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--scenarios", nargs="+", default=["short", "long"])
    parser.add_argument("--stream", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--gateways", nargs="+", default=["smg-node", "smg"])
    parser.add_argument("--smg-venv", type=Path, default=ROOT / ".bench" / "smg-venv")
    args = parser.parse_args()
    if shutil.which("strace") is None:
        sys.exit("needs strace (apt-get install strace)")
    smg = ensure_smg(args.smg_venv) if "smg" in args.gateways else Path("smg")
    log_dir = default_log_dir()
    model = model_dir(log_dir)
    engine = EngineProcess([*engine_pacing_args(0.0), "--model-name", MODEL, "--tokenizer-path", str(model)], log_dir)
    streams = {"both": [False, True], "yes": [True], "no": [False]}[args.stream]
    print(f"System calls per request (strace -c -f), {args.requests} sequential requests after {args.warmup} "
          f"warm-up ones, smg {SMG_VERSION}. Logs: {log_dir}\n")
    print("| scenario | stream | gateway | calls per request | the most frequent |")
    print("|---|---|---|---|---|")
    try:
        for scenario in args.scenarios:
            for stream in streams:
                for name in args.gateways:
                    calls = count_calls(name, scenario, stream, args, engine.url, model, smg, log_dir)
                    top = ", ".join(f"{call} {count / args.requests:.1f}" for call, count in
                                    sorted(calls.items(), key=lambda kv: -kv[1])[:6])
                    print(f"| {scenario} | {'yes' if stream else 'no'} | {name} | "
                          f"{sum(calls.values()) / args.requests:.1f} | {top} |", flush=True)
    finally:
        engine.stop()


if __name__ == "__main__":
    main()

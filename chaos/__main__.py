"""``python -m chaos run SCENARIO|all --nodes 5 --seed 42 --duration 60`` and ``python -m chaos list``.

``run`` starts real smg-node processes, simulated engines and a load balancer on
127.0.0.1, drives load through the balancer with the openai SDK, strikes the
scenario's faults, checks the invariants, writes a report (JSON, Markdown, PNG)
and exits non-zero when a check failed. ``all`` runs every scenario and writes
an index.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from .preflight import missing
from .scenarios import ENGINE_SCENARIOS, SCENARIOS

DEFAULT_OUT = Path("chaos-reports")


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the scenarios")
    run = commands.add_parser("run", help="run a scenario (or all of them)")
    run.add_argument("scenario", choices=[*SCENARIOS, "all"])
    run.add_argument("--nodes", type=int, default=5)
    run.add_argument("--seed", type=int, default=42)
    run.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    run.add_argument("--lb", choices=("nginx", "haproxy"), default="nginx")
    run.add_argument("--out", type=Path, default=DEFAULT_OUT, help="reports go to OUT/SCENARIO/")
    run.add_argument("--base-port", type=int, default=21000, help="fixed ports from here (below 32768)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, (_, text) in SCENARIOS.items():
            print(f"{name:18} {text}")
        return 0
    nodes_min = 2 if args.scenario in ENGINE_SCENARIOS else 3
    if args.nodes < nodes_min:
        parser.error(f"--nodes must be at least {nodes_min}" + ("" if nodes_min == 2 else
                     " (a partition needs two sides and a majority; only the engine faults run on two nodes)"))
    problems = missing(args.lb)
    if problems:
        print("python -m chaos: missing before the run can start:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    from .report import write_report
    from .run import run_scenario

    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    command = "python -m chaos " + shlex.join(argv if argv is not None else sys.argv[1:])
    outcomes = []
    for k, name in enumerate(names):
        started = time.monotonic()
        # Each scenario on its own ports: sockets of the previous one may linger in TIME_WAIT.
        data = run_scenario(name, args.nodes, args.seed, args.duration, args.out / name, args.lb,
                            base_port=args.base_port + 400 * k)
        paths = write_report(data, args.out / name, command)
        verdict = "PASSED" if data.passed else "FAILED"
        print(f"[{name}] {verdict} in {time.monotonic() - started:.0f} s; report: {paths['markdown']}")
        for r in data.results:
            print(f"    {'ok  ' if r.passed else 'FAIL'} {r.name}: {r.summary}")
        outcomes.append((name, data.passed))
    if len(names) > 1:
        index = args.out / "README.md"
        rows = [f"| [{n}]({n}/report.md) | {'pass' if ok else '**FAIL**'} | ![]({n}/timeline.png) |"
                for n, ok in outcomes]
        index.write_text("\n".join(["# Chaos runs", "", f"`{command}`", "", "| scenario | result | timeline |",
                                    "|---|---|---|", *rows, ""]))
        print(f"index: {index}")
    return 0 if all(ok for _, ok in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

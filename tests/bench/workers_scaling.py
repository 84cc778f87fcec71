"""Does a node's throughput grow with ``--workers``? One node per worker count, wrk as the client.

Not a test: it prints figures. On a machine where the client and the engine
also need CPU, a node's throughput is bounded by what they leave, so this
measures two things, both with ``wrk`` (C, a few percent of a core) instead of
a Python client:

* ``tokenize-long``: ``POST /v1/tokenize`` of a unique ~7,800-token chat (chat
  template + tokenizer, the gateway's own CPU work; no engine in the path);
* ``chat-short`` and ``chat-long``: ``POST /v1/chat/completions`` of a unique
  ~18- or ~7,800-token chat through one zero-cost simulated engine (16 output
  tokens, not streamed): the whole path, engine included.

The nodes under comparison (``--workers`` values, default 1 and 2) run at once
in front of one engine; each cell drives each node in turn (order alternating,
``--repeats`` times) for ``--seconds`` after a 1 s warm-up, and reports the
median requests/s, the ratio to the first worker count, and the CPU cores that
the node, the engine and wrk used meanwhile (from /proc and wait4).

    python tests/bench/workers_scaling.py [--workers 1 2] [--seconds 10] [--repeats 3]
        [--connections 32] [--scenarios tokenize-long chat-short chat-long]

Needs ``wrk`` (Debian: ``apt-get install wrk``). Markdown to stdout, progress
to stderr.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import EngineProcess, NodeProcess, default_log_dir  # noqa: E402
from tests.bench.gateway_bench import cpu_seconds  # noqa: E402
from tests.bench.smg_compare import MODEL, OUTPUT_TOKENS, model_dir, tree_cpu_seconds  # noqa: E402

_SENTENCE = ("The gateway tokenizes every prompt before it reaches the engine, so the engine only ever sees "
             "token ids and spends its time on the model. ")
LONG_REPEATS = 279  # ~7,800 tokens with the Qwen3 tokenizer, as in smg_compare.py

SCENARIOS = {
    # name: (path, request body fields other than the messages, repeats of the sentence)
    "tokenize-long": ("/v1/tokenize", '"add_generation_prompt":true', LONG_REPEATS),
    "chat-short": ("/v1/chat/completions", f'"max_tokens":{OUTPUT_TOKENS},"ignore_eos":true', 0),
    "chat-long": ("/v1/chat/completions", f'"max_tokens":{OUTPUT_TOKENS},"ignore_eos":true', LONG_REPEATS),
}

# Every request unique, across runs too (a counter and the run's id lead the text, so no tokenizer
# cache or prefix cache holds any of it); the body is built in wrk's Lua, a few microseconds each.
_LUA = """
local counter = 0
local run = "?"
init = function(args) run = args[1] end
local path = "%(path)s"
local tail = [[%(tail)s]]
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  counter = counter + 1
  local body = '{"model":"%(model)s","messages":[{"role":"user","content":"Request ' .. counter ..
    ' of run ' .. run .. '. ' .. tail .. '"}],%(fields)s}'
  return wrk.format(nil, path, nil, body)
end
"""


def lua_script(scenario: str, directory: Path) -> Path:
    path, fields, repeats = SCENARIOS[scenario]
    tail = _SENTENCE * repeats if repeats else "Say something short about gateways."
    script = directory / f"{scenario}.lua"
    script.write_text(_LUA % {"path": path, "tail": tail, "model": MODEL, "fields": fields})
    return script


_RUN_IDS = (f"{os.getpid()}-{n}" for n in itertools.count())


def run_wrk(url: str, script: Path, connections: int, seconds: int) -> dict:
    """wrk's figures plus its own CPU seconds (from wait4, so nothing is missed when it exits)."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "-s", str(script), url,
            "--", next(_RUN_IDS)]  # after "--": the Lua script's init(args)
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = process.stdout.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed:\n{output}")
    requests = int(re.search(r"(\d+) requests in", output).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    return {"requests": requests, "non_2xx": int(bad.group(1)) if bad else 0,
            "socket_errors": sum(map(int, errors.groups())) if errors else 0,
            "wrk_cpu_s": usage.ru_utime + usage.ru_stime, "output": output}


def measure(node: NodeProcess, engine: EngineProcess, script: Path, connections: int, seconds: int) -> dict:
    url = node.url
    run_wrk(url, script, connections, 1)  # warm-up: connections open, the node's and engine's lazy state built
    node_pid, engine_pid = node.process.pid, engine.process.pid
    node_cpu0, engine_cpu0, wall0 = tree_cpu_seconds(node_pid), cpu_seconds(engine_pid), time.perf_counter()
    result = run_wrk(url, script, connections, seconds)
    wall_s = time.perf_counter() - wall0
    node_cpu_s = tree_cpu_seconds(node_pid) - node_cpu0
    return {
        "rps": result["requests"] / seconds,
        "errors": result["non_2xx"] + result["socket_errors"],
        "node_cores": node_cpu_s / wall_s,
        "node_cpu_ms_per_request": 1000 * node_cpu_s / max(1, result["requests"]),
        "engine_cores": (cpu_seconds(engine_pid) - engine_cpu0) / wall_s,
        "wrk_cores": result["wrk_cpu_s"] / wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")

    log_dir = default_log_dir()
    model = model_dir(log_dir)
    scripts = Path(tempfile.mkdtemp(prefix="wrk-"))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    engine = EngineProcess(["--zero-cost", "--model-name", MODEL, "--tokenizer-path", str(model), "--batch-size-max",
                            "4096", "--queue-size-max", "16384"], log_dir)
    nodes: dict[int, NodeProcess] = {}
    rows: dict[tuple[str, int], list[dict]] = {}
    try:
        for count in args.workers:
            nodes[count] = NodeProcess(["--workers", str(count), "--worker-urls", engine.url, "--tokenizer-path",
                                        str(model), "--log-level", "warning", "--max-concurrent-requests", "0"],
                                       log_dir, f"node-w{count}")
        time.sleep(3)  # the workers' private mesh settles, the engine's KV stream is followed
        for scenario in args.scenarios:
            script = lua_script(scenario, scripts)
            for repeat in range(args.repeats):
                order = args.workers if repeat % 2 == 0 else args.workers[::-1]
                for count in order:
                    row = measure(nodes[count], engine, script, args.connections, args.seconds)
                    rows.setdefault((scenario, count), []).append(row)
                    print(f"{scenario:13} workers={count} rps={row['rps']:.0f} node={row['node_cores']:.2f} cores "
                          f"engine={row['engine_cores']:.2f} wrk={row['wrk_cores']:.2f} errors={row['errors']}",
                          file=sys.stderr, flush=True)
    finally:
        for node in nodes.values():
            node.stop()
        engine.stop()
    print_report(args, rows, started)


def print_report(args, rows: dict[tuple[str, int], list[dict]], started: str) -> None:
    def median(scenario: str, count: int, key: str) -> float:
        return statistics.median(r[key] for r in rows[(scenario, count)])

    base = args.workers[0]
    print(f"Run {started}, {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"`python tests/bench/workers_scaling.py --workers {' '.join(map(str, args.workers))} --seconds "
          f"{args.seconds} --repeats {args.repeats} --connections {args.connections}`; medians of "
          f"{args.repeats}.\n")
    print(f"| scenario | workers | req/s | vs workers={base} | node CPU ms/req | cores: node / engine / wrk "
          "| errors |")
    print("|---|---|---|---|---|---|---|")
    for scenario in args.scenarios:
        for count in args.workers:
            rps = median(scenario, count, "rps")
            ratio = rps / median(scenario, base, "rps")
            print(f"| {scenario} | {count} | {rps:.0f} | {ratio:.2f}x | "
                  f"{median(scenario, count, 'node_cpu_ms_per_request'):.2f} | "
                  f"{median(scenario, count, 'node_cores'):.2f} / {median(scenario, count, 'engine_cores'):.2f} / "
                  f"{median(scenario, count, 'wrk_cores'):.2f} | "
                  f"{sum(r['errors'] for r in rows[(scenario, count)])} |")


if __name__ == "__main__":
    main()

"""Throughput with a C client: a node by ``--workers``, and smg 1.13.0 in the same run.

Not a test: it prints figures. ``smg_compare.py``'s Python client takes most of a core on this
2-core machine, so its requests/s say more about the client than about the gateways. Here ``wrk``
(C, a few percent of a core) drives each gateway in turn, every request unique:

* ``tokenize-long``: ``POST /v1/tokenize`` of a unique ~7,800-token chat (chat template +
  tokenizer, the gateway's own CPU work; no engine in the path; smg-node only);
  ``tokenize-short`` the same for a unique ~18-token chat (encoded on the event loop, so one
  process uses at most one core: how a node's own work scales with ``--workers``);
* ``chat-short`` and ``chat-long``: ``POST /v1/chat/completions`` of a unique ~18- or
  ~7,800-token chat through one zero-cost simulated engine (16 output tokens, not streamed);
  ``chat-short-stream``: the short one streamed (wrk reads the SSE body to its end);
* ``chat-multiturn``: 4-turn conversations under one shared ~2,000-token system prompt, as
  ``smg_compare.py``'s multi-turn (each request one more turn of a conversation).

The engine runs with ``--no-prefix-caching`` unless ``--engine-prefix-caching``: its prefix cache
hashes every 16-token block of a prompt and builds KV events in Python, ~3.7 ms of CPU per
7,800-token prompt, which made the engine (one core, saturated) the bottleneck of every chat
scenario; no gateway here follows the events of a single engine anyway.

Gateways (``--gateways``): ``smg-node-w<N>`` (``serve --workers N``), ``smg-node-all``
(``--workers 0``: one process per core less one), either with ``@PATH`` for the code of the checkout at
PATH (``smg-node-w1@/tmp/base``: a change against its parent) or for the Python interpreter at
PATH (``smg-node-w1@/work/venv-deb/bin/python``: another CPython build), in the same run, and with
``+SWITCH`` for a switch of ``serve``'s (``smg-node-w1+engine-read-thread``);
``smg`` (``smg launch``, its defaults: tokenizer caches off) and ``smg-cache`` (its L0 and L1
caches on). All start at once in front of the one engine;
each cell drives each gateway in turn (order alternating, ``--repeats`` times) for ``--seconds``
after a 1 s warm-up, and reports the median requests/s, its ratio to the first gateway and to
smg, and the CPU the gateway (its whole process tree, less what it burns idle), the engine and wrk
used meanwhile (from /proc and wait4).

    python tests/bench/workers_scaling.py [--gateways smg-node-w1 smg-node-w2 smg] [--seconds 10]
        [--repeats 3] [--connections 32] [--scenarios tokenize-long tokenize-short chat-short chat-long
        chat-short-stream chat-multiturn]
        [--smg-venv DIR] [--engine-prefix-caching] [--token-interval-s S] [--decode-steps]

Needs ``wrk`` (Debian: ``apt-get install wrk``); makes smg's venv like smg_compare.py when a smg
gateway is asked for. Markdown to stdout, progress to stderr.
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

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import EngineProcess, default_log_dir  # noqa: E402
from tests.bench.gateway_bench import cpu_seconds  # noqa: E402
from tests.bench.smg_compare import (  # noqa: E402
    LONG_TEXT, MODEL, OUTPUT_TOKENS, SYSTEM_PROMPT, TURNS, Gateway, engine_pacing_args, ensure_smg, model_dir,
    start_gateways, tree_cpu_seconds)

_SHORT_TEXT = "Say something short about gateways."
_CHAT_FIELDS = f'"max_tokens":{OUTPUT_TOKENS},"ignore_eos":true'

# Lua returning the JSON of request n's messages; `run` (the wrk run's id) and n make every request
# unique, across runs too, so no tokenizer cache holds any of it (a first version repeated the bodies
# of earlier runs, and cache hits lifted one process from 153 to 486 req/s over three rounds).
_ONE_MESSAGE = """
  return '[{"role":"user","content":"Request ' .. n .. ' of run ' .. run .. '. ' .. %(text)s .. '"}]'
"""
# Turn t of conversation c: the shared system prompt, t earlier question/answer pairs, question t
# (the shape of smg_compare.py's multi-turn bodies). Successive requests take successive turns.
_CONVERSATION = """
  local c, t = math.floor(n / %(turns)d), n %% %(turns)d  -- LuaJIT (Lua 5.1): no // operator
  local parts = {'[{"role":"system","content":"' .. %(system)s .. '"}'}
  for k = 0, t do
    parts[#parts + 1] = ',{"role":"user","content":"Conversation ' .. c .. ' of run ' .. run ..
      ', question ' .. k .. ': what does the gateway do with prompt number ' .. (k * 7 + c) .. '?"}'
    if k < t then
      parts[#parts + 1] = ',{"role":"assistant","content":"It tokenizes prompt ' .. (k * 7 + c) ..
        ' and sends the ids to the engine."}'
    end
  end
  parts[#parts + 1] = ']'
  return table.concat(parts)
"""


def lua_json_text(text: str) -> str:
    """A Lua literal of ``text`` as it goes inside a JSON string (long brackets: quotes stay as they are)."""
    assert "]==]" not in text
    return "[==[" + orjson.dumps(text).decode()[1:-1] + "]==]"


SCENARIOS = {
    # name: (path, request body fields other than the messages, Lua for the messages)
    "tokenize-long": ("/v1/tokenize", '"add_generation_prompt":true',
                      _ONE_MESSAGE % {"text": lua_json_text(LONG_TEXT)}),
    "tokenize-short": ("/v1/tokenize", '"add_generation_prompt":true',
                       _ONE_MESSAGE % {"text": lua_json_text(_SHORT_TEXT)}),
    "chat-short": ("/v1/chat/completions", _CHAT_FIELDS, _ONE_MESSAGE % {"text": lua_json_text(_SHORT_TEXT)}),
    "chat-long": ("/v1/chat/completions", _CHAT_FIELDS, _ONE_MESSAGE % {"text": lua_json_text(LONG_TEXT)}),
    "chat-short-stream": ("/v1/chat/completions", _CHAT_FIELDS + ',"stream":true',
                          _ONE_MESSAGE % {"text": lua_json_text(_SHORT_TEXT)}),
    "chat-multiturn": ("/v1/chat/completions", _CHAT_FIELDS,
                       _CONVERSATION % {"turns": TURNS, "system": lua_json_text(SYSTEM_PROMPT)}),
}
NODE_ONLY = {"tokenize-long", "tokenize-short"}  # smg's /v1/tokenize takes another body: smg-node only

_LUA = """
local counter = 0
local run = "?"
init = function(args) run = args[1] end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local messages = function(n)
%(messages)s
end
request = function()
  local body = '{"model":"%(model)s","messages":' .. messages(counter) .. ',%(fields)s}'
  counter = counter + 1
  return wrk.format(nil, "%(path)s", nil, body)
end
"""


def lua_script(scenario: str, directory: Path) -> Path:
    path, fields, messages = SCENARIOS[scenario]
    script = directory / f"{scenario}.lua"
    script.write_text(_LUA % {"path": path, "messages": messages, "model": MODEL, "fields": fields})
    return script


_RUN_IDS = (f"{os.getpid()}-{n}" for n in itertools.count())


def run_wrk(url: str, script: Path, connections: int, seconds: int) -> dict:
    """wrk's figures plus its own CPU seconds (from wait4, so nothing is missed when it exits)."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "--latency", "-s", str(script),
            url, "--", next(_RUN_IDS)]  # after "--": the Lua script's init(args)
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
            "p50_ms": _latency_ms(output, "50%"), "p99_ms": _latency_ms(output, "99%"),
            "wrk_cpu_s": usage.ru_utime + usage.ru_stime, "output": output}


def _latency_ms(output: str, percentile: str) -> float:
    """A percentile of wrk's --latency distribution ("  99%   12.34ms"), in milliseconds."""
    match = re.search(rf"^\s*{percentile}\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE)
    if match is None:
        return float("nan")
    return float(match.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[match.group(2)]


def measure(gateway: Gateway, engine: EngineProcess, script: Path, connections: int, seconds: int) -> dict:
    url = f"http://{gateway.host}:{gateway.port}"
    run_wrk(url, script, connections, 1)  # warm-up: connections open, the gateway's and engine's lazy state built
    pid, engine_pid = gateway.process.process.pid, engine.process.pid
    cpu0, engine_cpu0, wall0 = tree_cpu_seconds(pid), cpu_seconds(engine_pid), time.perf_counter()
    result = run_wrk(url, script, connections, seconds)
    wall_s = time.perf_counter() - wall0
    cpu_s = tree_cpu_seconds(pid) - cpu0 - gateway.idle_cpu_per_s * wall_s
    return {
        "rps": result["requests"] / seconds,
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "errors": result["non_2xx"] + result["socket_errors"],
        "gateway_cores": cpu_s / wall_s,
        "cpu_ms_per_request": 1000 * cpu_s / max(1, result["requests"]),
        "engine_cores": (cpu_seconds(engine_pid) - engine_cpu0) / wall_s,
        "wrk_cores": result["wrk_cpu_s"] / wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateways", nargs="+", default=["smg-node-w1", "smg-node-w2"])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--smg-venv", type=Path, default=ROOT / ".bench" / "smg-venv")
    parser.add_argument("--engine-prefix-caching", action="store_true",
                        help="keep the engine's prefix cache and KV events (its most expensive work)")
    parser.add_argument("--token-interval-s", type=float, default=0.0,
                        help="the engine sends each stream a token every this many seconds, as a real engine's "
                             "decode step does (0: as fast as it can, so a stream's tokens reach the gateway "
                             "in bursts); give --connections enough streams to keep the gateway busy")
    parser.add_argument("--decode-steps", action="store_true",
                        help="with --token-interval-s: the engine hands every running stream's token over at the "
                             "end of one shared step, as a real engine's batched decode does (default: each stream "
                             "on its own clock, every token a wake-up of its own)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    if any(not g.startswith("smg-node") for g in args.gateways):
        smg = ensure_smg(args.smg_venv)
    else:
        smg = args.smg_venv / "bin" / "smg"  # not used

    log_dir = default_log_dir()
    model = model_dir(log_dir)
    scripts = Path(tempfile.mkdtemp(prefix="wrk-"))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    engine_args = [*engine_pacing_args(args.token_interval_s), "--model-name", MODEL, "--tokenizer-path", str(model),
                   "--batch-size-max", "4096", "--queue-size-max", "16384"]
    if not args.engine_prefix_caching:
        engine_args.append("--no-prefix-caching")
    if args.decode_steps:
        engine_args.append("--decode-steps")
    engine = EngineProcess(engine_args, log_dir)
    gateways: list[Gateway] = []
    rows: dict[tuple[str, str], list[dict]] = {}
    try:
        gateways = start_gateways(args.gateways, engine.url, smg, log_dir, model)
        for scenario in args.scenarios:
            script = lua_script(scenario, scripts)
            eligible = [g for g in gateways if scenario not in NODE_ONLY or g.name.startswith("smg-node")]
            for repeat in range(args.repeats):
                for gateway in (eligible if repeat % 2 == 0 else eligible[::-1]):
                    row = measure(gateway, engine, script, args.connections, args.seconds)
                    rows.setdefault((scenario, gateway.name), []).append(row)
                    print(f"{scenario:14} {gateway.name:12} rps={row['rps']:.0f} gateway={row['gateway_cores']:.2f} "
                          f"cores engine={row['engine_cores']:.2f} wrk={row['wrk_cores']:.2f} "
                          f"errors={row['errors']}", file=sys.stderr, flush=True)
    finally:
        for gateway in gateways:
            gateway.process.stop(timeout_s=30)
        engine.stop()
    print_report(args, rows, started)


def print_report(args, rows: dict[tuple[str, str], list[dict]], started: str) -> None:
    def median(scenario: str, name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[(scenario, name)])

    base = args.gateways[0]
    print(f"Run {started}, {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"`python tests/bench/workers_scaling.py --gateways {' '.join(args.gateways)} --seconds {args.seconds} "
          f"--repeats {args.repeats} --connections {args.connections}"
          f"{' --engine-prefix-caching' if args.engine_prefix_caching else ''}"
          f"{f' --token-interval-s {args.token_interval_s:g}' if args.token_interval_s else ''}"
          f"{' --decode-steps' if args.decode_steps else ''}`; "
          f"medians of {args.repeats}.\n")
    print(f"| scenario | gateway | req/s | vs {base} | vs smg | p50 / p99 ms | CPU ms/req "
          "| cores: gateway / engine / wrk | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    for scenario in args.scenarios:
        for name in args.gateways:
            if (scenario, name) not in rows:
                continue
            rps = median(scenario, name, "rps")
            vs_smg = f"{rps / median(scenario, 'smg', 'rps'):.2f}x" if (scenario, "smg") in rows else "-"
            print(f"| {scenario} | {name} | {rps:.0f} | {rps / median(scenario, base, 'rps'):.2f}x | {vs_smg} | "
                  f"{median(scenario, name, 'p50_ms'):.1f} / {median(scenario, name, 'p99_ms'):.1f} | "
                  f"{median(scenario, name, 'cpu_ms_per_request'):.2f} | "
                  f"{median(scenario, name, 'gateway_cores'):.2f} / {median(scenario, name, 'engine_cores'):.2f} / "
                  f"{median(scenario, name, 'wrk_cores'):.2f} | {sum(r['errors'] for r in rows[(scenario, name)])} |")


if __name__ == "__main__":
    main()

"""smg-node against smg 1.13.0, side by side, on the same zero-cost simulated engine and tokenizer.

Not a test: it prints figures. What it does:

1. Makes a separate virtual environment with ``smg==1.13.0`` (a benchmark-only
   dependency; ``--smg-venv``, default ``.bench/smg-venv``) unless it exists.
2. Starts one zero-cost simulated engine (no prefill or decode delay; model
   name ``sim-model``, so neither gateway runs a reasoning parser) and, all at
   once, the gateways under comparison, each on its own port and all pointed
   at that engine with the same Qwen3 tokenizer files, laid out as a model
   directory (tokenizer files plus a ``config.json``; see ``model_dir``):
   ``smg-node --workers 1``, ``smg-node --workers 0`` (one per core less one), ``smg``
   with its defaults (tokenizer caches off) and ``smg`` with its L0 and L1
   tokenizer caches on.
3. For every scenario and concurrency, drives each gateway in turn (the
   order rotates from cell to cell, and each cell is measured ``--repeats``
   times, alternating) with a lean HTTP/1.1 keep-alive client for
   ``--seconds``, and reports the median of the repeats: requests/s, latency
   p50/p99, time to first token p50/p99 (streaming), and the gateway's CPU
   time per request (user+system of its whole process tree, from /proc, less
   what the gateway burns idle, measured for 5 s before the cells: the client
   and the engine are not counted).

Scenarios (16 output tokens each, ``ignore_eos``):

* ``short``: a chat of ~18 prompt tokens, unique per request;
* ``long``: a chat of ~7,800 prompt tokens, unique per request (the counter
  leads the text, so no cache can hold any of it);
* ``multiturn``: conversations of 4 turns sharing one ~2,000-token system
  prompt; each turn resends the history plus a new question (what chat
  clients do), each conversation is unique.

    python tests/bench/smg_compare.py [--seconds 5] [--repeats 2] [--concurrency 1 16 64 256]
        [--scenarios short long multiturn] [--stream both|yes|no] [--gateways NAME...]

The result table (Markdown) goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import EngineProcess, NodeProcess, default_log_dir  # noqa: E402
from gateway.tokenizer.bundled import default_tokenizer_dir  # noqa: E402
from tests.bench.gateway_bench import Connection, cpu_seconds, drive  # noqa: E402

SMG_VERSION = "1.13.0"
MODEL = "sim-model"
OUTPUT_TOKENS = 16
SENTENCE = ("The gateway tokenizes every prompt before it reaches the engine, so the engine only ever sees "
            "token ids and spends its time on the model. ")
LONG_TEXT = SENTENCE * 279  # ~7,800 tokens with the Qwen3 tokenizer
SYSTEM_PROMPT = ("You are a careful assistant for a company's internal documentation. " + SENTENCE * 70)
TURNS = 4
IDLE_MEASURE_S = 5.0
_NUMBERS = itertools.count()


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every process descended from it (the supervisor's workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += children.get(current, [])
    return out


def tree_cpu_seconds(pid: int) -> float:
    """user+system CPU of a process and all its descendants (the supervisor's workers, smg's threads)."""
    total = 0.0
    for member in tree_pids(pid):
        try:
            total += cpu_seconds(member)
        except OSError:
            continue  # it exited meanwhile
    return total


# -- gateways -------------------------------------------------------------------

@dataclasses.dataclass
class Gateway:
    name: str
    process: "NodeProcess | SmgProcess"
    host: str
    port: int
    # CPU seconds per second it burns with no request (health checks, load polls, gossip): taken out
    # of the cells' figures, so a cell with few requests is not charged for the gateway's idling.
    idle_cpu_per_s: float = 0.0


class SmgProcess:
    """smg prints a banner, not a READY line: it is ready when a chat request succeeds (wait_serving)."""

    def __init__(self, argv: list[str], log_dir: Path, name: str) -> None:
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def stop(self, timeout_s: float = 10.0) -> int:
        return stop_process(self.process, timeout_s)


def stop_process(process: subprocess.Popen, timeout_s: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if it is still there after ``timeout_s``; its exit status."""
    process.terminate()
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(30)


def ensure_smg(venv: Path) -> Path:
    smg = venv / "bin" / "smg"
    if not smg.exists():
        print(f"installing smg=={SMG_VERSION} into {venv} (benchmark only)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"smg=={SMG_VERSION}"], check=True)
    return smg


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A text-only Qwen3 model's config.json, as a model directory holds it. smg 1.13.0 reads the model's
# config.json from the tokenizer path the engine reports on every chat request (its multimodal check);
# without one it asks huggingface.co for it, resolving the name each time. Here, where DNS gets no
# answer, about one lookup in 30 waited for the resolver's 5 s retry: smg held that request 5 s
# (diagnosed with strace, 2026-11-22). A real engine reports a real model directory, so the benchmark
# gives both gateways one.
_MODEL_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
                 "bos_token_id": 151643, "eos_token_id": 151645, "max_position_embeddings": 40960,
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def engine_pacing_args(token_interval_s: float) -> list[str]:
    """The simulated engine's timing: a token every ``token_interval_s`` per stream, as a real engine's
    decode step hands them over, or (0) as fast as it can (``--zero-cost``: a stream's tokens in bursts)."""
    if not token_interval_s:
        return ["--zero-cost"]
    return ["--itl-base-s", str(token_interval_s), "--itl-per-running-s", "0", "--prefill-s-per-token", "0"]


def model_dir(log_dir: Path) -> Path:
    """The bundled tokenizer's files (linked) plus a config.json: what a served model's directory holds."""
    path = log_dir / "model"
    path.mkdir(exist_ok=True)
    for source in default_tokenizer_dir().iterdir():
        link = path / source.name
        if not link.exists():
            link.symlink_to(source)
    (path / "config.json").write_bytes(orjson.dumps(_MODEL_CONFIG, option=orjson.OPT_INDENT_2))
    return path


def start_gateways(names: list[str], engine_url: str, smg: Path, log_dir: Path, model: Path) -> list[Gateway]:
    tokenizer = str(model)
    out = []
    for name in names:
        if name.startswith("smg-node"):
            # smg-node-w<N>[+FLAG...][@PATH], PATH a checkout (its code) or a Python (that interpreter with its
            # packages), each +FLAG a switch of serve's (+engine-read-thread: --engine-read-thread) or +FLAG=VALUE
            # an option (+tokenizer-cache-l1-bytes=0): the variants of one change measured in one run.
            kind, _, variant = name.partition("@")
            kind, *switches = kind.split("+")
            workers = "0" if kind == "smg-node-all" else kind.removeprefix("smg-node-w")
            path = Path(variant) if variant else ROOT
            # No parsers: the simulated engine says Qwen3ForCausalLM, which would pick Qwen3's (these
            # scenarios measure the plain path; instructions.py --scenarios agent measures parsing).
            node = NodeProcess(["--workers", workers, "--worker-urls", engine_url, "--tokenizer-path", tokenizer,
                                "--log-level", "warning", "--max-concurrent-requests", "0",
                                "--tool-call-parser", "none", "--reasoning-parser", "none",
                                *[part for switch in switches for part in f"--{switch}".split("=", 1)]], log_dir,
                               name.replace("/", "_"), cwd=path if path.is_dir() else ROOT,
                               python=str(path) if path.is_file() else sys.executable)
            host, port = node.url.removeprefix("http://").rsplit(":", 1)
            out.append(Gateway(name, node, host, int(port)))
        else:
            port = free_port()
            argv = [str(smg), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", engine_url,
                    "--tokenizer-path", tokenizer, "--log-level", "warn", "--prometheus-port", str(free_port()),
                    "--prometheus-host", "127.0.0.1"]
            if name == "smg-cache":
                argv += ["--tokenizer-cache-enable-l0", "--tokenizer-cache-enable-l1"]
            process = SmgProcess(argv, log_dir, name)
            out.append(Gateway(name, process, "127.0.0.1", port))
    for gateway in out:
        wait_serving(gateway)
    time.sleep(2)
    for gateway in out:
        pid = gateway.process.process.pid
        cpu0, wall0 = tree_cpu_seconds(pid), time.perf_counter()
        time.sleep(IDLE_MEASURE_S)
        gateway.idle_cpu_per_s = (tree_cpu_seconds(pid) - cpu0) / (time.perf_counter() - wall0)
        print(f"{gateway.name}: idle CPU {gateway.idle_cpu_per_s * 1000:.1f} ms/s", file=sys.stderr, flush=True)
    return out


def wait_serving(gateway: Gateway) -> None:
    """Until a chat request succeeds (smg registers its worker after it listens)."""
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2})

    async def try_once() -> bool:
        try:
            conn = Connection(await trio.open_tcp_stream(gateway.host, gateway.port), gateway.host)
            status, _ = await conn.request("/v1/chat/completions", body)
            await conn.stream.aclose()
            return status == 200
        except OSError:
            return False

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if trio.run(try_once):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{gateway.name} does not answer chat requests; see its log")


# -- load ---------------------------------------------------------------------------

# The "agent" scenario: the engine answers (its --script, agent_script) with Qwen3's reasoning and a
# tool call, the request offers the tool: what parsers work on, with them on or off.
AGENT_OUTPUT = ("<think>\nThe user wants the weather in Oslo for the next days. I should call the weather tool "
                "with the city and the number of days, then summarise.\n</think>\n\n<tool_call>\n"
                '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3, "unit": "celsius"}}\n</tool_call>')
AGENT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]}}}]
AGENT_MAX_TOKENS = 256


def agent_script(log_dir: Path) -> Path:
    """The simulated engine's script for the agent scenario (other prompts get its usual words)."""
    path = log_dir / "agent-script.jsonl"
    path.write_bytes(orjson.dumps({"match": "agent:", "output": AGENT_OUTPUT}) + b"\n")
    return path


def chat_body(messages: list[dict], stream: bool) -> bytes:
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": OUTPUT_TOKENS, "stream": stream,
                         "ignore_eos": True})


def conversation_bodies(scenario: str, stream: bool):
    """An endless sequence of request bodies for one client."""
    while True:
        n = next(_NUMBERS)
        if scenario == "short":
            yield chat_body([{"role": "user", "content": f"{n} What is the capital of France?"}], stream)
        elif scenario == "long":
            yield chat_body([{"role": "user", "content": f"{n} {LONG_TEXT}"}], stream)
        elif scenario == "agent":
            yield orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"{n} agent: the weather "
                                                                                          f"in Oslo?"}],
                                "tools": AGENT_TOOLS, "max_tokens": AGENT_MAX_TOKENS, "stream": stream})
        else:
            messages = [{"role": "system", "content": SYSTEM_PROMPT}]
            for turn in range(TURNS):
                messages.append({"role": "user", "content": f"Conversation {n}, question {turn}: what does the "
                                                            f"gateway do with prompt number {turn * 7 + n}?"})
                yield chat_body(messages, stream)
                messages.append({"role": "assistant", "content": f"It tokenizes prompt {turn * 7 + n} and sends "
                                                                 f"the ids to the engine."})


async def run_cell(gateway: Gateway, scenario: str, stream: bool, concurrency: int, seconds: float) -> dict:
    pid = gateway.process.process.pid
    idle = gateway.idle_cpu_per_s
    return await drive(gateway.host, gateway.port, "/v1/chat/completions",
                       lambda: conversation_bodies(scenario, stream), stream, concurrency, seconds,
                       lambda: tree_cpu_seconds(pid) - idle * time.perf_counter())


def median_row(rows: list[dict]) -> dict:
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows if r[key] is not None]
        out[key] = statistics.median(values) if values else None
    return out


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--scenarios", nargs="+", default=["short", "long", "multiturn"])
    parser.add_argument("--stream", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--gateways", nargs="+", default=["smg-node-w1", "smg-node-all", "smg", "smg-cache"])
    parser.add_argument("--smg-venv", type=Path, default=ROOT / ".bench" / "smg-venv")
    args = parser.parse_args()

    smg = ensure_smg(args.smg_venv)
    log_dir = default_log_dir()
    model = model_dir(log_dir)
    engine = EngineProcess(["--zero-cost", "--model-name", MODEL, "--tokenizer-path", str(model), "--batch-size-max",
                            "4096", "--queue-size-max", "16384"], log_dir)
    gateways: list[Gateway] = []
    results: dict[tuple, dict] = {}
    streams = {"both": [False, True], "yes": [True], "no": [False]}[args.stream]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        gateways = start_gateways(args.gateways, engine.url, smg, log_dir, model)
        rotation = 0
        for scenario in args.scenarios:
            for stream in streams:
                for concurrency in args.concurrency:
                    per_gateway: dict[str, list[dict]] = {g.name: [] for g in gateways}
                    for _ in range(args.repeats):
                        order = gateways[rotation % len(gateways):] + gateways[:rotation % len(gateways)]
                        rotation += 1
                        for gateway in order:
                            row = trio.run(run_cell, gateway, scenario, stream, concurrency, args.seconds)
                            per_gateway[gateway.name].append(row)
                            print(f"{scenario:9} stream={stream!s:5} c={concurrency:<3} {gateway.name:12} "
                                  f"rps={row['rps']:.0f} p50={fmt(row['p50_ms'])} "
                                  f"cpu_ms={fmt(row['cpu_ms_per_request'])} "
                                  f"errors={row['errors']}", file=sys.stderr, flush=True)
                    for name, rows in per_gateway.items():
                        results[(scenario, stream, concurrency, name)] = median_row(rows)
    finally:
        for gateway in gateways:
            gateway.process.stop(timeout_s=30)
        engine.stop()
    print_report(args, results, started)


def print_report(args, results: dict[tuple, dict], started: str) -> None:
    # Each kind's first gateway on the command line (smg-node-w1@/some/python counts as smg-node-w1).
    first_of_kind: dict[str, str] = {}
    for name in args.gateways:
        first_of_kind.setdefault(name.partition("@")[0], name)
    print(f"\nsmg-node vs smg {SMG_VERSION}: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, started {started}; {OUTPUT_TOKENS} output tokens; {args.seconds:.0f} s per "
          f"cell, median of {args.repeats} alternating runs; client, engine and gateways share the machine.\n")
    print("| scenario | stream | conc. | gateway | req/s | p50 ms | p99 ms | TTFT p50 ms | TTFT p99 ms | CPU ms/req "
          "| errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (scenario, stream, concurrency, name), r in results.items():
        print(f"| {scenario} | {'yes' if stream else 'no'} | {concurrency} | {name} | {r['rps']:.0f} | "
              f"{fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | {fmt(r['ttft_p50_ms'])} | {fmt(r['ttft_p99_ms'])} | "
              f"{fmt(r['cpu_ms_per_request'])} | {r['errors']:.0f} |")
    print("\nRatios smg-node / smg (default settings) per cell: throughput (higher is better) and CPU per request "
          f"(lower is better); w1 = {first_of_kind.get('smg-node-w1', '-')}, all = "
          f"{first_of_kind.get('smg-node-all', '-')}.\n")
    print("| scenario | stream | conc. | req/s w1 / smg | req/s all / smg | CPU/req w1 / smg | CPU/req all / smg "
          "| req/s all / w1 |")
    print("|---|---|---|---|---|---|---|---|")
    keys = sorted({k[:3] for k in results}, key=lambda k: (args.scenarios.index(k[0]), k[1], k[2]))
    for scenario, stream, concurrency in keys:
        def get(kind: str, field: str):
            row = results.get((scenario, stream, concurrency, first_of_kind.get(kind)))
            return row[field] if row else None

        def ratio(a, b):
            return f"{a / b:.2f}x" if a is not None and b else "-"

        print(f"| {scenario} | {'yes' if stream else 'no'} | {concurrency} | "
              f"{ratio(get('smg-node-w1', 'rps'), get('smg', 'rps'))} | "
              f"{ratio(get('smg-node-all', 'rps'), get('smg', 'rps'))} | "
              f"{ratio(get('smg-node-w1', 'cpu_ms_per_request'), get('smg', 'cpu_ms_per_request'))} | "
              f"{ratio(get('smg-node-all', 'cpu_ms_per_request'), get('smg', 'cpu_ms_per_request'))} | "
              f"{ratio(get('smg-node-all', 'rps'), get('smg-node-w1', 'rps'))} |")


if __name__ == "__main__":
    main()

"""A provider relay's cost: smg-node calling a hosted provider (a route's openai_compatible target), side by side with
the HTTP-worker relay it already had, smg 1.13.0 relaying the same upstream, and LiteLLM's proxy when its
environment exists, all in front of one fast local upstream that speaks OpenAI's chat completions.

Not a test: it prints figures. What it does:

1. Starts the upstream (a subprocess: asyncio and canned answers, so it costs the gateways' clients nothing to
   wait for): a chat completion of 16 tokens whole, or the same as 16 SSE chunks, usage and [DONE]; with
   ``--wire anthropic``, Anthropic's Messages instead (a message whole, or its events: one content_block_delta a
   word), the clients then sending Messages requests (/v1/messages) and smg relaying with ``--backend anthropic``.
2. Starts each gateway pointed at it:
   ``smg-node`` (``--models-config``: model ``relay`` is a route to an ``openai_compatible`` target),
   ``smg-node-worker`` (the same upstream as an OpenAI-compatible HTTP worker, relayed as it is),
   ``smg`` (``smg launch --backend openai --worker-urls``, from ``.bench/smg-venv``, made by smg_compare.py) and
   ``litellm`` (``.bench/litellm-venv/bin/litellm --config``, when that environment exists: ``python -m venv
   .bench/litellm-venv && .bench/litellm-venv/bin/pip install 'litellm[proxy]'``; its documented minimal config,
   one process).
3. For each concurrency and stream setting, drives each gateway in turn (alternating, ``--repeats`` times) with
   the keep-alive client of gateway_bench.py, and reports medians: the gateway's CPU per request (its process
   tree, less its idle burn), requests/s, latency p50/p99, and the latency it adds over the upstream alone (the
   same cell run straight against the upstream).

    python tests/bench/provider_bench.py [--seconds 5] [--repeats 2] [--concurrency 1 64] [--stream both]
        [--wire openai|anthropic]
        [--gateways smg-node smg-node-worker smg litellm]   (smg-node@DIR: the node of another tree, to compare)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import NodeProcess, default_log_dir  # noqa: E402
from tests.bench.gateway_bench import drive  # noqa: E402
from tests.bench.smg_compare import SmgProcess, ensure_smg, free_port, stop_process, tree_cpu_seconds  # noqa: E402

IDLE_MEASURE_S = 3.0
TOKENS = 16
# The upstream's wire (--wire): OpenAI's chat completions, clients sending chat completions; or Anthropic's
# Messages, clients sending Messages (what smg's anthropic backend and LiteLLM's anthropic/ models relay).
WIRE = "openai"
CLIENT_PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}

UPSTREAM = textwrap.dedent('''
    import asyncio, json, sys
    words = [f"w{i} " for i in range(%(tokens)d)]
    usage = {"prompt_tokens": 12, "completion_tokens": %(tokens)d, "total_tokens": 12 + %(tokens)d}
    dumps = lambda value: json.dumps(value, separators=(",", ":"))  # compact, as OpenAI writes its JSON
    whole = dumps({"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": "relay",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(words)}, "finish_reason": "stop"}],
        "usage": usage}).encode()
    def chunk(delta, finish=None):
        return b"data: " + dumps({"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1,
            "model": "relay", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\\n\\n"
    events = b"".join([chunk({"role": "assistant", "content": ""})] + [chunk({"content": w}) for w in words]
        + [chunk({}, "stop"), b"data: " + dumps({"id": "chatcmpl-up", "object": "chat.completion.chunk",
        "created": 1, "model": "relay", "choices": [], "usage": usage}).encode() + b"\\n\\n", b"data: [DONE]\\n\\n"])
    models = json.dumps({"object": "list", "data": [{"id": "relay", "object": "model", "created": 1,
        "owned_by": "bench"}]}).encode()
    # Anthropic's Messages, as its API writes them: a message whole, or its events (one content_block_delta a word).
    a_usage = {"input_tokens": 12, "output_tokens": %(tokens)d}
    a_whole = dumps({"id": "msg_up", "type": "message", "role": "assistant", "model": "relay",
        "content": [{"type": "text", "text": "".join(words)}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": a_usage}).encode()
    def a_event(name, value):
        return b"event: " + name.encode() + b"\\ndata: " + dumps(value).encode() + b"\\n\\n"
    a_events = b"".join([a_event("message_start", {"type": "message_start", "message": {"id": "msg_up",
        "type": "message", "role": "assistant", "model": "relay", "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 1}}}),
        a_event("content_block_start", {"type": "content_block_start", "index": 0,
                                        "content_block": {"type": "text", "text": ""}})]
        + [a_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": w}}) for w in words]
        + [a_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
           a_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                     "stop_sequence": None}, "usage": {"output_tokens": %(tokens)d}}),
           a_event("message_stop", {"type": "message_stop"})])
    def answer(status, body, kind=b"application/json"):
        return b"HTTP/1.1 %%d OK\\r\\ncontent-type: %%s\\r\\ncontent-length: %%d\\r\\n\\r\\n" %% (status, kind, len(body)) + body
    class Upstream(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buffer = transport, b""
        def data_received(self, data):
            self.buffer += data
            while b"\\r\\n\\r\\n" in self.buffer:
                head, _, rest = self.buffer.partition(b"\\r\\n\\r\\n")
                length = 0
                for line in head.split(b"\\r\\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(rest) < length:
                    return
                body, self.buffer = rest[:length], rest[length:]
                path = head.split(b" ", 2)[1]
                if path.endswith(b"/chat/completions"):
                    if b'"stream":true' in body.replace(b" ", b""):
                        self.transport.write(answer(200, events, b"text/event-stream"))
                    else:
                        self.transport.write(answer(200, whole))
                elif path.endswith(b"/messages"):
                    if b'"stream":true' in body.replace(b" ", b""):
                        self.transport.write(answer(200, a_events, b"text/event-stream"))
                    else:
                        self.transport.write(answer(200, a_whole))
                elif path.endswith(b"/models"):
                    self.transport.write(answer(200, models))
                else:
                    self.transport.write(answer(200, b"{}"))
    async def main():
        server = await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", int(sys.argv[1]), backlog=1024)
        print("READY", flush=True)
        await server.serve_forever()
    asyncio.run(main())
''') % {"tokens": TOKENS}


class Target:
    def __init__(self, name: str, process, host: str, port: int, path: str = "/v1/chat/completions") -> None:
        self.name = name
        self.process = process
        self.host = host
        self.port = port
        self.idle_cpu_per_s = 0.0

    @property
    def pid(self) -> int:
        return self.process.process.pid if hasattr(self.process, "process") else self.process.pid


def start_upstream(log_dir: Path) -> "tuple[subprocess.Popen, int]":
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(port)], stdout=subprocess.PIPE,
                               stderr=open(log_dir / "upstream.log", "wb"))
    assert process.stdout.readline().strip() == b"READY"
    return process, port


def start_gateways(names: "list[str]", upstream: str, log_dir: Path, smg_venv: Path, litellm_venv: Path
                   ) -> "list[Target]":
    out = []
    for name in names:
        if name.split("@")[0] == "smg-node":  # smg-node@DIR: the node of another tree (a worktree of a commit before)
            tree = Path(name.split("@", 1)[1]) if "@" in name else None
            config = log_dir / "models.toml"
            provider, base = ("anthropic", upstream) if WIRE == "anthropic" else ("openai_compatible",
                                                                                 f"{upstream}/v1")
            config.write_text(f'[targets.up]\nprovider = "{provider}"\nmodel = "relay"\n'
                              f'base_url = "{base}"\ncredential = "env:UPSTREAM_KEY"\n'
                              '[models.relay]\ntargets = ["up"]\n')
            node = NodeProcess(["--models-config", str(config), "--log-level", "warning",
                                "--max-concurrent-requests", "0"], log_dir, name.replace("/", "_"),
                               env={"UPSTREAM_KEY": "sk-bench"}, cwd=tree)
            host, port = node.url.removeprefix("http://").rsplit(":", 1)
            out.append(Target(name, node, host, int(port)))
        elif name == "smg-node-worker":
            if WIRE != "openai":
                print("smg-node-worker relays OpenAI's wire only: left out", file=sys.stderr)
                continue
            node = NodeProcess(["--worker-urls", upstream, "--log-level", "warning", "--max-concurrent-requests", "0"],
                               log_dir, name)
            host, port = node.url.removeprefix("http://").rsplit(":", 1)
            out.append(Target(name, node, host, int(port)))
        elif name == "smg":
            smg = ensure_smg(smg_venv)
            port = free_port()
            process = SmgProcess([str(smg), "launch", "--host", "127.0.0.1", "--port", str(port), "--backend", WIRE,
                                  "--worker-urls", upstream, "--log-level", "warn", "--prometheus-port",
                                  str(free_port()), "--prometheus-host", "127.0.0.1"], log_dir, name)
            out.append(Target(name, process, "127.0.0.1", port))
        elif name == "litellm":
            litellm = litellm_venv / "bin" / "litellm"
            if not litellm.exists():
                print(f"no {litellm}: LiteLLM left out (see this script's docstring)", file=sys.stderr)
                continue
            config = log_dir / "litellm.yaml"
            base = upstream if WIRE == "anthropic" else f"{upstream}/v1"
            config.write_text(f"model_list:\n  - model_name: relay\n    litellm_params:\n      model: {WIRE}/relay\n"
                              f"      api_base: {base}\n      api_key: sk-bench\n")
            port = free_port()
            # No key, as the other gateways here run: LiteLLM refuses to start so unless told it is local.
            os.environ["LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY"] = "true"
            process = SmgProcess([str(litellm), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                                  "--num_workers", "1"], log_dir, name)
            out.append(Target(name, process, "127.0.0.1", port))
    return out


def wait_answering(target: Target) -> None:
    body = orjson.dumps({"model": "relay", "messages": [{"role": "user", "content": "warm"}], "max_tokens": 4})

    async def once() -> bool:
        from tests.bench.gateway_bench import Connection

        try:
            conn = Connection(await trio.open_tcp_stream(target.host, target.port), target.host)
            status, _ = await conn.request(CLIENT_PATHS[WIRE], body)
            await conn.stream.aclose()
            return status == 200
        except OSError:
            return False

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if trio.run(once):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{target.name} does not answer; see its log")


def bodies(stream: bool):
    n = 0
    while True:
        n += 1
        yield orjson.dumps({"model": "relay", "messages": [{"role": "user", "content": f"{n} What is up?"}],
                            "max_tokens": TOKENS, "stream": stream})  # (the same body for Messages' clients)


def cell(target: Target, stream: bool, concurrency: int, seconds: float) -> dict:
    pid, idle = target.pid, target.idle_cpu_per_s
    return trio.run(drive, target.host, target.port, CLIENT_PATHS[WIRE], lambda: bodies(stream), stream,
                    concurrency, seconds, lambda: tree_cpu_seconds(pid) - idle * time.perf_counter())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--stream", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--gateways", nargs="+", default=["smg-node", "smg-node-worker", "smg", "litellm"])
    parser.add_argument("--smg-venv", type=Path, default=ROOT / ".bench" / "smg-venv")
    parser.add_argument("--litellm-venv", type=Path, default=ROOT / ".bench" / "litellm-venv")
    parser.add_argument("--wire", choices=tuple(CLIENT_PATHS), default="openai")
    args = parser.parse_args()
    global WIRE
    WIRE = args.wire
    log_dir = default_log_dir()
    upstream_process, port = start_upstream(log_dir)
    upstream = f"http://127.0.0.1:{port}"
    targets = start_gateways(args.gateways, upstream, log_dir, args.smg_venv, args.litellm_venv)
    try:
        for target in targets:
            wait_answering(target)
        time.sleep(2)
        for target in targets:
            cpu0, wall0 = tree_cpu_seconds(target.pid), time.perf_counter()
            time.sleep(IDLE_MEASURE_S)
            target.idle_cpu_per_s = (tree_cpu_seconds(target.pid) - cpu0) / (time.perf_counter() - wall0)
        direct = Target("upstream", upstream_process, "127.0.0.1", port)
        streams = {"both": (False, True), "yes": (True,), "no": (False,)}[args.stream]
        rows = []
        for stream in streams:
            for concurrency in args.concurrency:
                base = statistics.median(cell(direct, stream, concurrency, args.seconds)["p50_ms"]
                                         for _ in range(args.repeats))
                found: dict[str, list[dict]] = {t.name: [] for t in targets}
                for repeat in range(args.repeats):
                    order = targets[repeat % len(targets):] + targets[:repeat % len(targets)]
                    for target in order:
                        found[target.name].append(cell(target, stream, concurrency, args.seconds))
                        print(f"{target.name} stream={stream} c={concurrency} {found[target.name][-1]}",
                              file=sys.stderr, flush=True)
                for name, runs in found.items():
                    median = {key: statistics.median(r[key] for r in runs) for key in
                              ("cpu_ms_per_request", "rps", "p50_ms", "p99_ms")}
                    rows.append((name, stream, concurrency, median, base))
        print(f"\nProvider relay, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
              f"{args.seconds:g} s x {args.repeats} cells, medians; upstream: {WIRE}'s wire, {TOKENS} tokens, "
              "canned\n")
        print("| gateway | stream | clients | CPU us/request | req/s | p50 ms | p99 ms | p50 added over the upstream ms |")
        print("|---|---|---|---|---|---|---|---|")
        for name, stream, concurrency, m, base in rows:
            print(f"| {name} | {'yes' if stream else 'no'} | {concurrency} | {m['cpu_ms_per_request'] * 1000:.0f} | "
                  f"{m['rps']:.0f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | {m['p50_ms'] - base:.2f} |")
    finally:
        for target in targets:
            target.process.stop()
        stop_process(upstream_process)


if __name__ == "__main__":
    main()

"""Gateway benchmark: a node in front of a zero-cost simulated engine.

Not a test: it prints figures. It starts one zero-cost simulated engine and one
node (real processes on 127.0.0.1), then for each scenario (short ~15-token
and long ~7,800-token prompts, streaming and not, 16 output tokens) and each
concurrency it drives the node for a fixed time with a lean HTTP/1.1
keep-alive client (trio + h11) and reports requests/s, latency p50/p99, time
to first token (streaming) and the node process's CPU time per request (from
/proc, so the client's and the engine's CPU are not counted).

Every prompt is unique (a counter leads it), so tokenizer caches do not hide
the encode cost: this is the uncached worst case.

    python tests/bench/gateway_bench.py [--seconds 5] [--concurrency 1 16 64 256]
    python tests/bench/gateway_bench.py --mixed [--seconds 20] [--pin | --nice-others]   # event-loop lag

``--mixed`` sends long non-streaming prompts (4 clients) and short streaming
chats (16 clients) at the same time and reports the node's event-loop lag
during that load only: from its ``smg_event_loop_lag_seconds`` histogram read
before and after, the share of samples over 5 ms and over 10 ms ("p99 under
5 ms" means under 1 % over 5 ms) and p50/p99 as the bucket they fall in; and
the longest lag of the last minute (its ``smg_event_loop_lag_ms`` gauge). ``--pin`` puts the node
alone on the last core; ``--nice-others`` runs the engine and the client at nice 19 instead, so the
lag shows the node's own steps more than the two shared cores.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import h11
import orjson
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.processes import EngineProcess, NodeProcess, default_log_dir  # noqa: E402

MODEL = "qwen3-sim"
OUTPUT_TOKENS = 16
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# ~7,800 tokens of ordinary English prose with the Qwen3 tokenizer.
_LONG_SENTENCE = ("The gateway tokenizes every prompt before it reaches the engine, so the engine only ever sees "
                  "token ids and spends its time on the model. ")


# One sequence for the whole run: no prompt is ever sent twice, so no cell hits the
# tokenizer caches with an earlier cell's prompts.
_PROMPT_NUMBERS = itertools.count()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime of every thread


def make_body(kind: str, stream: bool, n: int) -> bytes:
    if kind == "short":
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"{n} What is the capital of France?"}]}
        path_body = body
    else:
        path_body = {"model": MODEL, "prompt": f"{n} " + _LONG_SENTENCE * 279}
    path_body.update(max_tokens=OUTPUT_TOKENS, stream=stream, ignore_eos=True)
    return orjson.dumps(path_body)


class Connection:
    def __init__(self, stream: trio.SocketStream, host: str, headers: "list[tuple[str, str]] | None" = None) -> None:
        self.stream = stream
        self.host = host
        self.conn = h11.Connection(h11.CLIENT)
        self.extra_headers = headers or []  # e.g. the Authorization a keyed node needs

    async def request(self, path: str, body: bytes) -> tuple[int, float | None]:
        """Send one request; return (status, seconds to the first body byte)."""
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        headers = [("host", self.host), ("content-type", "application/json"), ("content-length", str(len(body))),
                   *self.extra_headers]
        data = self.conn.send(h11.Request(method="POST", target=path, headers=headers))
        data += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
        start = time.perf_counter()
        await self.stream.send_all(data)
        status = 0
        first_data: float | None = None
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data) and first_data is None:
                first_data = time.perf_counter() - start
            elif isinstance(event, h11.EndOfMessage):
                return status, first_data
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("server closed the connection")


async def drive(host: str, port: int, path: str, new_bodies, stream: bool, concurrency: int, seconds: float,
                cpu_fn) -> dict:
    """``concurrency`` keep-alive clients send requests for ``seconds``; latency, TTFT and CPU per request.

    ``new_bodies()`` gives each client its own iterator of request bodies; ``cpu_fn()`` reads the CPU
    seconds of whatever is measured (the node process, a process tree).
    """
    latencies: list[float] = []
    ttfts: list[float] = []
    errors = 0
    deadline = 0.0

    async def client() -> None:
        nonlocal errors
        conn = Connection(await trio.open_tcp_stream(host, port), f"{host}:{port}")
        bodies = new_bodies()
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            status, first = await conn.request(path, next(bodies))
            if status != 200:
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if stream and first is not None:
                ttfts.append(first)
        await conn.stream.aclose()

    # Warm up the connections and the code path (not the prompts: each is unique).
    deadline = time.perf_counter() + 0.5
    async with trio.open_nursery() as nursery:
        for _ in range(min(concurrency, 16)):
            nursery.start_soon(client)
    latencies.clear()
    ttfts.clear()
    errors = 0
    cpu0, wall0 = cpu_fn(), time.perf_counter()
    deadline = wall0 + seconds
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(client)
    wall = time.perf_counter() - wall0
    cpu = cpu_fn() - cpu0
    n = len(latencies)

    def pct(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) >= 2 else float("nan")

    return {"requests": n, "errors": errors, "rps": n / wall, "p50_ms": pct(latencies, 50),
            "p99_ms": pct(latencies, 99), "ttft_p50_ms": pct(ttfts, 50) if stream else None,
            "ttft_p99_ms": pct(ttfts, 99) if stream else None,
            "cpu_ms_per_request": cpu / n * 1000 if n else float("nan")}


async def run_cell(host: str, port: int, kind: str, stream: bool, concurrency: int, seconds: float,
                   node_pid: int) -> dict:
    path = "/v1/chat/completions" if kind == "short" else "/v1/completions"

    def new_bodies():
        while True:
            yield make_body(kind, stream, next(_PROMPT_NUMBERS))

    row = await drive(host, port, path, new_bodies, stream, concurrency, seconds, lambda: cpu_seconds(node_pid))
    return {"kind": kind, "stream": stream, "concurrency": concurrency, **row}


def machine_ticks() -> tuple[int, int]:
    """(steal, total) clock ticks of all CPUs so far, from /proc/stat: the share of time the
    hypervisor ran something else on our virtual CPUs. A step of ours stalls then too."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    steal = fields[7] if len(fields) > 7 else 0
    return steal, sum(fields[:8])


def lower_priority(pid: int, niceness: int) -> None:
    """Every thread of ``pid`` at ``niceness`` (Linux keeps a niceness per thread; threads started later
    inherit their creator's)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(task), niceness)


def fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


async def run_mixed(host: str, port: int, seconds: float, node_pid: int, long_clients: int,
                    short_clients: int) -> tuple[dict, dict]:
    results = {}

    async def cell(kind: str, stream: bool, concurrency: int) -> None:
        results[kind] = await run_cell(host, port, kind, stream, concurrency, seconds, node_pid)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cell, "long", False, long_clients)
        nursery.start_soon(cell, "short", True, short_clients)
    return results["long"], results["short"]


def gc_counts(lag: dict[str, float], generation: int, before: "dict[str, float] | None" = None) -> str:
    """'generation: collections (of which 5 ms or longer)', since start or, given ``before``, since then."""
    before = before or {}
    count = lag.get(f"gc{generation}_count", 0.0) - before.get(f"gc{generation}_count", 0.0)
    under = lag.get(f"gc{generation}_under_5ms", 0.0) - before.get(f"gc{generation}_under_5ms", 0.0)
    return f"{generation}: {count:.0f} ({count - under:.0f})"


def loop_lag(url: str) -> dict[str, float]:
    import httpx2
    text = httpx2.get(url + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("smg_event_loop_lag_seconds_bucket"):
            out["le " + line.split('le="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("smg_event_loop_lag_ms{"):
            q = line.split('quantile="')[1].split('"')[0]
            out[q] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("smg_gc_pause_max_ms"):
            out["gc_pause_max"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("smg_gc_pause_seconds_bucket") and 'le="0.005"' in line:
            generation = line.split('generation="')[1].split('"')[0]
            out[f"gc{generation}_under_5ms"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("smg_gc_pause_seconds_count"):
            generation = line.split('generation="')[1].split('"')[0]
            out[f"gc{generation}_count"] = float(line.rsplit(" ", 1)[1])
    return out


def lag_during(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Lag samples taken between two readings of the histogram: shares over 5 and 10 ms, p50/p99 buckets."""
    bounds = sorted((float(key[3:]), after[key] - before.get(key, 0.0)) for key in after
                    if key.startswith("le ") and key != "le +Inf")
    total = after["le +Inf"] - before.get("le +Inf", 0.0)
    out = {"samples": total}
    for limit_s, name in ((0.005, "over_5ms"), (0.01, "over_10ms")):
        at_most = next(count for bound, count in bounds if bound >= limit_s)
        out[name] = (total - at_most) / total * 100 if total else float("nan")
    for q in (50, 99):
        out[f"p{q}_bucket_ms"] = next((bound * 1000 for bound, count in bounds if count >= total * q / 100),
                                      float("inf"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mixed", action="store_true", help="long and short streaming at once; report loop lag")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--kinds", nargs="+", default=["short", "long"])
    parser.add_argument("--pin", action="store_true", help="the node alone on the last core (taskset)")
    parser.add_argument("--nice-others", action="store_true",
                        help="the engine and this client at nice 19: the node gets a core whenever it wants one "
                        "(as when they run on other machines), so the lag shows the node's own steps")
    parser.add_argument("--mixed-clients", type=int, nargs=2, default=[4, 16], metavar=("LONG", "SHORT"),
                        help="clients sending long prompts and short streaming chats (default 4 16: the node "
                        "saturated; fewer leave it headroom)")
    parser.add_argument("--node-args", nargs=argparse.REMAINDER, default=[])
    args = parser.parse_args()

    log_dir = default_log_dir()
    engine = EngineProcess(["--zero-cost", "--batch-size-max", "1024", "--queue-size-max", "4096"], log_dir)
    node = NodeProcess(["--worker-urls", engine.url, "--log-level", "warning", *args.node_args], log_dir)
    if args.pin:
        # The node alone on the last core, the engine and this client on the others: the node's figures
        # without the load generator's share of its core (as when clients are other machines).
        cores = sorted(os.sched_getaffinity(0))
        subprocess.run(["taskset", "-apc", str(cores[-1]), str(node.process.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        for pid in (engine.process.pid, os.getpid()):
            subprocess.run(["taskset", "-apc", ",".join(map(str, cores[:-1])), str(pid)], check=True,
                           stdout=subprocess.DEVNULL)
    if args.nice_others:
        for pid in (engine.process.pid, os.getpid()):
            lower_priority(pid, 19)
    host, port = node.url.removeprefix("http://").rsplit(":", 1)
    rows = []
    if args.mixed:
        try:
            before = loop_lag(node.url)
            steal0, total0 = machine_ticks()
            cpu0, wall0 = cpu_seconds(node.process.pid), time.perf_counter()
            long_row, short_row = trio.run(run_mixed, host, int(port), args.seconds, node.process.pid,
                                           *args.mixed_clients)
            node_cpu_share = (cpu_seconds(node.process.pid) - cpu0) / (time.perf_counter() - wall0) * 100
            steal1, total1 = machine_ticks()
            steal_share = (steal1 - steal0) / max(1, total1 - total0) * 100
            lag = loop_lag(node.url)
        finally:
            node.stop()
            engine.stop()
        during = lag_during(before, lag)
        print(f"Mixed load for {args.seconds:.0f} s on {platform.machine()}, {os.cpu_count()} cores, "
              f"{time.strftime('%Y-%m-%d')}: long non-streaming x{args.mixed_clients[0]} at {long_row['rps']:.1f} "
              f"req/s and short streaming x{args.mixed_clients[1]} at {short_row['rps']:.1f} req/s, node CPU "
              f"{node_cpu_share:.0f} % of a core, steal {steal_share:.0f} % of the machine's CPU time (the "
              f"hypervisor's); event-loop lag during the load "
              f"({during['samples']:.0f} samples): {during['over_5ms']:.2f} % over 5 ms, "
              f"{during['over_10ms']:.2f} % over 10 ms, p50 <= {during['p50_bucket_ms']:g} ms, "
              f"p99 <= {during['p99_bucket_ms']:g} ms; longest in the last minute (start-up included under 60 s) "
              f"{lag.get('max', float('nan')):.2f} ms; garbage collections during the load (5 ms or longer) by "
              "generation: " + ", ".join(gc_counts(lag, g, before) for g in range(3)) + "; since start (the "
              f"start-up's full collections are the longest) {', '.join(gc_counts(lag, g) for g in range(3))}, "
              f"longest {lag.get('gc_pause_max', float('nan')):.2f} ms")
        return
    try:
        for kind in args.kinds:
            for stream in (False, True):
                for c in args.concurrency:
                    row = trio.run(run_cell, host, int(port), kind, stream, c, args.seconds, node.process.pid)
                    rows.append(row)
                    print(f"{kind:5} stream={stream!s:5} c={c:<3} " + " ".join(
                        f"{k}={fmt(v)}" for k, v in row.items() if k not in ("kind", "stream", "concurrency")),
                        file=sys.stderr, flush=True)
    finally:
        node.stop()
        engine.stop()

    print(f"\nMachine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}; {OUTPUT_TOKENS} output tokens; {args.seconds:.0f} s per cell\n")
    print("| prompt | stream | conc. | req/s | p50 ms | p99 ms | TTFT p50 ms | TTFT p99 ms | node CPU ms/req | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {'yes' if r['stream'] else 'no'} | {r['concurrency']} | {r['rps']:.0f} | "
              f"{fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | {fmt(r['ttft_p50_ms'])} | {fmt(r['ttft_p99_ms'])} | "
              f"{fmt(r['cpu_ms_per_request'])} | {r['errors']} |")


if __name__ == "__main__":
    main()

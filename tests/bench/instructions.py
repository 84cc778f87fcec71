"""Instructions per request, counted by valgrind's callgrind: smg-node against smg 1.13.0.

Not a test: it prints figures. CPU seconds on this shared VM move by 10-30 % from one
minute to the next with the hypervisor's steal; an instruction count does not. Each
gateway runs under ``valgrind --tool=callgrind --instr-atstart=no`` (full speed to start,
uninstrumented), in front of the same zero-cost simulated engine and tokenizer files as
``smg_compare.py``; after ``--warmup`` requests, instrumentation is switched on
(``callgrind_control -i on``), one keep-alive client sends ``--requests`` requests one
after the other, and the count is dumped; then the gateway is counted idle for 5 s. Its
timers (health checks, load polls, gossip, the loop-lag probe) run by the wall clock, which
valgrind's ~50x slowdown stretches, so their share (idle instructions per second times the
seconds the requests took) is taken out, as ``smg_compare.py`` takes out idle CPU.

What it counts: user-space instructions of every thread of the gateway's process (the
kernel's share of socket calls is not in it, nor are cache misses: a figure of work done,
not of seconds). What it leaves out: ``--workers N``'s other processes (one process is
measured; ``smg_compare.py`` has the scaling), and by default concurrency (requests are
sequential, so batching across requests never happens; ``--clients N`` sends them over N
connections at once, which keeps the slowed gateway saturated).

    python tests/bench/instructions.py [--requests 200] [--scenarios short long multiturn]
        [--stream both|yes|no] [--gateways smg-node smg smg-cache] [--smg-venv DIR] [--clients N]
        [--simulate-caches] [--token-interval-s S]
        [--auth none|api-key|jwt] [--tls] [--parsers off|on] [--node-args ARG...]

The ``mix`` scenario (not in the default set) sends ``mixed_traffic.py``'s plan in order, streamed or
not as the plan says (so ``--stream`` does not change it; run it with ``--stream no``).
The ``agent`` scenario (not in the default set) offers a tool and the engine answers it with a
Qwen3 reasoning and a tool call: with ``--parsers on`` both gateways parse them, off neither does.

Needs valgrind (Debian's ``valgrind`` package) and makes smg's venv like smg_compare.py.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import orjson
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import EngineProcess, default_log_dir  # noqa: E402
from tests.bench.gateway_bench import Connection  # noqa: E402
from tests.bench.mixed_traffic import MixConfig, make_mix, mix_messages  # noqa: E402
from tests.bench.smg_compare import (  # noqa: E402
    MODEL, SMG_VERSION, agent_script, conversation_bodies, engine_pacing_args, ensure_smg, free_port, model_dir,
    stop_process)

BENCH_API_KEY = "bench-key-0123456789"


def make_certificate(directory: Path) -> "tuple[Path, Path, Path]":
    """(certificate, key, CA) for 127.0.0.1, made with cryptography as the tests make theirs."""
    from tests.support.certs import CertAuthority
    ca = CertAuthority(directory, "bench CA")
    cert, key, _ = ca.issue("bench-server", "127.0.0.1")
    return cert, key, ca.path


def start_jwt_issuer() -> tuple[str, str]:
    """A local OIDC issuer (discovery and JWKS over HTTP, a thread of this process) and a token of it."""
    import http.server
    import json
    import threading

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = {"keys": [{**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": "bench", "alg": "RS256"}]}

    class Issuer(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"issuer": base, "jwks_uri": base + "/jwks"} if "openid" in self.path else jwks).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Issuer)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = jwt.encode({"iss": base, "sub": "bench", "aud": "bench", "exp": time.time() + 86400}, key,
                       algorithm="RS256", headers={"kid": "bench"})
    return base, token


START_TIMEOUT_S = 600.0  # valgrind's uninstrumented start is ~5x slower than a plain one
IDLE_MEASURE_S = 5.0


def gateway_argv(name: str, port: int, engine_url: str, model: Path, smg: Path, node_args: list[str],
                 smg_args: "list[str]" = ()) -> list[str]:
    if name == "smg-node":
        return [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                "--workers", "1", "--worker-urls", engine_url, "--tokenizer-path", str(model),
                "--log-level", "warning", "--max-concurrent-requests", "0", *node_args]
    argv = [str(smg), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", engine_url,
            "--tokenizer-path", str(model), "--log-level", "warn", "--prometheus-port", str(free_port()),
            "--prometheus-host", "127.0.0.1"]
    if name == "smg-cache":
        argv += ["--tokenizer-cache-enable-l0", "--tokenizer-cache-enable-l1"]
    return [*argv, *smg_args]


API_PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


def messages_bodies(chat_bodies):
    """The same conversations as Anthropic Messages requests (the chat bodies less what it has no name for)."""
    for raw in chat_bodies:
        body = orjson.loads(raw)
        body.pop("ignore_eos", None)  # the engine plans max_tokens words and no EOS either way
        yield orjson.dumps(body)


def responses_bodies(chat_bodies):
    """The same conversations as Responses API requests (stored, as the API's default is)."""
    for raw in chat_bodies:
        body = orjson.loads(raw)
        yield orjson.dumps({"model": body["model"], "input": body["messages"], "stream": body["stream"],
                            "max_output_tokens": body["max_tokens"]})


def mix_bodies():
    """mixed_traffic.py's plan in order (its own streamed share and answer lengths), each lap's texts new."""
    mix = make_mix(MixConfig())
    for lap in itertools.count():
        for kind, instance, step, ref, stream, max_tokens in mix.plan:
            messages = mix_messages(mix, kind, instance, step, ref, f"{os.getpid()} lap {lap}")
            yield orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens, "ignore_eos": True,
                                "stream": bool(stream)})


async def send_requests(port: int, bodies, count: int, headers: "list[tuple[str, str]]",
                        tls: "ssl.SSLContext | None" = None, path: str = API_PATHS["chat"]) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    if tls is not None:
        stream = trio.SSLStream(stream, tls, server_hostname="127.0.0.1")
    connection = Connection(stream, "127.0.0.1", headers)
    try:
        for _ in range(count):
            status, _ = await connection.request(path, next(bodies))
            if status != 200:
                raise RuntimeError(f"the gateway answered {status}")
    finally:
        await connection.stream.aclose()


async def send_concurrently(port: int, bodies, count: int, clients: int, headers: "list[tuple[str, str]]",
                            tls: "ssl.SSLContext | None", path: str) -> None:
    """``count`` requests over ``clients`` keep-alive connections, each sending its next when answered."""
    async with trio.open_nursery() as nursery:
        for index in range(clients):
            share = count // clients + (index < count % clients)
            nursery.start_soon(send_requests, port, bodies, share, headers, tls, path)


def wait_serving(port: int, bodies, process: subprocess.Popen, log: Path, headers: "list[tuple[str, str]]",
                 tls: "ssl.SSLContext | None", path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited; see {log}")
        try:
            trio.run(send_requests, port, bodies, 1, headers, tls, path)
            return
        except (OSError, RuntimeError, trio.BrokenResourceError):
            time.sleep(1)
    raise RuntimeError(f"the gateway did not serve within {START_TIMEOUT_S:.0f} s; see {log}")


def callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


def count_instructions(name: str, scenario: str, stream: bool, args, engine_url: str, model: Path, smg: Path,
                       log_dir: Path) -> dict[str, float]:
    """Callgrind's events per request of one gateway on one scenario (a fresh process each time): ``Ir``
    (instructions), and with ``--simulate-caches`` its cache and branch-predictor model's misses."""
    port = free_port()
    tag = f"{name}-{scenario}-{'stream' if stream else 'unary'}"
    out_prefix = log_dir / f"callgrind.{tag}"
    log = log_dir / f"{tag}.log"
    simulate = ["--cache-sim=yes", "--branch-sim=yes"] if args.simulate_caches else []
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", *simulate, f"--callgrind-out-file={out_prefix}.%p",
            *gateway_argv(name, port, engine_url, model, smg, args.node_args, args.smg_args)]
    with open(log, "ab") as log_file:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, cwd=ROOT)
    bodies = mix_bodies() if scenario == "mix" else conversation_bodies(scenario, stream)
    if args.api == "messages":
        bodies = messages_bodies(bodies)
    elif args.api == "responses":
        bodies = responses_bodies(bodies)
    path = API_PATHS[args.api]
    try:
        headers = args.client_headers if name == "smg-node" or args.auth == "api-key" else []
        wait_serving(port, bodies, process, log, headers, args.tls_context, path)
        # the warm-up as concurrent as the count: paced streams one at a time would take warm-up x tokens x interval
        trio.run(send_concurrently, port, bodies, args.warmup, min(args.clients, args.warmup), headers,
                 args.tls_context, path)
        callgrind_control("-i", "on", str(process.pid))
        started = time.perf_counter()
        trio.run(send_concurrently, port, bodies, args.requests, args.clients, headers, args.tls_context, path)
        requests_s = time.perf_counter() - started
        callgrind_control("-d", str(process.pid))  # dump 1: the requests
        started = time.perf_counter()
        time.sleep(IDLE_MEASURE_S)
        callgrind_control("-d", str(process.pid))  # dump 2: the same gateway idle
        idle_s = time.perf_counter() - started
        callgrind_control("-i", "off", str(process.pid))
    finally:
        stop_process(process, 120)  # valgrind writes its last dump on the way out
    dumps = {path.name.rsplit(".", 1)[1]: dump_totals(path) for path in log_dir.glob(f"callgrind.{tag}.*")}
    busy, idle = dumps.get("1", {}), dumps.get("2", {})
    if not busy.get("Ir"):
        raise RuntimeError(f"callgrind counted nothing for {tag}; see {log}")
    # Timers (health checks, load polls, gossip, the loop-lag probe) run by the wall clock, and
    # under valgrind the requests take ~50x longer: their share is taken out as smg_compare.py
    # takes out idle CPU.
    print(f"  {tag}: {busy['Ir'] / args.requests / 1e6:.3f} M/request with timers, idle "
          f"{idle.get('Ir', 0) / idle_s / 1e6:.2f} M/s over {requests_s:.1f} s of requests",
          file=sys.stderr, flush=True)
    return {event: (count - idle.get(event, 0) / idle_s * requests_s) / args.requests for event, count in busy.items()}


def dump_totals(path: Path) -> dict[str, int]:
    """A callgrind dump's totals by event name (its ``events:`` line names the ``totals:`` line's columns)."""
    names: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("totals:"):
            return dict(zip(names, map(int, line.split()[1:])))
    return {}


def model_figures(events: dict[str, float]) -> tuple[float, float, float, float]:
    """Callgrind's model per request: first-level misses, last-level misses, mispredicted branches, and
    callgrind_annotate's cycle estimate (an instruction a cycle, a first-level miss or a mispredicted
    branch 10 more, a last-level miss 100 more: a model, not this machine's counters, which its VM does
    not expose)."""
    first_level = events["I1mr"] + events["D1mr"] + events["D1mw"]
    last_level = events["ILmr"] + events["DLmr"] + events["DLmw"]
    mispredicted = events["Bcm"] + events["Bim"]
    return first_level, last_level, mispredicted, events["Ir"] + 10 * (first_level + mispredicted) + 100 * last_level


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--scenarios", nargs="+", default=["short", "long", "multiturn"])
    parser.add_argument("--stream", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--gateways", nargs="+", default=["smg-node", "smg", "smg-cache"])
    parser.add_argument("--smg-venv", type=Path, default=ROOT / ".bench" / "smg-venv")
    parser.add_argument("--clients", type=int, default=1,
                        help="concurrent keep-alive clients sharing the counted requests (1: one after the other; "
                             "more: the valgrind-slowed gateway is saturated, so the count includes what "
                             "concurrency costs or saves, e.g. wake-ups shared by several arrivals)")
    parser.add_argument("--simulate-caches", action="store_true",
                        help="callgrind also models the caches and branch predictor (--cache-sim, --branch-sim; "
                             "~2x slower): misses per request and a cycle estimate beside the instructions")
    parser.add_argument("--token-interval-s", type=float, default=0.0,
                        help="the engine sends a token every this many seconds (0: as fast as it can, so a "
                             "stream's tokens reach a gateway slowed ~50x by valgrind in one or two reads; "
                             "a real engine's decode step, ~10-50 ms, hands each token over alone)")
    parser.add_argument("--decode-steps", action="store_true",
                        help="with --token-interval-s: the engine hands every running stream's token over at the "
                             "end of one shared step, as a real engine's batched decode does; give the interval "
                             "room for the valgrind-slowed gateway to handle a step's tokens (~1 s for 256 clients)")
    parser.add_argument("--auth", choices=("none", "api-key", "jwt"), default="none",
                        help="smg-node with --api-key (the client sends it), or with --jwt-issuer (a local issuer "
                             "this script serves; the client sends one token, which the node caches)")
    parser.add_argument("--tls", action="store_true",
                        help="every gateway serves HTTPS with a certificate this script makes; the client verifies it")
    parser.add_argument("--api", choices=tuple(API_PATHS), default="chat",
                        help="the API the requests use: chat completions, Anthropic's Messages or OpenAI's "
                             "Responses (the same conversations; smg-node only)")
    parser.add_argument("--parsers", choices=("off", "on"), default="off",
                        help="on: both gateways parse answers with the qwen tool-call and qwen3 reasoning parsers "
                             "(the 'agent' scenario's answers hold a reasoning and a call); off: neither parses")
    parser.add_argument("--node-args", nargs=argparse.REMAINDER, default=[],
                        help="extra smg-node serve arguments (last on the line)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("needs valgrind (apt-get install valgrind)")
    smg = ensure_smg(args.smg_venv) if any(g.startswith("smg") and g != "smg-node" for g in args.gateways) \
        else Path("smg")
    log_dir = default_log_dir()
    model = model_dir(log_dir)
    args.client_headers, args.smg_args, args.tls_context = [], [], None
    if args.auth == "api-key":  # smg takes the same flag
        args.node_args = ["--api-key", BENCH_API_KEY, *args.node_args]
        args.smg_args = ["--api-key", BENCH_API_KEY]
        args.client_headers = [("authorization", f"Bearer {BENCH_API_KEY}")]
    elif args.auth == "jwt":
        issuer_url, token = start_jwt_issuer()
        args.node_args = ["--jwt-issuer", issuer_url, "--jwt-audience", "bench", *args.node_args]
        args.client_headers = [("authorization", f"Bearer {token}")]
    if args.tls:  # smg's flag names are ours
        cert, key, ca_path = make_certificate(log_dir)
        tls_args = ["--tls-cert-path", str(cert), "--tls-key-path", str(key)]
        args.node_args = [*tls_args, *args.node_args]
        args.smg_args = [*args.smg_args, *tls_args]
        args.tls_context = ssl.create_default_context(cafile=str(ca_path))
    if args.parsers == "on":  # smg's flag names are ours
        parsers = ["--tool-call-parser", "qwen", "--reasoning-parser", "qwen3"]
        args.node_args = [*parsers, *args.node_args]
        args.smg_args = [*args.smg_args, *parsers]
    else:  # none: smg-node would pick Qwen3's for the engine's architecture (Qwen3ForCausalLM)
        args.node_args = ["--tool-call-parser", "none", "--reasoning-parser", "none", *args.node_args]
    script = ["--script", str(agent_script(log_dir))] if "agent" in args.scenarios else []
    engine = EngineProcess([*engine_pacing_args(args.token_interval_s), "--model-name", MODEL, "--tokenizer-path",
                            str(model), *script, *(["--decode-steps"] if args.decode_steps else [])], log_dir)
    streams = {"both": [False, True], "yes": [True], "no": [False]}[args.stream]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results: dict[tuple[str, bool, str], float] = {}
    simulated: dict[tuple[str, bool, str], dict[str, float]] = {}
    try:
        for scenario in args.scenarios:
            for stream in streams:
                for name in args.gateways:
                    events = count_instructions(name, scenario, stream, args, engine.url, model, smg, log_dir)
                    results[(scenario, stream, name)] = events["Ir"]
                    simulated[(scenario, stream, name)] = events
                    print(f"{scenario:9} stream={stream!s:5} {name:10} {events['Ir'] / 1e6:.3f} M instructions/request",
                          file=sys.stderr, flush=True)
    finally:
        engine.stop()
    print(f"\nInstructions per request (callgrind), {platform.machine()}, Python {platform.python_version()}, "
          f"smg {SMG_VERSION}, started {started}; {args.requests} requests after {args.warmup} warm-up "
          f"ones, {args.clients} keep-alive client(s); engine token interval {args.token_interval_s * 1000:g} ms"
          f"{' (shared decode steps)' if args.decode_steps else ''}; "
          f"smg-node --workers 1{' ' + ' '.join(args.node_args) if args.node_args else ''}; parsers {args.parsers}; "
          f"API {args.api}"
          f". Logs: {log_dir}\n")
    names = args.gateways
    print("| scenario | stream | " + " | ".join(f"{n} M instr/req" for n in names)
          + (" | smg-node / smg |" if "smg-node" in names and "smg" in names else " |"))
    print("|---|---|" + "---|" * len(names) + ("---|" if "smg-node" in names and "smg" in names else ""))
    for scenario in args.scenarios:
        for stream in streams:
            cells = [f"{results[(scenario, stream, n)] / 1e6:.3f}" for n in names]
            ratio = ""
            if "smg-node" in names and "smg" in names:
                ratio = f" {results[(scenario, stream, 'smg-node')] / results[(scenario, stream, 'smg')]:.2f}x |"
            print(f"| {scenario} | {'yes' if stream else 'no'} | " + " | ".join(cells) + " |" + ratio)
    if args.simulate_caches:
        print_simulation(args.scenarios, streams, names, simulated)


def print_simulation(scenarios: list[str], streams: list[bool], names: list[str],
                     simulated: dict[tuple[str, bool, str], dict[str, float]]) -> None:
    print("\nCallgrind's cache (first level, last level) and branch-predictor model, per request:\n")
    print("| scenario | stream | gateway | instructions | L1 misses | LL misses | mispredicted branches | "
          "cycles (estimate) | cycles / instruction |")
    print("|---|---|---|---|---|---|---|---|---|")
    for scenario in scenarios:
        for stream in streams:
            for name in names:
                events = simulated[(scenario, stream, name)]
                first_level, last_level, mispredicted, cycles = model_figures(events)
                print(f"| {scenario} | {'yes' if stream else 'no'} | {name} | {events['Ir'] / 1e6:.3f} M | "
                      f"{first_level / 1e3:.1f} k | {last_level / 1e3:.1f} k | "
                      f"{mispredicted / 1e3:.1f} k | {cycles / 1e6:.3f} M | "
                      f"{cycles / events['Ir']:.2f} |")


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") is None:
        # Python randomizes str hashes per process: dict and set layouts, and with them a few
        # instructions, differ from run to run. The gateway inherits a fixed seed from here.
        os.environ["PYTHONHASHSEED"] = "0"
    main()

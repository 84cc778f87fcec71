"""The traffic users send, side by side with smg 1.13.0: CPU per request and time to first token.

Not a test: it prints figures. Where ``workers_scaling.py`` sends one kind of request per cell, this
sends a mix, as a chat product's gateway receives it (the shape of the independent harness of
issue 65), generated from a seed so every gateway and every run gets the same requests:

* *multi-turn sessions*: 2-8 turns under one of three shared system prompts (~300, ~1,000 and
  ~2,000 tokens); each turn resends the whole history (earlier questions and answers) plus a new
  question, as chat clients do;
* *documents*: a document of ~1,000-5,000 tokens asked 2-5 questions, each a request carrying the
  document again;
* *short chats*: one unique question;
* half of all requests streamed; output lengths by kind (short 16-48 tokens, turns 32-96, answers
  about a document 48-128), ``ignore_eos`` so every gateway streams the same tokens.

The plan interleaves the sessions' turns and the documents' questions with everything else (a
pool of open sessions and documents, one picked at random each step), so a turn arrives a while
after the one before it, as a user's next message does. Sessions, documents and short chats carry
the wrk run's id, so no request repeats one of an earlier cell (no tokenizer cache carries over
from one gateway's cell or repeat to the next); the system prompts stay the same bytes throughout,
as a product's do. The text is words drawn from a fixed list by the seed.

The engine is the simulated one with shared decode steps (``--decode-steps``, a step every
``--decode-step-s``, 30 ms by default: every running stream's token comes out at the end of the
same step, as a real engine's batched decode hands them over), no prefill cost and no prefix cache
(its Python hashing would make the engine the bottleneck; no gateway here follows its KV events).

wrk drives ``--connections`` clients (64 and 256 by default) through a Lua script holding the plan;
beside it two probe threads send the mix's streamed requests (4 output tokens each) one after another
and record the time to each one's first token (TTFT p50 / p99 under that load, over the repeats; the
probes' requests count in the gateway's CPU per request).
Each cell runs each gateway in turn (order alternating, ``--repeats`` times) for ``--seconds`` after
a warm-up run; the report gives medians: requests/s, CPU per request of the gateway's whole process
tree (less its idle burn), its ratio to smg's and to smg's with its tokenizer caches on, TTFT, and
the cores the engine and wrk used (a saturated engine or client would bound the figures).

    python tests/bench/mixed_traffic.py [--gateways smg-node-all smg-node-w1 smg smg-cache]
        [--connections 64 256] [--seconds 20] [--repeats 2] [--seed 1] [--decode-step-s 0.03]
        [--only short|turn|document] [--stream-share 0.5]

``--only`` sends one kind of the mix alone and ``--stream-share`` sets the streamed share (0: none,
so no TTFT): where a gap between the gateways comes from. Gateway names as in ``workers_scaling.py``
(``smg-node-all``: ``serve``'s default ``--workers 0``, one process per core less one;
``smg-node-w1@/tmp/base``: the checkout at /tmp/base; ``smg-node-all+engine-read-thread``: with that switch of
``serve``'s). Needs ``wrk``.
Markdown to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chaos.processes import EngineProcess, default_log_dir  # noqa: E402
from tests.bench.gateway_bench import cpu_seconds  # noqa: E402
from tests.bench.smg_compare import (  # noqa: E402
    MODEL, Gateway, engine_pacing_args, ensure_smg, model_dir, start_gateways, tree_cpu_seconds)
from tests.bench.workers_scaling import lua_json_text, run_wrk  # noqa: E402

# Words the text is drawn from (a seeded choice of them: English-looking prose, ~1.2 Qwen3 tokens each).
_WORDS = (
    "the gateway engine request token model prompt answer cluster node worker cache stream client server "
    "system user assistant history document question policy route queue batch decode prefill latency "
    "throughput memory budget tenant key limit retry timeout error health probe metric trace span log "
    "config file disk network packet member gossip ring owner counter window second minute hour day week "
    "report customer order invoice payment shipment product price discount region store warehouse supplier "
    "contract clause party term notice renewal liability warranty schedule annex section article paragraph "
    "is are was were has have had will would can could should may might must does did "
    "a an of to in on at by for with from about into over under between after before during without "
    "and or but so because although while when where which who whose that this these those it its their "
    "new old large small fast slow early late first last next other same each every many few more most "
    "read write send receive check count measure compare explain describe list summarise translate answer "
    "careful simple clear short long full exact recent open closed shared private public internal external"
).split()


@dataclasses.dataclass(frozen=True)
class MixConfig:
    """The mix. Defaults: the proportions of a chat product with a document feature (the independent
    harness's shape); every figure here changes the work per request, so a run states its seed."""
    seed: int = 1
    plan_requests: int = 6000        # one cell at 256 clients sends ~2,000 (the plan then starts again)
    short_share: float = 0.35        # the rest: a turn of an open session or a question on an open document
    document_share: float = 0.25
    open_sessions: int = 48          # sessions in progress at once (their turns interleave)
    open_documents: int = 8
    session_turns: tuple[int, int] = (2, 8)
    document_questions: tuple[int, int] = (2, 5)
    stream_share: float = 0.5
    system_prompt_words: tuple[int, ...] = (250, 800, 1600)
    document_words: tuple[int, ...] = (800, 1600, 2400, 3200, 4000)
    answer_words: int = 45           # an assistant turn in a resent history (~the tokens a turn generates)
    max_tokens_short: tuple[int, int] = (16, 48)
    max_tokens_turn: tuple[int, int] = (32, 96)
    max_tokens_document: tuple[int, int] = (48, 128)


SHORT, TURN, DOCUMENT = 1, 2, 3


@dataclasses.dataclass(frozen=True)
class Mix:
    system_prompts: list[str]
    documents: list[str]
    questions: list[str]
    answers: list[str]
    # (kind, instance, step, text index, stream 0/1, max_tokens): a short chat (instance, question index),
    # turn `step` of session `instance` under system prompt `text index`, question `step` on document
    # instance `instance` whose text is `text index`.
    plan: list[tuple[int, int, int, int, int, int]]


def make_mix(config: MixConfig) -> Mix:
    rng = random.Random(config.seed)

    def text(words: int) -> str:
        sentences, left = [], words
        while left > 0:
            n = min(left, rng.randint(8, 20))
            sentence = " ".join(rng.choice(_WORDS) for _ in range(n))
            sentences.append(sentence[0].upper() + sentence[1:] + ".")
            left -= n
        return " ".join(sentences)

    mix = Mix(system_prompts=[text(n) for n in config.system_prompt_words],
              documents=[text(n) for n in config.document_words],
              questions=[text(rng.randint(8, 30)).rstrip(".") + "?" for _ in range(200)],
              answers=[text(config.answer_words) for _ in range(100)], plan=[])
    sessions: list[list[int]] = []   # [instance, next turn, turns, system prompt]
    documents: list[list[int]] = []  # [instance, next question, questions, text]
    instances = 0
    while len(mix.plan) < config.plan_requests:
        stream = int(rng.random() < config.stream_share)
        draw = rng.random()
        if draw < config.short_share:
            instances += 1
            mix.plan.append((SHORT, instances, rng.randrange(len(mix.questions)), 0, stream,
                             rng.randint(*config.max_tokens_short)))
            continue
        if draw < config.short_share + config.document_share:
            pool, size, limits, kind, tokens = (documents, config.open_documents, config.document_questions,
                                                DOCUMENT, config.max_tokens_document)
            texts = len(mix.documents)
        else:
            pool, size, limits, kind, tokens = (sessions, config.open_sessions, config.session_turns, TURN,
                                                config.max_tokens_turn)
            texts = len(mix.system_prompts)
        while len(pool) < size:
            instances += 1
            pool.append([instances, 0, rng.randint(*limits), rng.randrange(texts)])
        entry = pool[rng.randrange(len(pool))]
        mix.plan.append((kind, entry[0], entry[1], entry[3], stream, rng.randint(*tokens)))
        entry[1] += 1
        if entry[1] == entry[2]:
            pool.remove(entry)
    return mix


# The Lua side: request n is plan entry n (mod the plan's length); `lap` (how many times the plan went
# round) and `run` (the wrk run's id) go into every session's, document's and short chat's text, so
# each cell's requests are its own. Quoted strings are JSON-escaped already (lua_json_text).
_LUA = """
local S = {%(system_prompts)s}
local D = {%(documents)s}
local Q = {%(questions)s}
local A = {%(answers)s}
local P = {%(plan)s}
local counter = 0
local run = "?"
init = function(args) run = args[1] end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local function user(text) return '{"role":"user","content":"' .. text .. '"}' end
local function messages(kind, instance, step, ref, tag)
  if kind == 1 then
    return '[' .. user('(' .. tag .. ' chat ' .. instance .. ') ' .. Q[step + 1]) .. ']'
  end
  if kind == 3 then
    return '[{"role":"system","content":"' .. S[1] .. '"},' .. user('Document ' .. instance .. ' of ' .. tag ..
      '.\\\\n\\\\n' .. D[ref + 1] .. '\\\\n\\\\nQuestion ' .. step .. ': ' .. Q[(instance * 3 + step) %% #Q + 1]) .. ']'
  end
  local parts = {'[{"role":"system","content":"' .. S[ref + 1] .. '"}'}
  for k = 0, step do
    local question = Q[(instance * 7 + k) %% #Q + 1]
    if k == 0 then question = '(' .. tag .. ' session ' .. instance .. ') ' .. question end
    parts[#parts + 1] = ',' .. user(question)
    if k < step then
      parts[#parts + 1] = ',{"role":"assistant","content":"' .. A[(instance * 5 + k) %% #A + 1] .. '"}'
    end
  end
  parts[#parts + 1] = ']'
  return table.concat(parts)
end
request = function()
  local entry = P[counter %% #P + 1]
  local tag = 'run ' .. run .. ' lap ' .. math.floor(counter / #P)
  local stream = entry[5] == 1 and 'true' or 'false'
  local body = '{"model":"%(model)s","messages":' .. messages(entry[1], entry[2], entry[3], entry[4], tag) ..
    ',"max_tokens":' .. entry[6] .. ',"ignore_eos":true,"stream":' .. stream .. '}'
  counter = counter + 1
  return wrk.format(nil, "/v1/chat/completions", nil, body)
end
"""


def lua_script(mix: Mix, directory: Path) -> Path:
    def strings(texts: list[str]) -> str:
        return ",\n".join(lua_json_text(t) for t in texts)

    script = directory / "mixed.lua"
    script.write_text(_LUA % {
        "system_prompts": strings(mix.system_prompts), "documents": strings(mix.documents),
        "questions": strings(mix.questions), "answers": strings(mix.answers), "model": MODEL,
        "plan": ",".join("{%d,%d,%d,%d,%d,%d}" % entry for entry in mix.plan)})
    return script


def mix_messages(mix: Mix, kind: int, instance: int, step: int, ref: int, tag: str) -> list[dict]:
    """A plan entry's messages, as the Lua script writes them (the probe's requests are the mix's own)."""
    q, a = mix.questions, mix.answers
    if kind == SHORT:
        return [{"role": "user", "content": f"({tag} chat {instance}) {q[step]}"}]
    if kind == DOCUMENT:
        return [{"role": "system", "content": mix.system_prompts[0]},
                {"role": "user", "content": f"Document {instance} of {tag}.\n\n{mix.documents[ref]}\n\n"
                                            f"Question {step}: {q[(instance * 3 + step) % len(q)]}"}]
    out = [{"role": "system", "content": mix.system_prompts[ref]}]
    for k in range(step + 1):
        question = q[(instance * 7 + k) % len(q)]
        out.append({"role": "user", "content": f"({tag} session {instance}) {question}" if k == 0 else question})
        if k < step:
            out.append({"role": "assistant", "content": a[(instance * 5 + k) % len(a)]})
    return out


class TtftProbe:
    """Streamed requests of the mix one after another on a keep-alive connection, in ``threads`` threads,
    while wrk loads the gateway: the time from sending each to the first content of its stream (4
    output tokens each: the answer's length does not change its first token's time)."""

    def __init__(self, gateway: Gateway, mix: Mix, tag: str, threads: int = 2) -> None:
        self._gateway, self._tag = gateway, tag
        self._entries = [e for e in mix.plan if e[4]]
        self._mix = mix
        self.ttft_s: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> "TtftProbe":
        for thread in self._threads if self._entries else ():  # a mix with nothing streamed has no TTFT
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(60)

    def _run(self, index: int) -> None:
        connection = http.client.HTTPConnection(self._gateway.host, self._gateway.port, timeout=60)
        n = index * len(self._entries) // len(self._threads)  # threads start at different places of the plan
        while not self._stop.is_set():
            kind, instance, step, ref, _, _ = self._entries[n % len(self._entries)]
            n += 1
            messages = mix_messages(self._mix, kind, instance, step, ref, f"probe {self._tag}-{index}")
            body = orjson.dumps({"model": MODEL, "stream": True, "max_tokens": 4, "ignore_eos": True,
                                 "messages": messages})
            try:
                self.ttft_s.append(self._one(connection, body))
            except (OSError, http.client.HTTPException, ValueError):
                self.errors += 1
                connection.close()
                connection = http.client.HTTPConnection(self._gateway.host, self._gateway.port, timeout=60)
                time.sleep(0.1)
        connection.close()

    @staticmethod
    def _one(connection: http.client.HTTPConnection, body: bytes) -> float:
        sent = time.perf_counter()
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            response.read()
            raise ValueError(f"status {response.status}")
        first, buffer = None, b""
        while chunk := response.read1(65536):
            buffer += chunk
            while first is None and b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.startswith(b"data: {") and _has_content(line[6:]):
                    first = time.perf_counter() - sent
        if first is None:
            raise ValueError("a stream without content")
        return first


def _has_content(payload: bytes) -> bool:
    choices = orjson.loads(payload).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


def measure(gateway: Gateway, engine: EngineProcess, mix: Mix, script: Path, connections: int, seconds: int,
            tag: str) -> dict:
    url = f"http://{gateway.host}:{gateway.port}"
    run_wrk(url, script, connections, 2)  # warm-up: connections, lazy state, the system prompts' caches
    pid, engine_pid = gateway.process.process.pid, engine.process.pid
    cpu0, engine_cpu0, wall0 = tree_cpu_seconds(pid), cpu_seconds(engine_pid), time.perf_counter()
    with TtftProbe(gateway, mix, tag) as probe:
        result = run_wrk(url, script, connections, seconds)
    wall_s = time.perf_counter() - wall0
    cpu_s = tree_cpu_seconds(pid) - cpu0 - gateway.idle_cpu_per_s * wall_s
    requests = result["requests"] + len(probe.ttft_s)
    return {
        "rps": result["requests"] / seconds,
        "cpu_ms_per_request": 1000 * cpu_s / max(1, requests),
        "gateway_cores": cpu_s / wall_s,
        "ttft": probe.ttft_s,
        "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"],
        "errors": result["non_2xx"] + result["socket_errors"] + probe.errors,
        "engine_cores": (cpu_seconds(engine_pid) - engine_cpu0) / wall_s,
        "wrk_cores": result["wrk_cpu_s"] / wall_s,
    }


_ONLY = {"short": {"short_share": 1.0, "document_share": 0.0}, "turn": {"short_share": 0.0, "document_share": 0.0},
         "document": {"short_share": 0.0, "document_share": 1.0}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateways", nargs="+", default=["smg-node-all", "smg-node-w1", "smg", "smg-cache"])
    parser.add_argument("--connections", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=MixConfig.seed)
    parser.add_argument("--decode-step-s", type=float, default=0.03)
    parser.add_argument("--only", choices=("short", "turn", "document"),
                        help="one kind of the mix alone (where a gap between the gateways comes from)")
    parser.add_argument("--stream-share", type=float, default=MixConfig.stream_share)
    parser.add_argument("--smg-venv", type=Path, default=ROOT / ".bench" / "smg-venv")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    smg = ensure_smg(args.smg_venv) if any(not g.startswith("smg-node") for g in args.gateways) else None

    mix = make_mix(MixConfig(seed=args.seed, stream_share=args.stream_share, **_ONLY.get(args.only, {})))
    log_dir = default_log_dir()
    model = model_dir(log_dir)
    script = lua_script(mix, Path(tempfile.mkdtemp(prefix="mixed-")))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    engine = EngineProcess([*engine_pacing_args(args.decode_step_s), "--decode-steps", "--no-prefix-caching",
                            "--model-name", MODEL, "--tokenizer-path", str(model),
                            "--batch-size-max", "4096", "--queue-size-max", "16384"], log_dir)
    gateways: list[Gateway] = []
    rows: dict[tuple[int, str], list[dict]] = {}
    try:
        gateways = start_gateways(args.gateways, engine.url, smg, log_dir, model)
        cell = 0
        for connections in args.connections:
            for repeat in range(args.repeats):
                for gateway in (gateways if repeat % 2 == 0 else gateways[::-1]):
                    cell += 1
                    row = measure(gateway, engine, mix, script, connections, args.seconds, f"{os.getpid()}-{cell}")
                    rows.setdefault((connections, gateway.name), []).append(row)
                    print(f"{connections:4} {gateway.name:14} rps={row['rps']:.1f} "
                          f"cpu={row['cpu_ms_per_request']:.2f} ms/req gateway={row['gateway_cores']:.2f} "
                          f"engine={row['engine_cores']:.2f} wrk={row['wrk_cores']:.2f} cores "
                          f"ttft p99={_percentile(row['ttft'], 0.99) * 1000:.0f} ms errors={row['errors']}",
                          file=sys.stderr, flush=True)
    finally:
        for gateway in gateways:
            gateway.process.stop(timeout_s=30)
        engine.stop()
    print_report(args, mix, rows, started)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_report(args, mix: Mix, rows: dict[tuple[int, str], list[dict]], started: str) -> None:
    def median(connections: int, name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[(connections, name)])

    def ratio(connections: int, name: str, other: str) -> str:
        if (connections, other) not in rows:
            return "-"
        cpu_ms = median(connections, name, "cpu_ms_per_request")
        return f"{cpu_ms / median(connections, other, 'cpu_ms_per_request'):.2f}x"

    kinds = [entry[0] for entry in mix.plan]
    print(f"Run {started}, {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"`python tests/bench/mixed_traffic.py --gateways {' '.join(args.gateways)} --connections "
          f"{' '.join(map(str, args.connections))} --seconds {args.seconds} --repeats {args.repeats} "
          f"--seed {args.seed} --decode-step-s {args.decode_step_s:g}"
          f"{f' --only {args.only}' if args.only else ''} --stream-share {args.stream_share:g}`; "
          f"medians of {args.repeats}. The plan: "
          f"{kinds.count(SHORT)} short chats, {kinds.count(TURN)} session turns, {kinds.count(DOCUMENT)} "
          f"document questions, {sum(e[4] for e in mix.plan)} streamed, of {len(mix.plan)}.\n")
    print("| clients | gateway | req/s | CPU ms/req | vs smg | vs smg-cache | TTFT p50 / p99 ms "
          "| latency p50 / p99 ms | cores: gateway / engine / wrk | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for connections in args.connections:
        for name in args.gateways:
            if (connections, name) not in rows:
                continue
            ttft = [t for r in rows[(connections, name)] for t in r["ttft"]]
            print(f"| {connections} | {name} | {median(connections, name, 'rps'):.1f} | "
                  f"{median(connections, name, 'cpu_ms_per_request'):.2f} | {ratio(connections, name, 'smg')} | "
                  f"{ratio(connections, name, 'smg-cache')} | "
                  f"{_percentile(ttft, 0.5) * 1000:.0f} / {_percentile(ttft, 0.99) * 1000:.0f} | "
                  f"{median(connections, name, 'p50_ms'):.0f} / {median(connections, name, 'p99_ms'):.0f} | "
                  f"{median(connections, name, 'gateway_cores'):.2f} / {median(connections, name, 'engine_cores'):.2f}"
                  f" / {median(connections, name, 'wrk_cores'):.2f} | "
                  f"{sum(r['errors'] for r in rows[(connections, name)])} |")


if __name__ == "__main__":
    main()

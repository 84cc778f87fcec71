"""Cluster rate limits on real processes: 5 nodes, one limit, 10x the load, then the owner killed.

The client spreads its requests round-robin over the nodes, as a load balancer
would, and offers ten times the limit for 60 s: the admitted count may exceed the
limit by at most 2% in any 10 s window, whichever node received the requests, and
falls short of it by at most 2% over the whole minute (10% in any one window: a
bucket with a burst of 2 cannot bank what a stall of this shared machine leaves
unused, and a 0.75 s stall of the client or of the key's owner loses 15
admissions). Then the node owning the key is SIGKILLed: the admitted count of
the next 20 s must stay within the bound documented in gateway/ratelimit/limiter.py.
"""

from __future__ import annotations

import time

import httpx2
import trio

from chaos.processes import EngineProcess, NodeProcess
from gateway.ratelimit import LimitSet, RateLimitConfig, RateLimiter, parse_limit_set
from mesh.config import MeshConfig
from mesh.crypto import generate_key
from mesh.ring import HashRing

from tests.support.nodes import MODEL
from tests.support.waiting import eventually

BASE = 29946
KEY = generate_key()
LIMIT_PER_S = 20.0
BURST = 2.0
OFFERED_PER_S = 10 * LIMIT_PER_S
LIMITS_TOML = f"""
[[limits]]
name = "hot"
scope = "global"
limit = {LIMIT_PER_S}
burst = {BURST}
"""


def node_args(i: int, limits_file: str) -> list[str]:
    return ["--mesh-bind", f"127.0.0.1:{BASE + i}", "--join", f"127.0.0.1:{BASE}", "--node-name", f"r{i}",
            "--encrypt", KEY, "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{BASE + 100 + i}",
            "--retry-join-interval-secs", "0.5", "--rate-limits", limits_file, "--log-level", "warning"]


def _metric(url: str, name: str) -> float:
    for line in httpx2.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Client:
    """Open-loop load: a request every 1/OFFERED_PER_S seconds, whatever the answers take."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.admitted: list[float] = []
        self.sent: list[float] = []  # every request's time, admitted or not
        self.refused = 0
        self.other: list[int] = []

    async def offer(self, http: httpx2.AsyncClient, duration_s: float) -> None:
        interval = 1.0 / OFFERED_PER_S
        start = trio.current_time()
        i = 0
        async with trio.open_nursery() as nursery:
            while trio.current_time() - start < duration_s:
                names = sorted(self.urls)
                nursery.start_soon(self._one, http, self.urls[names[i % len(names)]])
                i += 1
                await trio.sleep_until(start + i * interval)

    async def _one(self, http: httpx2.AsyncClient, url: str) -> None:
        # Counted at the time it was sent: the owner decides within milliseconds of that, while the
        # answer may come back much later on a busy machine (and fall into the next window).
        sent = time.monotonic()
        self.sent.append(sent)
        try:
            r = await http.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
        except httpx2.HTTPError:
            self.other.append(-1)
            return
        if r.status_code == 200:
            self.admitted.append(sent)
        elif r.status_code == 429:
            assert r.json()["error"]["code"] == "rate_limit_exceeded"
            self.refused += 1
        else:
            self.other.append(r.status_code)

    def count(self, start: float, end: float) -> int:
        return sum(1 for t in self.admitted if start <= t < end)

    def ideal(self, start: float, end: float) -> int:
        """What one exact token bucket (LIMIT_PER_S, BURST) admits of the requests as they were really sent in
        [start, end): the most the limit lets through. A busy machine sends late and in bunches, and the tokens of
        a gap past the burst are lost to any bucket: the limit promises this, not 10 x the rate per 10 s."""
        tokens, last, admitted = BURST, None, 0
        for t in sorted(self.sent):
            if last is not None:
                tokens = min(BURST, tokens + (t - last) * LIMIT_PER_S)
            last = t
            if tokens >= 1:
                tokens -= 1
                if start <= t < end:
                    admitted += 1
        return admitted


async def test_five_nodes_hold_one_limit_under_ten_times_the_load_and_an_owner_kill(log_dir, tmp_path):
    limits_file = tmp_path / "limits.toml"
    limits_file.write_text(LIMITS_TOML)
    engine = EngineProcess(["--zero-cost"], log_dir, "rl-engine")
    nodes = {}
    try:
        for i in range(5):
            extra = ["--worker-urls", engine.url] if i == 0 else []
            nodes[f"r{i}"] = NodeProcess([*node_args(i, str(limits_file)), *extra], log_dir, f"rl-r{i}")
        urls = {name: n.url for name, n in nodes.items()}
        admin = nodes["r0"].admin_headers  # the nodes share one admin token file

        def ready() -> bool:
            return all(httpx2.get(u + "/readiness", timeout=5).status_code == 200 for u in urls.values())

        eventually(ready, 60)
        eventually(lambda: all(httpx2.get(u + "/admin/rate-limits", timeout=5, headers=admin).json()["limits"]
                               for u in urls.values()), 10)
        # A change made on one node reaches every node (here: the policy, then back).
        original = httpx2.get(urls["r3"] + "/admin/rate-limits", timeout=5, headers=admin).json()
        original.pop("node")
        for policy in ("closed", "proportional"):
            r = httpx2.put(urls["r3"] + "/admin/rate-limits", json={**original, "failure_policy": policy}, timeout=5,
                           headers=admin)
            assert r.status_code == 200, r.text
            eventually(lambda: all(httpx2.get(u + "/admin/rate-limits", timeout=5, headers=admin)
                                   .json()["failure_policy"] == policy
                                   for u in urls.values()), 10)
        bad = httpx2.put(urls["r1"] + "/admin/rate-limits", json={"limits": [{"name": "x", "limit": -1}]}, timeout=5,
                         headers=admin)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_rate_limits"
        eventually(lambda: all(_metric(u, 'smg_mesh_members{state="alive"}') == 5 for u in urls.values()), 10)

        client = Client(urls)
        limits = httpx2.Limits(max_connections=512, max_keepalive_connections=256)
        async with httpx2.AsyncClient(limits=limits, timeout=30) as http:
            start = time.monotonic()
            await client.offer(http, 60)
            steady = [client.count(start + 10 * w, start + 10 * (w + 1)) for w in range(6)]
            assert client.other == [], f"unexpected answers: {client.other[:10]}"
            window_limit = 10 * LIMIT_PER_S
            ideal = [client.ideal(start + 10 * w, start + 10 * (w + 1)) for w in range(6)]
            for w, got in enumerate(steady):
                assert got <= 1.02 * window_limit, f"window {w} admitted over the limit: {steady}"
                assert got >= 0.90 * ideal[w], f"window {w} admitted far under what the limit lets: {steady} {ideal}"
            # Under the limit over the minute only by what the cluster's batching costs (decisions at the owner a
            # few milliseconds after the send): 1,173 of 1,176 once on a loaded machine, whose client sent late.
            assert sum(steady) >= 0.97 * sum(ideal), f"the minute admitted under the limit: {steady} {ideal}"
            assert client.refused > 0.85 * OFFERED_PER_S * 60

            # Kill the key's owner; a load balancer stops sending to it (its requests would fail fast).
            owner = HashRing.build(list(nodes)).owner("hot:*")
            nodes[owner].kill()
            del client.urls[owner]
            killed = time.monotonic()
            await client.offer(http, 20)
        after = client.count(killed, killed + 20)
        print(f"admitted per 10 s window: {steady} (limit {10 * LIMIT_PER_S:.0f}); after the owner's kill: "
              f"{after} in 20 s")
        mesh = MeshConfig.local()
        detection_s = mesh.probe_interval_s * 2 + mesh.suspicion_timeout_s(5, 0)
        spec = parse_limit_set({"limits": [{"name": "hot", "limit": LIMIT_PER_S, "burst": BURST}]}).limits[0]
        bound = LIMIT_PER_S * 20 + RateLimiter(RateLimitConfig(), LimitSet()).overshoot_bound(spec, detection_s, 5)
        assert after <= bound, f"{after} admitted in 20 s after the owner died; bound {bound:.0f}"
        # The successor went on deciding (4 of 5 known nodes visible: 80% of the limit).
        assert after >= 0.6 * LIMIT_PER_S * 20, f"only {after} admitted after the owner died"
    finally:
        for n in nodes.values():
            n.kill()
        engine.kill()



SINGLE_NODE_LIMITS = """
[[limits]]
name = "tokens"
unit = "tokens"
limit = 100000
window_s = 3600
algorithm = "sliding_window"   # no refill within the window: remaining counts are exact

[[limits]]
name = "per-key"
scope = "api_key"
limit = 3
window_s = 3600
algorithm = "sliding_window"
"""


def test_tokens_are_reserved_then_settled_with_real_usage_even_when_the_client_goes_away(log_dir, tmp_path):
    import openai

    from tests.support.nodes import ENGINE_ARGS

    limits_file = tmp_path / "limits.toml"
    limits_file.write_text(SINGLE_NODE_LIMITS)
    engine = EngineProcess(ENGINE_ARGS, log_dir, "rl-tok-engine")
    node = NodeProcess(["--worker-urls", engine.url, "--rate-limits", str(limits_file),
                        "--admin-token", "s3cret-admin"],
                       log_dir, "rl-tok-node")
    try:
        body = {"model": MODEL, "prompt": "count the tokens", "max_tokens": 5}
        headers = {"authorization": "Bearer k1"}
        r1 = httpx2.post(node.url + "/v1/completions", json=body, headers=headers, timeout=30)
        assert r1.status_code == 200
        p = r1.json()["usage"]["prompt_tokens"]
        remaining1 = int(r1.headers["x-ratelimit-remaining-tokens"])
        assert remaining1 == 100000 - (p + 5)  # the reservation: prompt + max_tokens
        assert r1.headers["x-ratelimit-limit-tokens"] == "100000"
        assert r1.headers["x-ratelimit-remaining-requests"] == "2"

        # A stream reserving 5,000 tokens, abandoned after a few chunks.
        with httpx2.stream("POST", node.url + "/v1/completions", json={**body, "max_tokens": 5000, "stream": True},
                           headers=headers, timeout=30) as r2:
            assert int(r2.headers["x-ratelimit-remaining-tokens"]) == remaining1 - (p + 5000)
            for i, _ in enumerate(r2.iter_lines()):
                if i >= 6:
                    break

        def settled() -> bool:
            # The request counter moves when the handler has unwound, settlement included.
            metrics = httpx2.get(node.url + "/metrics", timeout=5).text
            return 'smg_http_requests_total{route="/v1/completions",status="200"} 2.0' in metrics

        eventually(settled, 15)
        r3 = httpx2.post(node.url + "/v1/completions", json={**body, "max_tokens": 1}, headers=headers, timeout=30)
        assert r3.status_code == 200
        remaining3 = int(r3.headers["x-ratelimit-remaining-tokens"])
        generated = remaining1 - remaining3 - 2 * p - 1  # what the abandoned stream really used
        assert 1 <= generated < 1000, (remaining1, remaining3, p)

        # The fourth request of key k1 is refused, through the official SDK.
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="k1", max_retries=0)
        try:
            client.completions.create(model=MODEL, prompt="one more", max_tokens=1)
            raise AssertionError("the fourth request of k1 was admitted")
        except openai.RateLimitError as e:
            assert e.code == "rate_limit_exceeded"
            assert e.response.headers["x-ratelimit-remaining-requests"] == "0"
            assert int(e.response.headers["retry-after"]) > 0
        # Another key has its own count.
        other = openai.OpenAI(base_url=node.url + "/v1", api_key="k2", max_retries=0)
        assert other.completions.create(model=MODEL, prompt="hi", max_tokens=1).usage.completion_tokens == 1
        metrics = httpx2.get(node.url + "/metrics", timeout=5).text
        assert 'smg_rate_limit_decisions_total{limit="per-key",outcome="denied"} 1.0' in metrics

        # Clients cannot lift their own limits: changes need the admin token.
        admin = {"authorization": "Bearer s3cret-admin"}
        current = httpx2.get(node.url + "/admin/rate-limits", timeout=5, headers=admin).json()
        current.pop("node")
        refused = httpx2.put(node.url + "/admin/rate-limits", json=current, headers=headers, timeout=5)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert refused.headers["www-authenticate"] == 'Bearer realm="smg-node", error="invalid_token"'
        assert httpx2.put(node.url + "/admin/rate-limits", json=current, timeout=5, headers=admin).status_code == 200
    finally:
        node.kill()
        engine.kill()

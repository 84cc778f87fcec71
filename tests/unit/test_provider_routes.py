"""The models config (gateway/providers/routes.py), a target's cooldown (cooldowns.py), a pool's saturation
(overflow.py) and the events of a provider's stream (sse.py): rules without I/O, time given."""

from __future__ import annotations

import collections
import random

import pytest

from gateway.engine.messages import EngineLoad
from gateway.providers.base import ProviderError
from gateway.providers.cooldowns import CooldownConfig, Cooldowns
from gateway.providers.credentials import Credential, CredentialError, Secrets
from gateway.providers.overflow import saturated
from gateway.providers.routes import DEFAULT_FALLBACK_ON, Overflow, RoutesError, parse_routes
from gateway.providers.sse import SseDecoder, json_objects
from gateway.providers.text_events import TextEvents

CONFIG = {
    "targets": {
        "a": {"provider": "openai", "model": "gpt-a", "credential": "env:A_KEY", "rpm": 100},
        "b": {"provider": "openai_compatible", "model": "b", "base_url": "http://10.0.0.5:8000/v1"},
        "az": {"provider": "azure", "model": "dep", "base_url": "https://x.openai.azure.com", "api_version": "v",
               "credential": "file:/run/secrets/az"},
    },
    "models": {
        "smart": {"targets": [{"target": "a", "weight": 3}, {"target": "b", "weight": 1},
                              {"pool": "Qwen/Qwen3-8B", "priority": 1}],
                  "tenants": ["team-a"], "overflow": {"waiting": 4}},
        "plain": {"targets": ["az"], "fallback_on": ["server"]},
    },
}


def test_a_config_is_read_into_routes_and_targets():
    routes = parse_routes(CONFIG)
    smart = routes.get("smart")
    assert [t.name for t in smart.targets] == ["a", "b", "pool:Qwen/Qwen3-8B"]
    assert smart.targets[0].target.base_url == "https://api.openai.com/v1"  # OpenAI's own, when not given
    assert str(smart.targets[0].target.credential) == "env:A_KEY" and smart.fallback_on == DEFAULT_FALLBACK_ON
    assert smart.allows("team-a") and not smart.allows("team-b") and not smart.allows(None)
    assert routes.get("plain").fallback_on == {"server"} and routes.get("plain").allows(None)
    assert routes.targets["az"].options == {"api_version": "v"} and routes.quotas["a"].requests_per_minute == 100
    assert routes.get("nothing") is None


@pytest.mark.parametrize("change, said", [
    ({"targets": {"x": {"provider": "nope", "model": "m"}}}, "provider must be one of"),
    ({"targets": {"x": {"provider": "openai", "model": "m", "credential": "sk-live-123"}}}, "never the secret"),
    ({"targets": {"x": {"provider": "openai", "model": "m", "credential": "env:K", "api_key": "sk"}}}, "unknown keys"),
    ({"targets": {"x": {"provider": "azure", "model": "m"}}}, "no default"),
    ({"targets": {"x": {"provider": "openai", "model": "m", "api": "assistants"}}}, r"x\.api must be one of chat"),
    ({"targets": {"x": {"provider": "anthropic", "model": "m", "api": "responses"}}}, "unknown keys: api"),
    ({"targets": {"x": {"provider": "openai", "model": "m", "headers": {"Authorization": "Bearer sk"}}}},
     "may not set credentials"),
    ({"models": {"m": {"targets": [{"target": "missing"}]}}}, "no target named 'missing'"),
    ({"models": {"m": {"targets": [{"target": "a", "pool": "p"}]}}}, "names a target or a pool"),
    ({"models": {"m": {"targets": [{"target": "a", "weight": 0}]}}}, "weight must be a positive number"),
    ({"models": {"m": {"targets": ["a"], "fallback_on": ["sometimes"]}}}, "fallback_on lists failure kinds"),
    ({"models": {"m": {"targets": ["a"], "overflow": {"waiting": 2}}}}, "applies to a pool target"),
    ({"models": {"m": {"targets": []}}}, "non-empty list"),
])
def test_a_config_that_cannot_be_used_is_refused_naming_the_entry(change, said):
    config = {"targets": {**CONFIG["targets"], **change.get("targets", {})}, "models": change.get("models", {})}
    with pytest.raises(RoutesError, match=said):
        parse_routes(config)


def test_targets_are_tried_by_priority_then_a_draw_weighted_by_weight():
    smart = parse_routes(CONFIG).get("smart")
    rng = random.Random(7)
    firsts = collections.Counter(smart.ordered(rng)[0].name for _ in range(4000))
    assert 0.70 < firsts["a"] / 4000 < 0.80  # weight 3 of 4
    assert all(smart.ordered(rng)[2].name == "pool:Qwen/Qwen3-8B" for _ in range(100))  # priority 1: last


def test_a_target_cools_after_three_failures_or_at_once_for_a_retry_after_then_one_probe_ends_it():
    cool = Cooldowns(CooldownConfig(failures_to_cool=3, failure_window_s=60, cooldown_s=10, cooldown_max_s=300))
    assert cool.failed("t", "server", None, 0.0) is None and cool.failed("t", "server", None, 1.0) is None
    assert cool.failed("t", "bad_request", None, 2.0) is None  # the request's fault, not the target's
    assert cool.failed("t", "server", None, 3.0) == 13.0 and not cool.available("t", 5.0)
    assert cool.available("t", 13.0) and cool.probe("t", 13.0) and not cool.available("t", 13.5)  # one probe
    assert cool.failed("t", "server", None, 14.0) == 34.0  # the probe failed: twice as long
    assert cool.probe("t", 34.0)
    cool.succeeded("t")
    assert cool.available("t", 34.1) and cool.cooling("t", 34.1) == 0.0
    assert cool.failed("u", "rate_limited", 30.0, 100.0) == 130.0  # a 429's retry-after, at once
    assert cool.failed("v", "rate_limited", 3600.0, 0.0) == 300.0  # at most the longest
    cool.told("w", 50.0, 10.0)  # another node's cooldown
    assert not cool.available("w", 20.0) and cool.cooling_targets(20.0) == {"u": 110.0, "v": 280.0, "w": 30.0}


class _Worker:
    def __init__(self, waiting: "int | None", kv: float = 0.1, in_flight: int = 0) -> None:
        self.engine_load = None if waiting is None else EngineLoad(running=2, waiting=waiting, token_usage=kv,
                                                                  max_running=8)
        self.in_flight = in_flight
        self.in_flight_at_poll = 0


def test_a_pool_is_saturated_only_when_every_worker_is_past_a_threshold():
    by_queue = Overflow(waiting=4)
    assert saturated([_Worker(4), _Worker(9)], by_queue)
    assert not saturated([_Worker(4), _Worker(3)], by_queue)
    assert saturated([_Worker(2, in_flight=2)], by_queue)  # two sent since the last poll count as waiting
    assert not saturated([_Worker(None)], by_queue)  # no report: room, until the evidence says otherwise
    assert not saturated([], by_queue)  # no worker: the pool's attempt fails on its own
    assert saturated([_Worker(0, kv=0.97)], Overflow(kv_usage=0.95))


def test_events_cut_anywhere_are_read_whole_and_an_endless_one_is_refused():
    stream = b'event: delta\r\ndata: {"a":\r\ndata: 1}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n'
    for cut in range(1, len(stream)):
        decoder = SseDecoder()
        events = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert events == [("delta", '{"a":\n1}'), ("message", "[DONE]")], cut
    decoder = SseDecoder(event_bytes_max=1000)
    with pytest.raises(ProviderError, match="larger than 1000"):
        for _ in range(100):
            decoder.feed(b"data: " + b"x" * 100 + b"\n")


def test_credentials_are_references_resolved_when_used(tmp_path):
    with pytest.raises(ValueError, match="never the secret"):
        Credential.parse("sk-abc", "targets.a.credential")
    secret_file = tmp_path / "key"
    secret_file.write_text("from-file\n")
    secrets = Secrets({"A_KEY": "from-env"})
    assert secrets.resolve(Credential.parse("env:A_KEY", "x")) == "from-env"
    assert secrets.resolve(Credential.parse(f"file:{secret_file}", "x")) == "from-file"
    with pytest.raises(CredentialError, match="B_KEY is not set"):
        secrets.resolve(Credential.parse("env:B_KEY", "x"))
    assert str(Credential.parse("env:A_KEY", "x")) == "env:A_KEY"  # what is shown: the reference


class _Cluster:
    """What the providers' service needs of the cluster's document: settings set here, and a peer's arriving."""

    def __init__(self) -> None:
        self.sent: dict[str, object] = {}
        self.callbacks: list = []

    def follow_settings(self, callback) -> None:
        self.callbacks.append(callback)

    def set_setting(self, name: str, value: object) -> None:
        self.sent[name] = value

    def peer_sets(self, name: str, value: object) -> None:
        for callback in self.callbacks:
            callback(name, value)


def _service(cluster: _Cluster, now: list[float]):
    from gateway.net.http_client import HttpClient
    from gateway.providers.config import ProvidersConfig
    from gateway.providers.dispatch import ProviderCalls
    from gateway.providers.service import Providers

    return Providers(ProvidersConfig(), ProviderCalls(HttpClient()), parse_routes(CONFIG), random.Random(1),
                     clock=lambda: now[0], cluster=cluster)


def test_cooldowns_travel_through_the_cluster_and_a_peers_bad_ones_are_dropped():
    now = [1000.0]
    cluster, peer = _Cluster(), _Cluster()
    here, there = _service(cluster, now), _service(peer, now)
    target = parse_routes(CONFIG).get("smart").targets[0]
    here.failed(target, "rate_limited", 30.0)
    assert cluster.sent == {"provider-cooldown:a": {"until": 1030.0}}
    peer.peer_sets("provider-cooldown:a", cluster.sent["provider-cooldown:a"])
    assert not there.cooldowns.available("a", 1010.0) and there.cooldowns.available("a", 1031.0)
    # A probe's success ends it everywhere.
    now[0] = 1031.0
    assert here.cooldowns.probe("a", 1031.0)
    here.succeeded(target)
    assert cluster.sent["provider-cooldown:a"] == {"until": 0.0}
    there.cooldowns.told("a", 1100.0, 1031.0)
    peer.peer_sets("provider-cooldown:a", {"until": 0.0})
    assert there.cooldowns.available("a", 1032.0)
    for name, value in (("provider-cooldown:unknown", {"until": 1100.0}), ("provider-cooldown:a", {"until": 10 ** 9}),
                        ("provider-cooldown:a", {"until": "soon"}), ("provider-cooldown:a", None),
                        ("models-config", {"models": {"x": {"targets": ["missing"]}}})):
        peer.peer_sets(name, value)
    assert there.refused_settings == 5 and there.cooldowns.available("a", 1033.0) and "x" not in there.routes.routes


def test_a_models_config_put_here_is_published_for_every_node():
    now = [0.0]
    cluster, peer = _Cluster(), _Cluster()
    here, there = _service(cluster, now), _service(peer, now)
    new = {"targets": {"b": CONFIG["targets"]["b"]}, "models": {"only": {"targets": ["b"]}}}
    here.publish_models(new)
    assert set(here.routes.routes) == {"only"} and cluster.sent["models-config"] == new
    peer.peer_sets("models-config", cluster.sent["models-config"])
    assert set(there.routes.routes) == {"only"}
    with pytest.raises(RoutesError):
        here.publish_models({"models": {"bad": {"targets": ["none"]}}})
    assert set(here.routes.routes) == {"only"}  # the routes in use stay


def test_smg_node_models_shows_routes_targets_references_and_cooldowns():
    from gateway.cli.models import tables

    lines = [line.split() for line in tables(parse_routes(CONFIG).describe({"a": 12.3})).splitlines()]
    assert ["smart", "a", "w3,", "b,", "pool:Qwen/Qwen3-8B", "p1",
            "connect,context_length,overloaded,rate_limited,server,timeout", "team-a"] in lines
    assert ["a", "openai", "gpt-a", "env:A_KEY", "100", "-", "12.3", "s"] in lines
    assert ["az", "azure", "dep", "file:/run/secrets/az", "-", "-", "no"] in lines


def test_a_probe_the_request_itself_spoiled_leaves_the_next_request_to_probe():
    cool = Cooldowns(CooldownConfig(failures_to_cool=1, cooldown_s=10))
    assert cool.failed("t", "server", None, 0.0) == 10.0
    assert cool.probe("t", 10.0) and not cool.available("t", 10.5)
    cool.release("t")  # the probe's request was refused for its own reasons (a feature the target lacks)
    assert cool.available("t", 10.6) and cool.probe("t", 10.6)


@pytest.mark.parametrize("body", [
    b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n',  # the usual: read in one pass
    b'data: {"a":1}\n\n',
    b'data: [DONE]\n\n',
    b'data: {"a":1}\n\nevent: x\ndata: {"b":2}\n\n',  # another field: the general reading
    b'data: {"a":1}\n\n: keep-alive\n\ndata: {"b":2}\n\n',  # a comment
    b'data: {"a":1}\r\n\r\ndata: {"b":2}\n\n',  # \r
    b'data: [DONE]\n\ndata: {"a":1}\n\n',  # [DONE] not last
    b'data: {"a":1}\n\ndata: 7\n\ndata: "s"\n\n',  # values that are not objects are skipped
    b'data: {"a":\ndata: 1}\n\n',  # two data lines of one event
    b'event: a\ndata: {"a":1}\n\nevent: b\ndata: {"b":2}\n\n',  # Anthropic's: named events, read in one pass
    b'event: a\ndata: {"a":1}\n\ndata: {"b":2}\n\n',  # named and not: the general reading
    b'event: a\ndata: {"a":\ndata: 1}\n\n',
    b'event: a\n: comment\ndata: {"a":1}\n\n',
    b'event: a\ndata: {"a":1}\nid: 7\n\n',
    b'event: a\ndata: [DONE]\n\nevent: b\ndata: {"b":2}\n\n',
    b'event: a\ndata: {"a":1}\n\nevent: b\ndata: {"b":',  # cut inside the last: kept for the next piece
])
def test_whole_events_read_in_one_pass_give_what_the_general_reading_gives(body):
    general = SseDecoder()
    expected = [o for i in range(len(body)) for o in general.objects(body[i:i + 1])]  # byte by byte: never whole
    assert SseDecoder().objects(body) == expected
    # The same events read at their places in the piece (text_events.TextEvents, no shape learned yet).
    assert json_objects([item for item in TextEvents(b"a").items(body)]) == expected


@pytest.mark.parametrize("body", [b'data: 1, 2\n\n', b'data: {"a":1}\n\ndata: nope\n\n'])
def test_an_event_that_is_not_one_json_value_is_refused_whole_or_in_pieces(body):
    with pytest.raises(ProviderError, match="not JSON"):
        SseDecoder().objects(body)
    with pytest.raises(ProviderError, match="not JSON"):
        decoder = SseDecoder()
        for i in range(len(body)):
            decoder.objects(body[i:i + 1])

"""The response cache without the network: which requests are cacheable, the key equal requests share, and the
store's bounds (node, tenant, TTL); then the cluster's lookups over a simulated pair of owners."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from gateway.base import packing
from gateway.cache import AnswerStore, CacheConfig, Entry, ResponseCache, cache_key, cacheable
from mesh import PeerUnreachable


def entry(partition: str = "tenant:a", size: int = 100, expires_at_s: float = 1000.0) -> Entry:
    return Entry(partition, b"application/json", b"x" * size, False, (10, 5, 0, 0), expires_at_s)


@pytest.mark.parametrize("body, control, default, expected", [
    ({"temperature": 0}, None, False, True),
    ({"temperature": 0.0}, None, False, True),
    ({"seed": 7}, None, False, True),
    ({}, None, False, False),  # sampled: another answer each time
    ({"temperature": 0.7}, None, False, False),
    ({"temperature": True}, None, False, False),
    ({"seed": True}, None, False, False),
    ({"cache": True, "temperature": 0.9}, None, False, True),  # opted in
    ({}, None, True, True),  # the model's default
    ({"cache": False, "temperature": 0}, None, True, False),  # opted out
    ({"temperature": 0}, "no-cache", False, False),
    ({"temperature": 0}, "max-age=0, no-store", False, False),
])
def test_what_is_cacheable(body, control, default, expected):
    assert cacheable(body, control, default) is expected


def test_equal_requests_share_a_key_whatever_their_order_defaults_and_number_spelling():
    a = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 8}
    b = {"max_tokens": 8, "temperature": 0.0, "n": 1, "stream": False, "user": "bob", "cache": True,
         "messages": [{"content": "hi", "role": "user"}], "model": "m", "metadata": {"x": "y"}}
    assert cache_key("chat", "tenant:a", a) == cache_key("chat", "tenant:a", b)


@pytest.mark.parametrize("change", [{"max_tokens": 9}, {"stream": True}, {"n": 2}, {"seed": 1}, {"model": "m2"},
                                    {"tools": [{"type": "function", "function": {"name": "f"}}]},
                                    {"messages": [{"role": "user", "content": "hi!"}]}])
def test_a_request_that_asks_something_else_has_another_key(change):
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 8}
    assert cache_key("chat", "tenant:a", base) != cache_key("chat", "tenant:a", {**base, **change})


def test_the_same_request_of_another_tenant_or_api_has_another_key():
    body = {"model": "m", "prompt": "hi", "temperature": 0}
    assert cache_key("completions", "tenant:a", body) != cache_key("completions", "tenant:b", body)
    assert cache_key("completions", "tenant:a", body) != cache_key("chat", "tenant:a", body)


def test_an_entry_is_served_to_its_partition_only_and_not_past_its_ttl():
    store = AnswerStore(10_000, 10_000)
    store.put("k", entry(expires_at_s=100.0), now_s=0.0)
    assert store.get("k", "tenant:b", 50.0) is None
    assert store.get("k", "tenant:a", 50.0) is not None
    assert store.get("k", "tenant:a", 100.0) is None and store.stats.expired == 1 and store.bytes == 0


def test_a_key_keeps_its_first_answer_until_it_expires():
    """Two nodes that missed at once both put their answer: every node serves the first one for its TTL."""
    store = AnswerStore(10_000, 10_000)
    first = entry(size=10, expires_at_s=100.0)
    assert store.put("k", first, now_s=0.0)
    assert not store.put("k", entry(size=20, expires_at_s=200.0), now_s=1.0)
    assert store.get("k", "tenant:a", 2.0) is first and store.stats.kept_first == 1 and store.bytes == first.size
    later = entry(size=30, expires_at_s=300.0)
    assert store.put("k", later, now_s=150.0)  # the first expired: the next answer is kept
    assert store.get("k", "tenant:a", 151.0) is later and store.bytes == later.size


def test_the_node_bound_evicts_the_least_recently_used_first():
    size = entry().size
    store = AnswerStore(3 * size, 10 * size)
    for key in ("a", "b", "c"):
        store.put(key, entry(), 0.0)
    store.get("a", "tenant:a", 1.0)  # a used again: b is now the oldest
    store.put("d", entry(), 2.0)
    assert [k for k in ("a", "b", "c", "d") if store.get(k, "tenant:a", 3.0)] == ["a", "c", "d"]
    assert store.stats.evicted_bytes == 1 and store.bytes == 3 * size


def test_one_tenant_filling_its_share_evicts_its_own_answers_not_the_others():
    size = entry().size
    store = AnswerStore(10 * size, 2 * size)
    store.put("other", entry("tenant:b"), 0.0)
    for key in ("a1", "a2", "a3", "a4"):
        store.put(key, entry("tenant:a"), 0.0)
    assert store.get("other", "tenant:b", 1.0) is not None
    assert store.partition_bytes("tenant:a") == 2 * size
    assert [k for k in ("a1", "a2", "a3", "a4") if store.get(k, "tenant:a", 1.0)] == ["a3", "a4"]


def test_an_entry_larger_than_a_bound_is_not_kept():
    store = AnswerStore(1000, 500)
    assert not store.put("big", entry(size=600), 0.0)
    assert store.stats.refused_large == 1 and len(store) == 0


def test_expired_entries_are_dropped_by_the_sweep():
    store = AnswerStore(10_000, 10_000)
    store.put("old", entry(expires_at_s=10.0), 0.0)
    store.put("new", entry(expires_at_s=100.0), 0.0)
    assert store.drop_expired(50.0) == 1 and len(store) == 1


# -- the cluster's cache, over a fake pair of owners ---------------------------------------------------------




class Pair:
    """Two nodes' caches whose requests to each other go through ``request_peer`` (or fail when ``down``)."""

    def __init__(self) -> None:
        self.caches: dict[str, ResponseCache] = {}
        self.down: set[str] = set()
        self.order = ["a", "b"]

    def view(self, name: str) -> "Any":
        pair = self

        class View:
            node_name = name

            def owners(self, key: str, count: int) -> "list[str]":
                return pair.order[:count]

            def serve_requests(self, mark: bytes, handler) -> None:
                pass

            async def request_peer(self, peer: str, payload: bytes, timeout_s: float) -> bytes:
                if peer in pair.down:
                    raise PeerUnreachable(peer)
                return await pair.caches[peer].on_peer_request(payload[1:])

        return View()


async def started(pair: Pair, nursery: trio.Nursery, config: CacheConfig = CacheConfig(enabled=True)) -> None:
    for name in ("a", "b", "c"):
        pair.caches[name] = ResponseCache(config, pair.view(name), clock=trio.current_time)
        await nursery.start(pair.caches[name].run)


async def test_any_node_finds_an_answer_on_its_owners_and_the_second_when_the_first_is_gone(autojump_clock):
    pair = Pair()
    async with trio.open_nursery() as nursery:
        await started(pair, nursery)
        pair.caches["c"].keep("k", entry(expires_at_s=trio.current_time() + 100))  # c owns nothing: puts on a, b
        await trio.sleep(1)
        assert len(pair.caches["a"].store) == len(pair.caches["b"].store) == 1 and not pair.caches["c"].store
        found = await pair.caches["c"].lookup("k", "tenant:a")
        assert found is not None and found.body == entry().body and found.usage == (10, 5, 0, 0)
        assert await pair.caches["c"].lookup("k", "tenant:b") is None  # another partition: never served
        pair.down.add("a")
        assert (await pair.caches["c"].lookup("k", "tenant:a")) is not None  # the replica answers
        assert pair.caches["c"].peer_failures == 1
        pair.down.add("b")
        assert await pair.caches["c"].lookup("k", "tenant:a") is None  # a miss, not an error
        nursery.cancel_scope.cancel()


async def test_an_answer_travels_with_its_ttl_left(autojump_clock):
    pair = Pair()
    async with trio.open_nursery() as nursery:
        await started(pair, nursery)
        pair.caches["c"].keep("k", entry(expires_at_s=trio.current_time() + 30))
        await trio.sleep(20)
        found = await pair.caches["c"].lookup("k", "tenant:a")
        assert found is not None and found.expires_at_s == pytest.approx(trio.current_time() + 10, abs=1.5)
        await trio.sleep(11)
        assert await pair.caches["c"].lookup("k", "tenant:a") is None
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("frame", [
    b"G" + b"\xc1",  # not msgpack
    b"G" + packing.pack(["k"]),
    b"G" + packing.pack([1, "p"]),
    b"G" + packing.pack(["k" * 500, "p"]),
    b"P" + packing.pack(["k", "p", b"t", b"body", False, [1, 2, 3], 10]),  # usage of three counts
    b"P" + packing.pack(["k", "p", b"t", "body", False, [1, 2, 3, 4], 10]),  # a body that is not bytes
    b"P" + packing.pack(["k", "p", b"t", b"body", False, [1, 2, 3, 4], -1]),  # a negative TTL
    b"P" + packing.pack(["k", "p", b"t", b"x" * 5_000_000, False, [1, 2, 3, 4], 10]),  # larger than kept
    b"X" + packing.pack([]),
])
async def test_a_peers_bad_frame_is_dropped_and_counted(frame):
    cache = ResponseCache(CacheConfig(enabled=True))
    assert await cache.on_peer_request(frame) == b""
    assert cache.bad_frames == 1 and len(cache.store) == 0


async def test_a_peers_put_keeps_no_longer_than_this_nodes_ttl():
    cache = ResponseCache(CacheConfig(enabled=True, ttl_s=60.0), clock=lambda: 1000.0)
    frame = b"P" + packing.pack(["k", "p", b"application/json", b"{}", False, [1, 1, 0, 0], 10_000.0])
    assert await cache.on_peer_request(frame) == b"k"
    assert cache.store.get("k", "p", 1000.0).expires_at_s == 1060.0


# -- recording an answer to keep -----------------------------------------------------------------------------

class Sink:
    def __init__(self) -> None:
        self.body = b""

    async def receive(self):
        await trio.sleep_forever()

    async def send(self, message) -> None:
        if message["type"] == "http.response.body":
            self.body += message["body"]


def recorded_request(bytes_left: int) -> "tuple[Any, Sink]":
    from gateway.api.http import Request

    sink = Sink()
    scope = {"method": "POST", "path": "/v1/chat/completions", "headers": []}
    request = Request(scope, sink.receive, sink.send, "req-1", 1024, None)
    request.recording, request.recording_bytes_left = [], bytes_left
    return request, sink


async def test_a_recorded_stream_is_kept_whole_within_its_bound():
    request, sink = recorded_request(100)
    recording = request.recording
    await request.start_stream(200, [(b"content-type", b"text/event-stream")])
    await request.send_chunk(b"data: 1\n\n")
    await request.end_stream(b"data: [DONE]\n\n")
    assert b"".join(recording) == sink.body and request.recorded_type == b"text/event-stream"
    assert not request.recording_overflowed


async def test_a_stream_longer_than_an_entry_may_be_stops_being_recorded_and_is_still_sent():
    request, sink = recorded_request(20)
    await request.start_stream(200, [(b"content-type", b"text/event-stream")])
    for i in range(10):
        await request.send_chunk(b"data: %d\n\n" % i)
    assert request.recording is None and request.recording_overflowed  # never held past its bound
    assert sink.body.count(b"data: ") == 10


async def test_a_whole_answer_larger_than_an_entry_may_be_is_not_joined_for_it():
    request, sink = recorded_request(10)
    await request.send_pieces(200, [b"x" * 8, b"y" * 8], 16, [(b"content-type", b"application/json")])
    assert request.recording is None and request.recording_overflowed and sink.body == b"x" * 8 + b"y" * 8


def test_a_routes_cache_setting_is_a_boolean_and_its_ttl_positive():
    from gateway.providers.routes import RoutesError, parse_routes

    route = parse_routes({"models": {"m": {"targets": [{"pool": "p"}], "cache": True, "cache_ttl_secs": 60}}}).get("m")
    assert (route.cache, route.cache_ttl_s) == (True, 60.0)
    assert parse_routes({"models": {"m": {"targets": [{"pool": "p"}]}}}).get("m").cache is None
    for bad in ({"cache": "yes"}, {"cache_ttl_secs": 0}, {"cache_ttl_secs": "1h"}):
        with pytest.raises(RoutesError, match="models.m.cache"):
            parse_routes({"models": {"m": {"targets": [{"pool": "p"}], **bad}}})

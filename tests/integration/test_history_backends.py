"""One contract, three backends: the memory store (a lone node), PostgreSQL and Redis, the last two
against real servers started here (tests/support/real_servers.py). Then what each durable backend adds:
migrations run once and configurable names (Postgres), the key prefix and the retention (Redis), and a
server that is down answering StoreUnavailable (a 504) rather than hanging."""

from __future__ import annotations

import psycopg
import pytest
import redis
import trio

from gateway.history import (HistoryConfig, MemoryHistory, PostgresConfig, PostgresHistory, PostgresNames, RedisConfig,
                             RecordTooLarge, RedisHistory, StoredResponse, StoreUnavailable)

from tests.support.real_servers import free_port, postgres_server, redis_server


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory):
    with postgres_server(tmp_path_factory.mktemp("pg")) as url:
        yield url


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


BOUNDS = HistoryConfig(record_bytes_max=64_000)


@pytest.fixture(params=["memory", "postgres", "redis"])
async def store(request):
    if request.param == "memory":
        yield MemoryHistory(BOUNDS)
        return
    if request.param == "postgres":
        backend = PostgresHistory(PostgresConfig(url=request.getfixturevalue("postgres_url"), pool_max_size=4),
                                  BOUNDS)
    else:
        backend = RedisHistory(RedisConfig(url=request.getfixturevalue("redis_url"), pool_max_size=4), BOUNDS)
    await backend.open()
    yield backend
    await backend.aclose()


def unique(prefix: str) -> str:
    return f"{prefix}_{trio.current_time():.9f}".replace(".", "")


async def test_responses_are_kept_and_scoped(store):
    rid = unique("resp")
    record = StoredResponse(rid, "tenant:a", {"id": rid, "output": [{"type": "message"}]},
                            ({"id": "in_1", "type": "message", "content": "ü ☃"},), ({"role": "user"},))
    # Only the memory store of a node without a mesh writes without waiting; PostgreSQL and Redis take a round trip.
    assert store.put_response_at_once(record) == isinstance(store, MemoryHistory)
    assert (await store.get_response(rid, "tenant:a") == record) == isinstance(store, MemoryHistory)
    await store.put_response(record)
    assert await store.get_response(rid, "tenant:a") == record
    assert await store.get_response(rid, "tenant:b") is None
    assert not await store.delete_response(rid, "tenant:b")
    assert await store.delete_response(rid, "tenant:a")
    assert await store.get_response(rid, "tenant:a") is None and not await store.delete_response(rid, "tenant:a")


async def test_conversations_and_items(store):
    cid = unique("conv")
    conversation = {"id": cid, "object": "conversation", "created_at": 1_764_000_000, "metadata": {"k": "v"}}
    await store.create_conversation(conversation, "a", [{"id": "i0", "n": 0}])
    assert await store.get_conversation(cid, "a") == conversation
    assert await store.get_conversation(cid, "b") is None
    assert await store.add_items(cid, "a", [{"id": f"i{n}", "n": n} for n in range(1, 6)])
    assert not await store.add_items(cid, "b", [{"id": "x"}]) and not await store.add_items("conv_none", "a", [])
    page = await store.list_items(cid, "a", None, 2, False)
    assert [i["n"] for i in page.items] == [0, 1] and page.has_more
    page = await store.list_items(cid, "a", "i1", 10, False)
    assert [i["n"] for i in page.items] == [2, 3, 4, 5] and not page.has_more
    page = await store.list_items(cid, "a", "i4", 2, True)
    assert [i["n"] for i in page.items] == [3, 2] and page.has_more
    assert await store.list_items(cid, "b", None, 2, False) is None
    assert await store.get_item(cid, "a", "i3") == (True, {"id": "i3", "n": 3})
    assert await store.get_item(cid, "a", "zz") == (True, None) and await store.get_item(cid, "b", "i3") == (False, None)
    assert await store.delete_item(cid, "a", "i3") == (conversation, True)
    assert await store.delete_item(cid, "a", "i3") == (conversation, False)
    assert await store.delete_item(cid, "b", "i2") == (None, False)
    assert [i["n"] for i in await store.all_items(cid, "a")] == [0, 1, 2, 4, 5]
    updated = await store.update_conversation(cid, "a", {"topic": "rain"})
    assert updated == {**conversation, "metadata": {"topic": "rain"}} == await store.get_conversation(cid, "a")
    assert await store.update_conversation(cid, "b", {}) is None
    assert not await store.delete_conversation(cid, "b") and await store.delete_conversation(cid, "a")
    assert await store.get_conversation(cid, "a") is None and await store.all_items(cid, "a") is None


async def test_a_record_past_its_bound_is_refused_before_anything_is_stored(store):
    """Whatever the backend, one response and one conversation with its items take at most the record bound."""
    rid, cid = unique("resp"), unique("conv")
    with pytest.raises(RecordTooLarge):
        await store.put_response(StoredResponse(rid, "a", {"id": rid, "text": "x" * 70_000}, (), ()))
    assert await store.get_response(rid, "a") is None
    with pytest.raises(RecordTooLarge):
        await store.create_conversation({"id": cid, "metadata": {}}, "a", [{"id": "big", "t": "x" * 70_000}])
    await store.create_conversation({"id": cid, "metadata": {}}, "a", [{"id": "i0", "t": "x" * 30_000}])
    with pytest.raises(RecordTooLarge):
        await store.add_items(cid, "a", [{"id": "i1", "t": "x" * 20_000}, {"id": "i2", "t": "x" * 20_000}])
    assert [i["id"] for i in await store.all_items(cid, "a")] == ["i0"]  # nothing of the refused addition
    assert await store.add_items(cid, "a", [{"id": "i1", "t": "x" * 20_000}])
    assert await store.delete_item(cid, "a", "i0") == ({"id": cid, "metadata": {}}, True)
    assert await store.add_items(cid, "a", [{"id": "i2", "t": "x" * 30_000}])  # what a deletion freed counts


async def test_postgres_migrations_run_once_with_configured_names(postgres_url):
    # A second deployment in the same database, beside the default names the other tests use.
    names = PostgresNames().with_overrides(["responses=llm_answers", "conversations=llm_threads",
                                            "items=llm_thread_items", "migrations=llm_migrations",
                                            "owner=tenant_id", "body=payload", "position=seq"])
    config = PostgresConfig(url=postgres_url, pool_max_size=2, names=names)
    first, second = PostgresHistory(config), PostgresHistory(config)
    async with trio.open_nursery() as nursery:  # two nodes starting at once: the advisory lock orders them
        nursery.start_soon(first.open)
        nursery.start_soon(second.open)
    assert await first.schema_version() == 1
    await first.put_response(StoredResponse("resp_named", "a", {"id": "resp_named"}, (), ()))
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT tenant_id, payload->'response'->>'id' FROM llm_answers").fetchone()
        versions = conn.execute("SELECT count(*) FROM llm_migrations").fetchone()[0]
    assert row == ("a", "resp_named") and versions == 1
    for store in (first, second):
        await store.aclose()
    with pytest.raises(ValueError):
        PostgresNames().with_overrides(["nonsense=x"])
    assert PostgresNames(responses="bad name; drop").problem() is not None


async def test_redis_prefix_and_retention(redis_url):
    store = RedisHistory(RedisConfig(url=redis_url, key_prefix="team1:", retention_days=2))
    await store.open()
    await store.put_response(StoredResponse("resp_ttl", "a", {"id": "resp_ttl"}, (), ()))
    await store.create_conversation({"id": "conv_ttl", "metadata": {}}, "a", [{"id": "i"}])
    client = redis.Redis.from_url(redis_url)
    keys = sorted(k.decode() for k in client.keys("team1:*"))
    assert keys == ["team1:conv:{conv_ttl}", "team1:conv:{conv_ttl}:items", "team1:conv:{conv_ttl}:order",
                    "team1:resp:{resp_ttl}"]
    two_days_ms = 2 * 86_400_000
    assert all(two_days_ms - 60_000 < client.pttl(k) <= two_days_ms for k in keys)
    forever = RedisHistory(RedisConfig(url=redis_url, key_prefix="team2:", retention_days=-1))
    await forever.put_response(StoredResponse("resp_kept", "a", {"id": "resp_kept"}, (), ()))
    assert client.pttl("team2:resp:{resp_kept}") == -1
    for s in (store, forever):
        await s.aclose()


async def test_a_server_that_is_down_is_a_store_unavailable_not_a_hang():
    port = free_port()  # nothing listens there
    pg = PostgresHistory(PostgresConfig(url=f"postgresql://postgres@127.0.0.1:{port}/postgres", pool_timeout_s=1.0))
    with pytest.raises(StoreUnavailable):
        await pg.open()
    await pg.aclose()
    rd = RedisHistory(RedisConfig(url=f"redis://127.0.0.1:{port}/0", timeout_s=1.0))
    with pytest.raises(StoreUnavailable):
        await rd.get_response("resp_x", "a")
    await rd.aclose()

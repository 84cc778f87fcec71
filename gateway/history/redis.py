"""The Redis backend: stored responses and conversations in Redis, under a key prefix, with a retention time.

redis-py (the reference client), synchronous, called from worker threads through a
``CapacityLimiter`` the size of its blocking connection pool: the event loop never waits on Redis, and
a Redis that does not answer is a 504 (``StoreUnavailable``) after the socket timeouts.

Keys (``P`` is ``--redis-key-prefix``):

    P resp:{ID}          hash: owner, body (the stored response's JSON)
    P conv:{ID}          hash: owner, body (the conversation object)
    P conv:{ID}:order    list of item ids, in conversation order
    P conv:{ID}:items    hash: item id -> the item's JSON

(the id in braces, a hash tag: a conversation's keys share one slot on a Redis Cluster).

Every write sets the retention (``--redis-retention-days``, smg's flag; -1 keeps records forever) on
all the keys of what it wrote, so a conversation lives as long as its last write. Operations that
read and then write (the owner check and the change) are Lua scripts: Redis runs each atomically.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import orjson
import redis
import trio

from ..base.options import Option
from .backends import HISTORY_BACKENDS, HistoryBackend
from .store import HistoryConfig, ItemPage, RecordTooLarge, StoredResponse, StoreUnavailable, check_record_size

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RedisConfig:
    url: str | None = None  # redis://[:password@]host[:port][/db], rediss:// for TLS
    pool_max_size: int = 16  # smg's default
    retention_days: float = 30.0  # smg's default; -1: no expiry
    key_prefix: str = "smg:"
    timeout_s: float = 5.0  # connecting, each command, and waiting for a free connection


# Sets the retention of every key of a conversation (KEYS[1..3]) after a write; 0: none.
_RETAIN = """
local ttl = tonumber({ttl})
for k = 1, #KEYS do
  if ttl > 0 then redis.call('PEXPIRE', KEYS[k], ttl) else redis.call('PERSIST', KEYS[k]) end
end
"""
# KEYS[1] the record's hash; ARGV: owner. Returns the body, or false.
_GET = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner ~= ARGV[1] then return false end
return redis.call('HGET', KEYS[1], 'body')
"""
# KEYS: the record's hash, then its other keys (a conversation's items). ARGV: owner. Deletes them all
# when the owner matches.
_DELETE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('DEL', unpack(KEYS))
return 1
"""
# KEYS: conversation hash, order, items. ARGV: owner, ttl ms, the record bound in bytes, then item id, item body
# pairs. Returns 0 (no such conversation), -1 (the conversation would pass the bound: nothing added) or 1. The
# conversation's hash keeps its size in 'bytes' (head and items), so the bound costs no pass over the items.
_ADD_ITEMS = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local added = 0
for i = 4, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[3], ARGV[i]) == 0 then added = added + string.len(ARGV[i + 1]) end
end
local held = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
if held + added > tonumber(ARGV[3]) then return -1 end
for i = 4, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 1]) == 1 then redis.call('RPUSH', KEYS[2], ARGV[i]) end
end
redis.call('HINCRBY', KEYS[1], 'bytes', added)
""" + _RETAIN.format(ttl="ARGV[2]") + """
return 1
"""
# KEYS: conversation hash, order, items. ARGV: owner, after ('' from the start), limit, descending (1/0).
# Returns false (no conversation) or {has_more, item, item, ...}.
_LIST = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return false end
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
local n, limit, descending = #ids, tonumber(ARGV[3]), ARGV[4] == '1'
local start = 1
if ARGV[2] ~= '' then
  for i = 1, n do
    local id = descending and ids[n - i + 1] or ids[i]
    if id == ARGV[2] then start = i + 1 break end
  end
end
local out = {0}
for i = start, math.min(n, start + limit - 1) do
  local id = descending and ids[n - i + 1] or ids[i]
  table.insert(out, redis.call('HGET', KEYS[3], id))
end
if start + limit - 1 < n then out[1] = 1 end
return out
"""
# KEYS: conversation hash, items. ARGV: owner, item id. Returns false (no conversation) or {found, item}.
_GET_ITEM = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return false end
local item = redis.call('HGET', KEYS[2], ARGV[2])
if item then return {1, item} end
return {0}
"""
# KEYS: conversation hash, order, items. ARGV: owner, item id, ttl ms. Returns false or {deleted, body}.
_DELETE_ITEM = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return false end
local size = redis.call('HSTRLEN', KEYS[3], ARGV[2])
local deleted = redis.call('HDEL', KEYS[3], ARGV[2])
if deleted == 1 then
  redis.call('LREM', KEYS[2], 1, ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'bytes', -size)
end
""" + _RETAIN.format(ttl="ARGV[3]") + """
return {deleted, redis.call('HGET', KEYS[1], 'body')}
"""
# KEYS: conversation hash, order, items. ARGV: owner, new body, ttl ms.
_UPDATE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return false end
redis.call('HSET', KEYS[1], 'body', ARGV[2])
""" + _RETAIN.format(ttl="ARGV[3]") + """
return ARGV[2]
"""


class RedisHistory:
    def __init__(self, config: RedisConfig, bounds: HistoryConfig = HistoryConfig()) -> None:
        if not config.url:
            raise ValueError("--redis-url is required with --history-backend redis")
        self.config = config
        self.record_bytes_max = bounds.record_bytes_max
        self._limiter = trio.CapacityLimiter(config.pool_max_size)
        pool = redis.BlockingConnectionPool.from_url(
            config.url, max_connections=config.pool_max_size, timeout=config.timeout_s,
            socket_timeout=config.timeout_s, socket_connect_timeout=config.timeout_s)
        self._redis = redis.Redis(connection_pool=pool)
        self._ttl_ms = int(config.retention_days * 86_400_000) if config.retention_days > 0 else 0
        self._get = self._redis.register_script(_GET)
        self._delete = self._redis.register_script(_DELETE)
        self._add_items = self._redis.register_script(_ADD_ITEMS)
        self._list = self._redis.register_script(_LIST)
        self._get_item = self._redis.register_script(_GET_ITEM)
        self._delete_item = self._redis.register_script(_DELETE_ITEM)
        self._update = self._redis.register_script(_UPDATE)

    def metric_families(self) -> Iterator[Any]:
        return iter(())  # the database's own monitoring says more than the pool here would

    async def open(self) -> None:
        await self._call(self._redis.ping)

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self._redis.close)

    async def _call(self, work: Callable[[], T]) -> T:
        try:
            return await trio.to_thread.run_sync(work, limiter=self._limiter)
        except redis.RedisError as e:  # connection refused, timeouts, a full pool, a script error
            raise StoreUnavailable(f"the history Redis did not answer: {e}") from None

    def _key(self, kind: str, record_id: str) -> str:
        # The id in braces: a hash tag, so a conversation's keys share a slot on a Redis Cluster.
        return f"{self.config.key_prefix}{kind}:{{{record_id}}}"

    def _conversation_keys(self, conversation_id: str) -> list[str]:
        base = self._key("conv", conversation_id)
        return [base, base + ":order", base + ":items"]

    def _put(self, key: str, owner: str, body: bytes) -> None:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"owner": owner, "body": body})
            if self._ttl_ms:
                pipe.pexpire(key, self._ttl_ms)
            pipe.execute()

    # -- responses --

    async def put_response(self, record: StoredResponse) -> None:
        body = orjson.dumps(record.to_json())
        check_record_size(len(body), self.record_bytes_max, "the response")
        await self._call(lambda: self._put(self._key("resp", record.id), record.owner, body))

    def put_response_at_once(self, record: StoredResponse) -> bool:
        return False  # a round trip to Redis

    async def get_response(self, response_id: str, owner: str) -> StoredResponse | None:
        body = await self._call(lambda: self._get(keys=[self._key("resp", response_id)], args=[owner]))
        return StoredResponse.from_json(response_id, owner, orjson.loads(body)) if body else None

    async def delete_response(self, response_id: str, owner: str) -> bool:
        key = self._key("resp", response_id)
        return bool(await self._call(lambda: self._delete(keys=[key], args=[owner])))

    # -- conversations --

    async def create_conversation(self, conversation: dict[str, Any], owner: str,
                                  items: "list[dict[str, Any]]") -> None:
        head, order, item_hash = self._conversation_keys(conversation["id"])
        body = orjson.dumps(conversation)
        encoded = {i["id"]: orjson.dumps(i) for i in items}
        size = len(body) + sum(len(v) for v in encoded.values())
        check_record_size(size, self.record_bytes_max, "the conversation")
        await self._call(lambda: self._create(head, order, item_hash, owner, body, encoded, size))

    def _create(self, head: str, order: str, item_hash: str, owner: str, body: bytes, items: dict[str, bytes],
                size: int) -> None:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(head, order, item_hash)
            pipe.hset(head, mapping={"owner": owner, "body": body, "bytes": size})
            if items:
                pipe.rpush(order, *items)
                pipe.hset(item_hash, mapping=items)
            if self._ttl_ms:
                for k in (head, order, item_hash):
                    pipe.pexpire(k, self._ttl_ms)
            pipe.execute()

    async def get_conversation(self, conversation_id: str, owner: str) -> dict[str, Any] | None:
        head = self._conversation_keys(conversation_id)[0]
        body = await self._call(lambda: self._get(keys=[head], args=[owner]))
        return orjson.loads(body) if body else None

    async def update_conversation(self, conversation_id: str, owner: str,
                                  metadata: dict[str, str]) -> dict[str, Any] | None:
        current = await self.get_conversation(conversation_id, owner)
        if current is None:
            return None
        current["metadata"] = metadata
        keys = self._conversation_keys(conversation_id)
        body = await self._call(lambda: self._update(keys=keys, args=[owner, orjson.dumps(current), self._ttl_ms]))
        return orjson.loads(body) if body else None

    async def delete_conversation(self, conversation_id: str, owner: str) -> bool:
        keys = self._conversation_keys(conversation_id)
        return bool(await self._call(lambda: self._delete(keys=keys, args=[owner])))

    async def add_items(self, conversation_id: str, owner: str, items: "list[dict[str, Any]]") -> bool:
        keys = self._conversation_keys(conversation_id)
        args: list[Any] = [owner, self._ttl_ms, self.record_bytes_max]
        for item in items:
            args += [item["id"], orjson.dumps(item)]
        added = await self._call(lambda: self._add_items(keys=keys, args=args))
        if added == -1:
            raise RecordTooLarge(f"the conversation would take more than {self.record_bytes_max} bytes; one stored "
                                 "record may take at most that")
        return bool(added)

    async def list_items(self, conversation_id: str, owner: str, after: str | None, limit: int,
                         descending: bool) -> ItemPage | None:
        keys = self._conversation_keys(conversation_id)
        out = await self._call(lambda: self._list(keys=keys, args=[owner, after or "", limit, int(descending)]))
        if not out:
            return None
        return ItemPage([orjson.loads(i) for i in out[1:]], bool(out[0]))

    async def all_items(self, conversation_id: str, owner: str) -> "list[dict[str, Any]] | None":
        page = await self.list_items(conversation_id, owner, None, 1 << 30, False)
        return page.items if page is not None else None

    async def get_item(self, conversation_id: str, owner: str, item_id: str
                       ) -> "tuple[bool, dict[str, Any] | None]":
        head, _, item_hash = self._conversation_keys(conversation_id)
        out = await self._call(lambda: self._get_item(keys=[head, item_hash], args=[owner, item_id]))
        if not out:
            return False, None
        return True, (orjson.loads(out[1]) if out[0] else None)

    async def delete_item(self, conversation_id: str, owner: str, item_id: str
                          ) -> "tuple[dict[str, Any] | None, bool]":
        keys = self._conversation_keys(conversation_id)
        out = await self._call(lambda: self._delete_item(keys=keys, args=[owner, item_id, self._ttl_ms]))
        if not out:
            return None, False
        return orjson.loads(out[1]), bool(out[0])


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--redis-url", "redis.url", str, "redis://[:password@]host:port/db, rediss:// for TLS (or "
           "SMG_NODE_REDIS_URL)", "history", secret=True),
    Option("--redis-pool-max-size", "redis.pool_max_size", int, "connections to Redis", "history"),
    Option("--redis-retention-days", "redis.retention_days", float, "how long Redis keeps a record after its last "
           "write; -1: forever", "history"),
    Option("--redis-key-prefix", "redis.key_prefix", str, "prefix of every key written to Redis", "history"),
)


def _check(config: RedisConfig) -> str | None:
    if not config.url:
        return "--history-backend redis needs --redis-url (or SMG_NODE_REDIS_URL)"
    if config.pool_max_size < 1 or config.retention_days == 0:
        return "--redis-pool-max-size must be positive and --redis-retention-days not 0"
    return None


async def _start(config: RedisConfig, history: HistoryConfig, cluster: Any, nursery: trio.Nursery) -> RedisHistory:
    store = RedisHistory(config, history)
    await store.open()  # a server that cannot be reached stops the start, with its reason
    return store


HISTORY_BACKENDS.add("redis", HistoryBackend(_start, "redis", RedisConfig(), OPTIONS, _check, shared=True),
                     "Redis: under a key prefix, each record kept for a retention time after its last write")

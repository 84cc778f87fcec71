"""The Postgres backend: durable stored responses and conversations, for those who run a database.

psycopg 3 with psycopg-pool: the reference Postgres driver for Python and its pool. Both are
synchronous here, called from worker threads (``trio.to_thread``) through a ``CapacityLimiter`` of the
pool's size, so a slow or unreachable database never blocks the event loop and never holds more
threads than connections. Every statement has a timeout (``statement_timeout``), and taking a
connection from the pool one too (``pool_timeout_s``): a database that does not answer is a 504
(``StoreUnavailable``) after those bounds, not a hung request.

The schema is versioned: ``MIGRATIONS`` run at start, in order, each once, in one transaction under
an advisory lock (nodes starting together do not race), recorded in the migrations table. Table and
column names are configurable (``PostgresNames``: an existing database's conventions, or several
deployments in one schema); they are checked as plain identifiers and always quoted.

Layout: responses (id, owner, body: the stored response's JSON), conversations (id, owner, body: the
conversation object), conversation items (conversation id, item id, position from a sequence for
their order, body), items deleted with their conversation. Rows are scoped by owner in every query.
Retention: none (a durable store; delete through the API or by the operator's own policy).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import orjson
import psycopg
import psycopg_pool
import trio
from psycopg import sql

from ..base.options import Option
from .backends import HISTORY_BACKENDS, HistoryBackend
from .store import HistoryConfig, ItemPage, StoredResponse, StoreUnavailable, check_record_size

T = TypeVar("T")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_ADVISORY_LOCK_ID = 0x736D67_68697374  # "smg" "hist": one migration at a time across nodes


@dataclasses.dataclass(frozen=True)
class PostgresNames:
    responses: str = "smg_responses"
    conversations: str = "smg_conversations"
    items: str = "smg_conversation_items"
    migrations: str = "smg_schema_migrations"
    id: str = "id"
    owner: str = "owner"
    body: str = "body"
    created_at: str = "created_at"
    conversation_id: str = "conversation_id"
    item_id: str = "item_id"
    position: str = "position"

    def problem(self) -> str | None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not _IDENTIFIER.match(value):
                return f"{field.name}={value!r} is not a plain SQL identifier (letters, digits, _; up to 63)"
        return None

    def with_overrides(self, pairs: "list[str]") -> "PostgresNames":
        """From ``name=value`` pairs (``--postgres-names``); ValueError for an unknown name."""
        known = {f.name for f in dataclasses.fields(self)}
        changes = {}
        for pair in pairs:
            name, _, value = pair.partition("=")
            if name not in known or not value:
                raise ValueError(f"{pair!r}: expected NAME=VALUE with NAME one of {', '.join(sorted(known))}")
            changes[name] = value
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class PostgresConfig:
    url: str | None = None  # postgres://user:password@host:port/database?sslmode=...
    pool_max_size: int = 16  # smg's default
    pool_timeout_s: float = 5.0  # waiting for a free connection
    statement_timeout_s: float = 5.0
    names: PostgresNames = PostgresNames()


def _migrations(n: PostgresNames) -> "list[sql.Composed]":
    """The schema, one version per entry: append, never edit a released one."""
    q = sql.Identifier
    return [
        sql.SQL(
            "CREATE TABLE {responses} ({id} TEXT PRIMARY KEY, {owner} TEXT NOT NULL, {body} JSONB NOT NULL, "
            "{created_at} TIMESTAMPTZ NOT NULL DEFAULT now());"
            "CREATE TABLE {conversations} ({id} TEXT PRIMARY KEY, {owner} TEXT NOT NULL, {body} JSONB NOT NULL, "
            "{created_at} TIMESTAMPTZ NOT NULL DEFAULT now());"
            "CREATE TABLE {items} ({conversation_id} TEXT NOT NULL REFERENCES {conversations} ({id}) "
            "ON DELETE CASCADE, {item_id} TEXT NOT NULL, {position} BIGSERIAL NOT NULL, {body} JSONB NOT NULL, "
            "PRIMARY KEY ({conversation_id}, {item_id}));"
            "CREATE INDEX {items_order} ON {items} ({conversation_id}, {position});"
        ).format(responses=q(n.responses), conversations=q(n.conversations), items=q(n.items), id=q(n.id),
                 owner=q(n.owner), body=q(n.body), created_at=q(n.created_at), conversation_id=q(n.conversation_id),
                 item_id=q(n.item_id), position=q(n.position), items_order=q(f"{n.items}_order")),
    ]


class PostgresHistory:
    def __init__(self, config: PostgresConfig, bounds: HistoryConfig = HistoryConfig()) -> None:
        if not config.url:
            raise ValueError("--postgres-db-url is required with --history-backend postgres")
        self.config = config
        self.record_bytes_max = bounds.record_bytes_max
        self.names = config.names
        self._limiter = trio.CapacityLimiter(config.pool_max_size)
        timeout_ms = int(config.statement_timeout_s * 1000)
        self._pool = psycopg_pool.ConnectionPool(
            config.url, min_size=1, max_size=config.pool_max_size, timeout=config.pool_timeout_s, open=False,
            kwargs={"options": f"-c statement_timeout={timeout_ms}", "autocommit": False})
        self._q = _Queries(config.names)

    def metric_families(self) -> Iterator[Any]:
        return iter(())  # the database's own monitoring says more than the pool here would

    async def open(self) -> None:
        """Connects and brings the schema up to date; StoreUnavailable when the database cannot be reached."""
        def start() -> None:
            self._pool.open(wait=True, timeout=self.config.pool_timeout_s)
            self._migrate()
        await self._call(start)

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self._pool.close)

    def _migrate(self) -> None:
        n, q = self.names, sql.Identifier
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_LOCK_ID,))
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (version INTEGER PRIMARY KEY, "
                                 "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())").format(q(n.migrations)))
            applied = {row[0] for row in conn.execute(sql.SQL("SELECT version FROM {}").format(q(n.migrations)))}
            for version, statement in enumerate(_migrations(n), start=1):
                if version in applied:
                    continue
                conn.execute(statement)
                conn.execute(sql.SQL("INSERT INTO {} (version) VALUES (%s)").format(q(n.migrations)), (version,))

    async def schema_version(self) -> int:
        def read() -> int:
            with self._pool.connection() as conn:
                return conn.execute(sql.SQL("SELECT max(version) FROM {}").format(
                    sql.Identifier(self.names.migrations))).fetchone()[0] or 0
        return await self._call(read)

    async def _call(self, work: Callable[[], T]) -> T:
        try:
            return await trio.to_thread.run_sync(work, limiter=self._limiter)
        except (psycopg.OperationalError, psycopg.errors.QueryCanceled, psycopg_pool.PoolTimeout,
                psycopg_pool.PoolClosed) as e:
            raise StoreUnavailable(f"the history database did not answer: {e}") from None

    def _in_transaction(self, work: Callable[[psycopg.Connection], T]) -> Callable[[], T]:
        def run() -> T:
            with self._pool.connection() as conn, conn.transaction():
                return work(conn)
        return run

    async def _run(self, work: Callable[[psycopg.Connection], T]) -> T:
        return await self._call(self._in_transaction(work))

    # -- responses --

    async def put_response(self, record: StoredResponse) -> None:
        body = orjson.dumps(record.to_json()).decode()
        check_record_size(len(body), self.record_bytes_max, "the response")
        await self._run(lambda c: c.execute(self._q.put_response, (record.id, record.owner, body)))

    def put_response_at_once(self, record: StoredResponse) -> bool:
        return False  # a database round trip

    async def get_response(self, response_id: str, owner: str) -> StoredResponse | None:
        row = await self._run(lambda c: c.execute(self._q.get_response, (response_id, owner)).fetchone())
        return StoredResponse.from_json(response_id, owner, row[0]) if row is not None else None

    async def delete_response(self, response_id: str, owner: str) -> bool:
        return await self._run(lambda c: c.execute(self._q.delete_response, (response_id, owner)).fetchone()
                               is not None)

    # -- conversations --

    async def create_conversation(self, conversation: dict[str, Any], owner: str,
                                  items: "list[dict[str, Any]]") -> None:
        head = orjson.dumps(conversation).decode()
        rows = self._item_rows(conversation["id"], items)
        check_record_size(len(head) + sum(len(row[2]) for row in rows), self.record_bytes_max, "the conversation")

        def work(c: psycopg.Connection) -> None:
            c.execute(self._q.create_conversation, (conversation["id"], owner, head))
            self._insert_items(c, rows)
        await self._run(work)

    @staticmethod
    def _item_rows(conversation_id: str, items: "list[dict[str, Any]]") -> list[tuple[str, str, str]]:
        return [(conversation_id, i["id"], orjson.dumps(i).decode()) for i in items]

    def _insert_items(self, c: psycopg.Connection, rows: list[tuple[str, str, str]]) -> None:
        if rows:
            with c.cursor() as cursor:
                cursor.executemany(self._q.insert_item, rows)

    async def get_conversation(self, conversation_id: str, owner: str) -> dict[str, Any] | None:
        row = await self._run(lambda c: c.execute(self._q.get_conversation, (conversation_id, owner)).fetchone())
        return row[0] if row is not None else None

    async def update_conversation(self, conversation_id: str, owner: str,
                                  metadata: dict[str, str]) -> dict[str, Any] | None:
        row = await self._run(lambda c: c.execute(self._q.update_conversation, (
            orjson.dumps(metadata).decode(), conversation_id, owner)).fetchone())
        return row[0] if row is not None else None

    async def delete_conversation(self, conversation_id: str, owner: str) -> bool:
        return await self._run(lambda c: c.execute(self._q.delete_conversation, (conversation_id, owner)).fetchone()
                               is not None)

    def _lock_conversation(self, c: psycopg.Connection, conversation_id: str, owner: str) -> dict[str, Any] | None:
        row = c.execute(self._q.lock_conversation, (conversation_id, owner)).fetchone()
        return row[0] if row is not None else None

    async def add_items(self, conversation_id: str, owner: str, items: "list[dict[str, Any]]") -> bool:
        rows = self._item_rows(conversation_id, items)

        def work(c: psycopg.Connection) -> bool:
            conversation = self._lock_conversation(c, conversation_id, owner)  # held to the end: items stay in order
            if conversation is None:
                return False
            held = c.execute(self._q.items_bytes, (conversation_id,)).fetchone()[0]
            check_record_size(len(orjson.dumps(conversation)) + held + sum(len(row[2]) for row in rows),
                              self.record_bytes_max, "the conversation")  # raised: the transaction rolls back
            self._insert_items(c, rows)
            return True
        return await self._run(work)

    async def list_items(self, conversation_id: str, owner: str, after: str | None, limit: int,
                         descending: bool) -> ItemPage | None:
        def work(c: psycopg.Connection) -> ItemPage | None:
            if c.execute(self._q.get_conversation, (conversation_id, owner)).fetchone() is None:
                return None
            query = self._q.list_desc if descending else self._q.list_asc
            rows = c.execute(query, (conversation_id, conversation_id, after or "", limit + 1)).fetchall()
            return ItemPage([r[0] for r in rows[:limit]], len(rows) > limit)
        return await self._run(work)

    async def all_items(self, conversation_id: str, owner: str) -> "list[dict[str, Any]] | None":
        def work(c: psycopg.Connection) -> "list[dict[str, Any]] | None":
            if c.execute(self._q.get_conversation, (conversation_id, owner)).fetchone() is None:
                return None
            return [r[0] for r in c.execute(self._q.all_items, (conversation_id,)).fetchall()]
        return await self._run(work)

    async def get_item(self, conversation_id: str, owner: str, item_id: str
                       ) -> "tuple[bool, dict[str, Any] | None]":
        def work(c: psycopg.Connection) -> "tuple[bool, dict[str, Any] | None]":
            if c.execute(self._q.get_conversation, (conversation_id, owner)).fetchone() is None:
                return False, None
            row = c.execute(self._q.get_item, (conversation_id, item_id)).fetchone()
            return True, (row[0] if row is not None else None)
        return await self._run(work)

    async def delete_item(self, conversation_id: str, owner: str, item_id: str
                          ) -> "tuple[dict[str, Any] | None, bool]":
        def work(c: psycopg.Connection) -> "tuple[dict[str, Any] | None, bool]":
            conversation = self._lock_conversation(c, conversation_id, owner)
            if conversation is None:
                return None, False
            return conversation, c.execute(self._q.delete_item, (conversation_id, item_id)).fetchone() is not None
        return await self._run(work)


class _Queries:
    """Every statement, composed once with the configured names."""

    def __init__(self, n: PostgresNames) -> None:
        f = dict(responses=sql.Identifier(n.responses), conversations=sql.Identifier(n.conversations),
                 items=sql.Identifier(n.items), id=sql.Identifier(n.id), owner=sql.Identifier(n.owner),
                 body=sql.Identifier(n.body), conversation_id=sql.Identifier(n.conversation_id),
                 item_id=sql.Identifier(n.item_id), position=sql.Identifier(n.position))

        def q(text: str) -> sql.Composed:
            return sql.SQL(text).format(**f)

        self.put_response = q("INSERT INTO {responses} ({id}, {owner}, {body}) VALUES (%s, %s, %s::jsonb) "
                              "ON CONFLICT ({id}) DO UPDATE SET {body} = EXCLUDED.{body} "
                              "WHERE {responses}.{owner} = EXCLUDED.{owner}")
        self.get_response = q("SELECT {body} FROM {responses} WHERE {id} = %s AND {owner} = %s")
        self.delete_response = q("DELETE FROM {responses} WHERE {id} = %s AND {owner} = %s RETURNING 1")
        self.create_conversation = q("INSERT INTO {conversations} ({id}, {owner}, {body}) VALUES (%s, %s, %s::jsonb)")
        self.get_conversation = q("SELECT {body} FROM {conversations} WHERE {id} = %s AND {owner} = %s")
        self.lock_conversation = q("SELECT {body} FROM {conversations} WHERE {id} = %s AND {owner} = %s FOR UPDATE")
        self.update_conversation = q("UPDATE {conversations} SET {body} = jsonb_set({body}, '{{metadata}}', "
                                     "%s::jsonb) WHERE {id} = %s AND {owner} = %s RETURNING {body}")
        self.delete_conversation = q("DELETE FROM {conversations} WHERE {id} = %s AND {owner} = %s RETURNING 1")
        self.insert_item = q("INSERT INTO {items} ({conversation_id}, {item_id}, {body}) VALUES (%s, %s, %s::jsonb)")
        # After the item ``after`` ('' or an unknown id: from the start), in position order.
        after = ("(SELECT {position} FROM {items} WHERE {conversation_id} = %s AND {item_id} = %s)")
        self.list_asc = q("SELECT {body} FROM {items} WHERE {conversation_id} = %s AND {position} > "
                          f"COALESCE({after}, -1) ORDER BY {{position}} ASC LIMIT %s")
        self.list_desc = q("SELECT {body} FROM {items} WHERE {conversation_id} = %s AND {position} < "
                           f"COALESCE({after}, 9223372036854775807) ORDER BY {{position}} DESC LIMIT %s")
        self.all_items = q("SELECT {body} FROM {items} WHERE {conversation_id} = %s ORDER BY {position}")
        self.get_item = q("SELECT {body} FROM {items} WHERE {conversation_id} = %s AND {item_id} = %s")
        self.delete_item = q("DELETE FROM {items} WHERE {conversation_id} = %s AND {item_id} = %s RETURNING 1")
        # A conversation's items, in bytes of their JSON (the record bound counts them with the head).
        self.items_bytes = q("SELECT COALESCE(SUM(octet_length({body}::text)), 0) FROM {items} "
                             "WHERE {conversation_id} = %s")


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--postgres-db-url", "postgres.url", str, "postgres://user:password@host:port/db?sslmode=... (or "
           "SMG_NODE_POSTGRES_DB_URL, kept out of the process list)", "history", secret=True),
    Option("--postgres-pool-max-size", "postgres.pool_max_size", int, "connections to PostgreSQL", "history"),
    Option("--postgres-names", "postgres.names", "list", "table and column names, NAME=VALUE (responses, "
           "conversations, items, migrations, id, owner, body, created_at, conversation_id, item_id, position)",
           "history", then=PostgresNames().with_overrides),
)


def _check(config: PostgresConfig) -> str | None:
    if not config.url:
        return "--history-backend postgres needs --postgres-db-url (or SMG_NODE_POSTGRES_DB_URL)"
    problem = config.names.problem()
    if problem is not None:
        return f"--postgres-names: {problem}"
    if config.pool_max_size < 1:
        return "--postgres-pool-max-size must be positive"
    return None


async def _start(config: PostgresConfig, history: HistoryConfig, cluster: Any, nursery: trio.Nursery
                 ) -> PostgresHistory:
    store = PostgresHistory(config, history)
    await store.open()  # a database that cannot be reached stops the start, with its reason
    return store


HISTORY_BACKENDS.add("postgres", HistoryBackend(_start, "postgres", PostgresConfig(), OPTIONS, _check, shared=True),
                     "PostgreSQL: durable, migrated at start, table and column names configurable")

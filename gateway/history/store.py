"""What every history backend offers the APIs: stored responses and conversations, scoped to an owner.

The Responses API stores a response (``store: true``) so that ``previous_response_id``, ``GET`` and
``input_items`` find it; ``/v1/conversations`` keeps a conversation's object and its ordered items.
Three backends implement ``HistoryStore``: the memory one replicated over the mesh (``memory.py``),
Postgres (``postgres.py``) and Redis (``redis.py``); ``--history-backend none`` has no store at all.

Scoping: every record carries its owner (the tenant, else the key, else "anonymous" on an open data
plane). Another owner is told the record does not exist, exactly as for an id never stored, so ids
leak nothing.

What the methods return: None (or False) for "no such record for this owner"; they raise
``StoreUnavailable`` (504) when the backend cannot answer (peers, database or Redis unreachable),
``RecordTooLarge`` (413) when a response or a conversation would pass its size bound, and
``StorageQuotaExceeded`` (429) when the owner holds as much as it may.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import orjson

from ..base.errors import QuotaExceeded, TimedOut, TooLarge
from ..base.options import Option

# The owner of every request on an open data plane (no key or token required: gateway/auth's ANONYMOUS). Nobody
# there can be told apart, so nobody's share is protected from anybody's: the per-tenant bounds do not apply to
# it, only the node's own, which evict its least recently used records (a single user's gateway keeps its last
# 10,000 responses rather than refusing every stored write past 2,500).
OPEN_DATA_PLANE_OWNER = "anonymous"
ID_CHARS_MAX = 128  # response, conversation and item ids: ours are ~30 characters
OWNER_CHARS_MAX = 256
ITEMS_PER_ADD_MAX = 20  # OpenAI's bound for one "create items" call
LIST_LIMIT_MAX = 100  # a page of items, as OpenAI's list endpoints
# The largest a record may be configured to: a whole shard, with the frame around it, within one 8 MiB
# mesh frame.
RECORD_BYTES_MAX = 6 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class HistoryConfig:
    # Per node: smg's memory backend is bounded per process as well. Each stored response and
    # conversation is held by three nodes (owner and two replicas), so a cluster of N nodes keeps
    # about N / 3 times these.
    max_responses: int = 10_000
    max_items: int = 100_000  # conversation items, all conversations together
    max_bytes: int = 256 * 1024 * 1024
    retention_s: float = 7 * 24 * 3600.0  # a week after the last write: long enough for agent sessions
    # One record: a stored response (its object, input items and the context it keeps), or a conversation
    # (its object and items). So that it travels in one mesh frame (8 MiB) and one client cannot fill a
    # node with a single record. A write that would pass it is refused (413) before anything is stored.
    record_bytes_max: int = 4 * 1024 * 1024
    # What one owner (a tenant, else a key) may hold on a node: a quarter of each node bound by default
    # (None), so that no tenant can take more than a quarter of a node's store, and four tenants at their
    # quota fill it. A write past its owner's quota is refused (429 storage_quota_exceeded) before it is
    # made; when the node's own bounds force an eviction, the owner holding the most goes first, so a
    # tenant within its share never loses data to make room for another. Per node, as the bounds above:
    # with N nodes an owner holds up to about N / 3 times these across the cluster.
    tenant_max_bytes: int | None = None
    tenant_max_responses: int | None = None
    tenant_max_conversations: int | None = None
    tenant_max_items: int | None = None
    # The node's data directory, set by the node (not a flag of this section: --data-dir): the memory backend keeps
    # its shards there (journal.py). None: in memory only. data_fsync: fsync every record (--data-fsync).
    data_dir: Path | None = None
    data_fsync: bool = False

    @property
    def tenant_bounds(self) -> "TenantBounds":
        quarter = lambda value, node_bound: value if value is not None else max(1, node_bound // 4)  # noqa: E731
        return TenantBounds(quarter(self.tenant_max_bytes, self.max_bytes),
                            quarter(self.tenant_max_responses, self.max_responses),
                            quarter(self.tenant_max_conversations, self.max_responses),
                            quarter(self.tenant_max_items, self.max_items))


@dataclasses.dataclass(frozen=True)
class TenantBounds:
    """What one owner may hold on a node (``HistoryConfig.tenant_bounds``)."""

    bytes: int
    responses: int
    conversations: int
    items: int

    def scaled(self, factor: float) -> "TenantBounds":
        return TenantBounds(int(self.bytes * factor), int(self.responses * factor), int(self.conversations * factor),
                            int(self.items * factor))


# Responses a chain of previous_response_id may hold: each stored response names its ancestors (ids only),
# so a follow-up reads them all at once rather than one after the other.
CHAIN_LENGTH_MAX = 1000


def stored_json(value: object) -> bytes:
    """``value`` as JSON bytes of exactly their length, for keeping. orjson (3.x) returns bytes whose
    allocation is about ten times their length (its worst case for escapes: 519 KB behind a 45 KB item,
    4 KB behind 18 bytes), which a short-lived answer never notices and a store holding thousands of them
    pays in full: a memory store counting 256 MiB held 1.1 GiB. The copy costs a memcpy."""
    return bytes(memoryview(orjson.dumps(value)))


# Not frozen, as no dataclass made for every request is (gateway/serving/generation.py): a frozen one's __init__ sets each
# field through object.__setattr__, ~1 k instructions a field. Nothing changes a record once made
# (dataclasses.replace makes another).
@dataclasses.dataclass(slots=True)
class StoredResponse:
    """A stored response and what a follow-up (``previous_response_id``) needs of it.

    The context a follow-up's model sees is the chain's, stored once: the first response's ``history`` (the
    conversation's items before it, when it was made in one), then each response of the chain's own turn
    (its input items and its output), oldest first. ``chain`` names the ancestors, oldest first; this
    response's turn is its own. A record stored before chains existed (``chain`` None) keeps its whole
    context in ``history``, its own turn included."""

    id: str
    owner: str
    response: dict[str, Any]  # the response object, as GET returns it
    input_items: tuple[dict[str, Any], ...]  # the request's input items, with ids (input_items endpoint)
    history: tuple[dict[str, Any], ...]  # what the chain's model saw before its first turn (see above)
    # A background response still queued or in progress after this (wall clock) was abandoned: the node
    # generating it stopped. Its own bounds (queue wait, request timeout) end it before then otherwise.
    unfinished_until_s: float | None = None
    chain: tuple[str, ...] | None = ()  # the ancestors' ids, oldest first; None: a record of the old layout
    # A background response created with stream: true: its stream's events as (sequence number, SSE frame),
    # so that any node can replay them (GET /v1/responses/{id}?stream=true). None: there is no stream to replay.
    events: tuple[tuple[int, str], ...] | None = None
    # ``response`` as JSON when the writer has it already (the bytes its client is sent): written as they are,
    # not encoded a second time. Never read back (from_json leaves it None).
    response_json: bytes | None = dataclasses.field(default=None, compare=False, repr=False)

    def turn(self) -> list[dict[str, Any]]:
        """This response's own turn, as a follow-up's context holds it: its input, then its output."""
        if self.chain is None:
            return list(self.history)  # the old layout: the whole context, this turn included
        return [*self.input_items, *(self.response.get("output") or ())]

    def to_json(self) -> dict[str, Any]:
        return {"response": self.response if self.response_json is None else orjson.Fragment(self.response_json),
                **self._record_fields()}

    def to_bytes(self) -> bytes:
        """``to_json`` as JSON bytes of exactly their length, as a memory store keeps them (``stored_json``
        says why). With ``response_json`` the record's other fields are encoded and joined around it: no copy
        of the whole after encoding, and no dict made to hold a fragment (~0.4 us of each stored response)."""
        if self.response_json is None:
            return stored_json(self.to_json())
        fields = orjson.dumps(self._record_fields())  # {"input_items":...}: joined after the response
        return b"".join((b'{"response":', self.response_json, b",", memoryview(fields)[1:]))

    def _record_fields(self) -> dict[str, Any]:
        data: dict[str, Any] = {"input_items": self.input_items, "history": self.history}
        if self.unfinished_until_s is not None:
            data["unfinished_until_s"] = self.unfinished_until_s
        if self.chain is not None:
            data["chain"] = self.chain
        if self.events is not None:
            data["events"] = self.events
        return data

    @classmethod
    def from_json(cls, response_id: str, owner: str, data: dict[str, Any]) -> "StoredResponse":
        chain, events = data.get("chain"), data.get("events")
        return cls(response_id, owner, data["response"], tuple(data["input_items"]), tuple(data["history"]),
                   data.get("unfinished_until_s"), tuple(chain) if chain is not None else None,
                   tuple((sequence, frame) for sequence, frame in events) if events is not None else None)


@dataclasses.dataclass(frozen=True, slots=True)
class ItemPage:
    items: list[dict[str, Any]]
    has_more: bool


class StoreUnavailable(TimedOut):
    """The backend did not answer (peers, database, Redis): the request fails with 504 history_unavailable,
    not 503: a balancer that counts 503s as a failed node (nginx's max_fails with http_503) would take
    healthy nodes out, every one of them during a partition. Nothing acknowledged is lost."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="history_unavailable", retry_after_s=1)


class RecordTooLarge(TooLarge):
    """One response or conversation over its size bound (413): storing it would take more than any one
    record may."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="record_too_large")


class StorageQuotaExceeded(QuotaExceeded):
    """The owner holds as much as it may on the node that would store this (429 storage_quota_exceeded):
    delete stored responses or conversations, or wait for retention to end them."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="storage_quota_exceeded")


def check_record_size(size_bytes: int, bound_bytes: int, what: str) -> None:
    if size_bytes > bound_bytes:
        raise RecordTooLarge(f"{what} would take {size_bytes} bytes; one stored record may take at most "
                             f"{bound_bytes}")


class HistoryStore(Protocol):
    def metric_families(self) -> "Iterator[Any]": ...  # its own figures, for /metrics (none for a durable one)

    async def put_response(self, record: StoredResponse) -> None: ...
    def put_response_at_once(self, record: StoredResponse) -> bool:
        """Stores ``record`` here and now when that takes no waiting (the memory store of a node with no mesh):
        as ``put_response``, raising what it raises, without a checkpoint. False, having done nothing, for
        every other store: await ``put_response``."""
    async def get_response(self, response_id: str, owner: str) -> StoredResponse | None: ...
    async def delete_response(self, response_id: str, owner: str) -> bool: ...

    async def create_conversation(self, conversation: dict[str, Any], owner: str,
                                  items: "list[dict[str, Any]]") -> None: ...
    async def get_conversation(self, conversation_id: str, owner: str) -> dict[str, Any] | None: ...
    async def update_conversation(self, conversation_id: str, owner: str,
                                  metadata: dict[str, str]) -> dict[str, Any] | None: ...
    async def delete_conversation(self, conversation_id: str, owner: str) -> bool: ...

    async def add_items(self, conversation_id: str, owner: str, items: "list[dict[str, Any]]") -> bool:
        """Appends ``items`` (each with its own id); False when there is no such conversation."""
    async def list_items(self, conversation_id: str, owner: str, after: str | None, limit: int,
                         descending: bool) -> ItemPage | None:
        """A page of items after the item ``after`` (exclusive) in the order asked; None: no conversation."""
    async def get_item(self, conversation_id: str, owner: str, item_id: str
                       ) -> "tuple[bool, dict[str, Any] | None]":
        """(the conversation exists, the item or None)."""
    async def delete_item(self, conversation_id: str, owner: str, item_id: str
                          ) -> "tuple[dict[str, Any] | None, bool]":
        """(the conversation object or None, whether the item was there and is now gone)."""

    async def all_items(self, conversation_id: str, owner: str) -> "list[dict[str, Any]] | None":
        """Every item in order, for the model's prompt; None: no conversation."""


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--history-memory-max-responses", "history.max_responses", int, "stored responses kept in memory per "
           "node (least recently used out first)", "history"),
    Option("--history-memory-max-items", "history.max_items", int, "conversation items kept in memory per node",
           "history"),
    Option("--history-memory-retention-secs", "history.retention_s", float, "how long a stored response or "
           "conversation is kept after its last write", "history"),
    Option("--history-memory-max-bytes", "history.max_bytes", int, "bytes of stored responses and conversations "
           "kept in memory per node (default 256 MiB)", "history"),
    Option("--history-tenant-max-bytes", "history.tenant_max_bytes", int, "bytes one tenant (else key) may hold per "
           "node in the memory store, beyond which its writes get 429 (default: a quarter of the node's)", "history"),
    Option("--history-tenant-max-responses", "history.tenant_max_responses", int, "stored responses one tenant may "
           "hold per node (default: a quarter of --history-memory-max-responses)", "history"),
    Option("--history-tenant-max-conversations", "history.tenant_max_conversations", int, "conversations one tenant "
           "may hold per node (default: a quarter of --history-memory-max-responses)", "history"),
    Option("--history-tenant-max-items", "history.tenant_max_items", int, "conversation items one tenant may hold "
           "per node (default: a quarter of --history-memory-max-items)", "history"),
    Option("--history-record-max-bytes", "history.record_bytes_max", int, "largest stored response, and largest "
           "conversation with its items, in bytes (default 4 MiB, at most 6 MiB): larger ones get 413", "history"),
)

"""What every history backend offers the APIs: stored responses and conversations, scoped to an owner.

The Responses API stores a response (``store: true``) so that ``previous_response_id``, ``GET`` and
``input_items`` find it; ``/v1/conversations`` keeps a conversation's object and its ordered items.
Three backends implement ``HistoryStore``: the memory one replicated over the mesh (``memory.py``),
Postgres (``postgres.py``) and Redis (``redis.py``); ``--history-backend none`` has no store at all.

Scoping: every record carries its owner (the tenant, else the key, else "anonymous" on an open data
plane). Another owner is told the record does not exist, exactly as for an id never stored, so ids
leak nothing.

What the methods return: None (or False) for "no such record for this owner"; they raise
``StoreUnavailable`` (504) when the backend cannot answer (peers, database or Redis unreachable) and
``ConversationFull`` when an addition would pass a conversation's bound.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from ..errors import InvalidInput, TimedOut

ID_CHARS_MAX = 128  # response, conversation and item ids: ours are ~30 characters
OWNER_CHARS_MAX = 256
ITEMS_PER_ADD_MAX = 20  # OpenAI's bound for one "create items" call
LIST_LIMIT_MAX = 100  # a page of items, as OpenAI's list endpoints


@dataclasses.dataclass(frozen=True)
class HistoryConfig:
    # Per node: smg's memory backend is bounded per process as well. Each stored response and
    # conversation is held by three nodes (owner and two replicas), so a cluster of N nodes keeps
    # about N / 3 times these.
    max_responses: int = 10_000
    max_items: int = 100_000  # conversation items, all conversations together
    max_bytes: int = 256 * 1024 * 1024
    retention_s: float = 7 * 24 * 3600.0  # a week after the last write: long enough for agent sessions
    # One conversation (its object and items): a bound so that it travels in one mesh frame (8 MiB)
    # and one client cannot fill a node with a single conversation.
    conversation_bytes_max: int = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    owner: str
    response: dict[str, Any]  # the response object, as GET returns it
    input_items: tuple[dict[str, Any], ...]  # the request's input items, with ids (input_items endpoint)
    history: tuple[dict[str, Any], ...]  # what a follow-up's model sees before its own input
    # A background response still queued or in progress after this (wall clock) was abandoned: the node
    # generating it stopped. Its own bounds (queue wait, request timeout) end it before then otherwise.
    unfinished_until_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = {"response": self.response, "input_items": self.input_items, "history": self.history}
        if self.unfinished_until_s is not None:
            data["unfinished_until_s"] = self.unfinished_until_s
        return data

    @classmethod
    def from_json(cls, response_id: str, owner: str, data: dict[str, Any]) -> "StoredResponse":
        return cls(response_id, owner, data["response"], tuple(data["input_items"]), tuple(data["history"]),
                   data.get("unfinished_until_s"))


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


class ConversationFull(InvalidInput):
    def __init__(self, message: str) -> None:
        super().__init__(message, code="conversation_full")


class HistoryStore(Protocol):
    async def put_response(self, record: StoredResponse) -> None: ...
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

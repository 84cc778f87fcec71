"""The history operations on one node's shards, as the node that executes them (a shard's primary) runs
them: pure, no I/O. Each writing operation returns its result and the ``Change`` for the replicas
(None when nothing changed); reading operations return their result only.

Values are JSON bytes as stored (``head``: the stored response or the conversation object; items);
the backend around this (``memory.py``) encodes and decodes them. ``OPERATIONS`` is the table a
peer's request is checked against: the operation's argument types, and whether it writes.
"""

from __future__ import annotations

import orjson

from .shards import CONVERSATION, RESPONSE, SHARD_OVERHEAD_BYTES, Change, MemoryShards, shard_size
from .store import stored_json

Items = list[tuple[str, bytes]]


class HistoryOps:
    def __init__(self, shards: MemoryShards) -> None:
        self.shards = shards

    # -- responses --

    def put_response(self, response_id: str, owner: str, head: bytes, now_s: float) -> tuple[None, Change]:
        return None, self.shards.create(response_id, RESPONSE, owner, head, [], now_s).whole()

    def get_response(self, response_id: str, owner: str, now_s: float) -> bytes | None:
        shard = self.shards.find(response_id, RESPONSE, owner, now_s)
        return shard.head if shard is not None else None

    def delete_response(self, response_id: str, owner: str, now_s: float) -> tuple[bool, Change | None]:
        shard = self.shards.find(response_id, RESPONSE, owner, now_s)
        if shard is None:
            return False, None
        return True, self.shards.delete(shard, now_s)

    # -- conversations --

    def create_conversation(self, conversation_id: str, owner: str, head: bytes, items: Items, now_s: float
                            ) -> tuple[None, Change]:
        return None, self.shards.create(conversation_id, CONVERSATION, owner, head, items, now_s).whole()

    def get_conversation(self, conversation_id: str, owner: str, now_s: float) -> bytes | None:
        shard = self.shards.find(conversation_id, CONVERSATION, owner, now_s)
        return shard.head if shard is not None else None

    def update_conversation(self, conversation_id: str, owner: str, metadata: bytes, now_s: float
                            ) -> tuple[bytes | None, Change | None]:
        shard = self.shards.find(conversation_id, CONVERSATION, owner, now_s)
        if shard is None:
            return None, None
        conversation = orjson.loads(shard.head)
        conversation["metadata"] = orjson.loads(metadata)
        head = stored_json(conversation)
        self.shards.admit(owner, CONVERSATION, conversation_id, shard_size(conversation_id, head, shard.items.items()),
                          len(shard.items))
        return head, self.shards.update(shard, now_s, head=head)

    def delete_conversation(self, conversation_id: str, owner: str, now_s: float) -> tuple[bool, Change | None]:
        shard = self.shards.find(conversation_id, CONVERSATION, owner, now_s)
        if shard is None:
            return False, None
        return True, self.shards.delete(shard, now_s)

    def add_items(self, conversation_id: str, owner: str, items: Items, now_s: float
                  ) -> tuple[bool, Change | None]:
        shard = self.shards.find(conversation_id, CONVERSATION, owner, now_s)
        if shard is None:
            return False, None
        added = [(k, v) for k, v in items if k not in shard.items]
        size = shard.size_bytes + shard_size("", b"", added) - SHARD_OVERHEAD_BYTES
        self.shards.admit(owner, CONVERSATION, conversation_id, size, len(shard.items) + len(added))
        return True, self.shards.update(shard, now_s, added=items)

    def list_items(self, conversation_id: str, owner: str, after: str, limit: int, descending: bool, now_s: float
                   ) -> tuple[list[bytes], bool] | None:
        """A page of items after the id ``after`` ("" for the start); None when there is no conversation."""
        shard = self.shards.find(conversation_id, CONVERSATION, owner, now_s)
        if shard is None:
            return None
        ids = list(shard.items)
        if descending:
            ids.reverse()
        start = ids.index(after) + 1 if after in shard.items else 0
        page = ids[start:start + limit]
        return [shard.items[i] for i in page], start + limit < len(ids)

    def all_items(self, conversation_id: str, owner: str, now_s: float) -> list[bytes] | None:
        shard = self.shards.find(conversation_id, CONVERSATION, owner, now_s)
        return list(shard.items.values()) if shard is not None else None

    def get_item(self, conversation_id: str, owner: str, item_id: str, now_s: float) -> tuple[bool, bytes | None]:
        shard = self.shards.find(conversation_id, CONVERSATION, owner, now_s)
        if shard is None:
            return False, None
        return True, shard.items.get(item_id)

    def delete_item(self, conversation_id: str, owner: str, item_id: str, now_s: float
                    ) -> tuple[tuple[bytes | None, bool], Change | None]:
        shard = self.shards.find(conversation_id, CONVERSATION, owner, now_s)
        if shard is None:
            return (None, False), None
        if item_id not in shard.items:
            return (shard.head, False), None
        return (shard.head, True), self.shards.update(shard, now_s, removed=[item_id])


# name -> (argument types after the shard id and owner, writes). A peer's request is checked against it.
OPERATIONS: dict[str, tuple[tuple[type, ...], bool]] = {
    "put_response": ((bytes,), True),
    "get_response": ((), False),
    "delete_response": ((), True),
    "create_conversation": ((bytes, list), True),
    "get_conversation": ((), False),
    "update_conversation": ((bytes,), True),
    "delete_conversation": ((), True),
    "add_items": ((list,), True),
    "list_items": ((str, int, bool), False),
    "all_items": ((), False),
    "get_item": ((str,), False),
    "delete_item": ((str,), True),
}
CREATING = frozenset({"put_response", "create_conversation"})

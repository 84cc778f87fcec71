"""Stored responses and conversations (the Responses and Conversations APIs), behind one interface.

    store.HistoryStore      what every backend offers, scoped to an owner; HistoryConfig, StoredResponse
    memory.MemoryHistory    the default: in memory, each shard on its ring owner and two replicas
    postgres.PostgresHistory durable, in PostgreSQL (migrations at start, configurable names)
    redis.RedisHistory      in Redis, under a key prefix, with a retention time
    shards, ops, wire       the memory backend's parts: versioned shards, the operations, the peer frames
"""

from .memory import MemoryHistory, ReplicationConfig
from .postgres import PostgresConfig, PostgresHistory, PostgresNames
from .redis import RedisConfig, RedisHistory
from .store import (ID_CHARS_MAX, ITEMS_PER_ADD_MAX, LIST_LIMIT_MAX, ConversationFull, HistoryConfig, HistoryStore,
                    ItemPage, StoredResponse, StoreUnavailable)

__all__ = ["ConversationFull", "HistoryConfig", "HistoryStore", "ID_CHARS_MAX", "ITEMS_PER_ADD_MAX", "ItemPage",
           "LIST_LIMIT_MAX", "MemoryHistory", "PostgresConfig", "PostgresHistory", "PostgresNames", "RedisConfig",
           "RedisHistory", "ReplicationConfig", "StoreUnavailable", "StoredResponse"]

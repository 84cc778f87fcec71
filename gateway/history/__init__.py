"""Stored responses and conversations (the Responses and Conversations APIs), behind one interface.

    store.HistoryStore      what every backend offers, scoped to an owner; HistoryConfig, StoredResponse
    memory.MemoryHistory    the default: in memory, each shard on its ring owner and two replicas
    postgres.PostgresHistory durable, in PostgreSQL (migrations at start, configurable names)
    redis.RedisHistory      in Redis, under a key prefix, with a retention time
    shards, ops, wire       the memory backend's parts: versioned shards, the operations, the peer frames
    backends.HISTORY_BACKENDS  the registry --history-backend chooses from (each backend registers itself)
"""

from .backends import HISTORY_BACKENDS, HistoryBackend
from .memory import MemoryHistory, ReplicationConfig
from .postgres import PostgresConfig, PostgresHistory, PostgresNames
from .redis import RedisConfig, RedisHistory
from .store import (CHAIN_LENGTH_MAX, ID_CHARS_MAX, ITEMS_PER_ADD_MAX, LIST_LIMIT_MAX, RECORD_BYTES_MAX, HistoryConfig,
                    HistoryStore, ItemPage, RecordTooLarge, StorageQuotaExceeded, StoredResponse, StoreUnavailable,
                    TenantBounds, check_record_size)

__all__ = ["HISTORY_BACKENDS", "HistoryBackend", "CHAIN_LENGTH_MAX", "HistoryConfig", "HistoryStore", "ID_CHARS_MAX", "ITEMS_PER_ADD_MAX", "ItemPage", "LIST_LIMIT_MAX",
           "MemoryHistory", "PostgresConfig", "RECORD_BYTES_MAX", "PostgresHistory", "PostgresNames", "RecordTooLarge", "RedisConfig",
           "RedisHistory", "ReplicationConfig", "StorageQuotaExceeded", "StoreUnavailable", "StoredResponse",
           "TenantBounds", "check_record_size"]

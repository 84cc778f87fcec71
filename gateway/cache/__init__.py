"""The response cache the cluster shares (issue 63): exact-match answers of deterministic requests, sharded across
the nodes by consistent hashing, bounded per node and per tenant, with a TTL.

    key.py        which requests are cacheable, and the key equal requests share
    store.py      the answers one node holds: bounds, TTL, least recently used first out
    service.py    the cluster's cache: lookups at the key's owners, answers kept on them, the peer protocol
    subsystem.py  the node's registration

The HTTP side is gateway/api/cached.py.
"""

from .key import APIS, cache_key, cacheable
from .service import CacheConfig, ResponseCache
from .store import AnswerStore, Entry

_EXPORTS = (APIS, cache_key, cacheable, CacheConfig, ResponseCache, AnswerStore, Entry)

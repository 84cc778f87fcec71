"""The two tokenizer caches. Pure data structures: no tokenizer, no I/O, no threads.

L0 (``ExactCache``): whole texts to their ids, an LRU bounded by entries and by an
estimate of its bytes. Hits when the same text comes again (retries, benchmarks, a
fixed system prompt sent alone). The byte bound matters for long prompts: 4,096
entries of 7,800-token prompts held ~1.1 GB when the ids were tuples of int objects
(~40 bytes an id), and the heap growing to it cost more CPU in page faults than the
cache saved (BENCHMARKS.md, eighth pass).

Both caches keep ids packed in ``bytes`` (4 bytes an id, ``pack_ids``): ten times the
prompts of a tuple of ints in the same memory, and nothing for the garbage collector.
bytes are not tracked by it; int tuples are walked in every collection that sees them
(7,800 visits for a long prompt), and ``array`` objects are tracked (heap types, since
Python 3.10), so a full L1 of ~190,000 arrays made every full collection take 115-250 ms
(BENCHMARKS.md, ninth pass). An entry is a plain tuple of ints, strs and bytes, which the
collector untracks the first time it sees it (not a tuple subclass: those it never does).

L1 (``SegmentCache``): prefixes that end right after a special token (such as
``<|im_end|>``). A tokenizer splits its input at added tokens before anything
else, so the ids of text up to such a boundary do not depend on what follows:
``ids(prefix + rest) == ids(prefix) + ids(rest)``. A conversation that grows
turn by turn, or many requests sharing a long system prompt, then encode only
what is new. The cache is a trie of segments (the text between two
boundaries): walking it costs one dict lookup per segment, so finding the
longest cached prefix is linear in the text, not quadratic. It is an LRU
bounded by an estimate of its bytes; lookups touch a path from the leaf up, so
parents are always newer than their children and eviction takes leaves first.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from array import array

# Rough per-node overhead of the dict entry, the node object and the key tuple.
_NODE_OVERHEAD_BYTES = 200


# The dict entry, the key tuple, the bytes' header (the text is counted by sys.getsizeof).
_L0_ENTRY_OVERHEAD_BYTES = 200


def pack_ids(ids: "list[int]") -> bytes:
    """Token ids as 4 bytes each (native order: they never leave the process).

    ``fromlist`` sizes the array once and converts in a loop of its own: ~30 % faster than ``array("I", ids)``,
    which goes through the sequence protocol item by item (31 against 43 us for a 7,800-token prompt, on the
    event loop's thread for every new segment the cache keeps)."""
    packed = array("I")
    packed.fromlist(ids if type(ids) is list else list(ids))
    return packed.tobytes()


def unpack_ids(packed: bytes) -> list[int]:
    return memoryview(packed).cast("I").tolist()


class ExactCache:
    def __init__(self, entries_max: int, bytes_max: int) -> None:
        self.entries_max = entries_max
        self.bytes_max = bytes_max
        self._entries: "collections.OrderedDict[tuple[str, bool], bytes]" = collections.OrderedDict()
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _entry_bytes(text: str, packed_ids: bytes) -> int:
        return sys.getsizeof(text) + len(packed_ids) + _L0_ENTRY_OVERHEAD_BYTES

    def get(self, text: str, add_special_tokens: bool) -> "list[int] | None":
        if self.entries_max <= 0:
            return None
        key = (text, add_special_tokens)
        packed_ids = self._entries.get(key)
        if packed_ids is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return unpack_ids(packed_ids)  # a new list each time: the caller owns what it gets

    def put(self, text: str, add_special_tokens: bool, token_ids: "list[int]") -> None:
        if self.entries_max <= 0:
            return
        packed_ids = pack_ids(token_ids)
        size = self._entry_bytes(text, packed_ids)
        if size > self.bytes_max:
            return  # larger than the whole cache: kept nowhere rather than emptying it
        key = (text, add_special_tokens)
        previous = self._entries.pop(key, None)
        if previous is not None:
            self.size_bytes -= self._entry_bytes(text, previous)
        self._entries[key] = packed_ids
        self.size_bytes += size
        while len(self._entries) > self.entries_max or self.size_bytes > self.bytes_max:
            (old_text, _), old_ids = self._entries.popitem(last=False)
            self.size_bytes -= self._entry_bytes(old_text, old_ids)

    def __len__(self) -> int:
        return len(self._entries)


# A cached segment: (node id, packed ids, size in bytes); a plain tuple, for the collector (above).
_SegmentNode = "tuple[int, bytes, int]"
_NODE_ID, _IDS, _SIZE_BYTES = 0, 1, 2


@dataclasses.dataclass(slots=True)  # not frozen: made per request (see GenerationPlan, gateway/serving/generation.py)
class SegmentMatch:
    chars: int  # how many leading characters of the text the cached ids cover
    ids: list[int]  # a new list for each match: the caller may extend it
    segments: int
    parent_node_id: int  # node to attach further segments to


class SegmentCache:
    # Root node ids: texts encoded with and without the tokenizer's added special
    # tokens (a BOS, say) have different first segments, so they get separate roots.
    ROOT_PLAIN = 0
    ROOT_WITH_SPECIAL = -1

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self._nodes: "collections.OrderedDict[tuple[int, str], _SegmentNode]" = collections.OrderedDict()
        self._next_node_id = 1
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0
        self.hit_chars = 0

    def root(self, add_special_tokens: bool) -> int:
        return self.ROOT_WITH_SPECIAL if add_special_tokens else self.ROOT_PLAIN

    def longest_prefix(self, segments: "list[str]", add_special_tokens: bool) -> SegmentMatch:
        """Longest run of leading segments that is cached, and their ids."""
        parent = self.root(add_special_tokens)
        ids: list[int] = []
        chars = 0
        path: list[tuple[int, str]] = []
        for segment in segments:
            key = (parent, segment)
            node = self._nodes.get(key)
            if node is None:
                break
            unpacked = unpack_ids(node[_IDS])  # a new list: the first one is taken as it is (a copy saved)
            if ids:
                ids += unpacked
            else:
                ids = unpacked
            chars += len(segment)
            path.append(key)
            parent = node[_NODE_ID]
        for key in reversed(path):  # leaf first, so ancestors end up most recent
            self._nodes.move_to_end(key)
        if path:
            self.hits += 1
            self.hit_chars += chars
        else:
            self.misses += 1
        return SegmentMatch(chars=chars, ids=ids, segments=len(path), parent_node_id=parent)

    def insert(self, parent_node_id: int, segments: "list[str]", segment_ids: "list[list[int]]") -> None:
        """Cache segments (each with its ids) as a chain below ``parent_node_id``."""
        if self.bytes_max <= 0:
            return
        parent = parent_node_id
        keys: list[tuple[int, str]] = []
        for segment, ids in zip(segments, segment_ids):
            key = (parent, segment)
            node = self._nodes.get(key)
            if node is None:
                packed_ids = pack_ids(ids)
                size = _NODE_OVERHEAD_BYTES + sys.getsizeof(segment) + len(packed_ids)
                node = (self._next_node_id, packed_ids, size)
                self._next_node_id += 1
                self._nodes[key] = node
                self.size_bytes += size
            keys.append(key)
            parent = node[_NODE_ID]
        for key in reversed(keys):
            self._nodes.move_to_end(key)
        while self.size_bytes > self.bytes_max and self._nodes:
            _, evicted = self._nodes.popitem(last=False)
            self.size_bytes -= evicted[_SIZE_BYTES]

    def __len__(self) -> int:
        return len(self._nodes)

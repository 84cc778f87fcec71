"""The KV-cache index: which engine holds which prompt prefix, built from the engines' KV events.

No I/O: ``apply_batch`` takes an engine's ``KvEventBatch`` messages (decoded to
plain values by the subscriber), ``matched_blocks`` answers routing queries.

Keys. Engines name blocks with their own hashes (vLLM's differ from SGLang's
and from our simulator's), which we cannot compute from a prompt. Stored
events carry each block's token ids, so the index names every block with its
own hash, chained like the engines' (``hash((parent, tokens))``: position
aware, one hash stands for the whole prefix), and keeps the engine's hash only
to apply later ``removed`` events. A prompt's blocks are hashed the same way at
query time. Hashes of int tuples do not depend on PYTHONHASHSEED, so every node
computes the same ones.

Order. Each engine's batches carry sequence numbers: a batch is applied once,
in order. A duplicate (two owners relaying the same stream) is ignored; a gap
is reported so the caller resubscribes or asks a peer from the first missing
number. A snapshot chunk (cursor 0, or a cursor the engine no longer has)
replaces the engine's state.

Memory. At most ``blocks_max`` blocks over all engines; beyond that the least
recently used are forgotten (a query hit or a store makes a block recent), a
64th of the limit at a time. Forgetting only makes the index underestimate
what an engine holds. The recency order is one ``IntLru`` keyed by an int that
packs the engine's number with the block's hash: no structure here is one the
garbage collector scans (an OrderedDict of (engine, hash) tuples was, for
30-45 ms per full collection).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

from .int_lru import IntLru
from .prefix_index import chained_block_hashes
from ..base.options import Option


class BatchOutcome(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # already applied: ignored
    GAP = "gap"  # a batch is missing: resubscribe from next_sequence


@dataclasses.dataclass(frozen=True)
class StoredBlocks:
    parent_engine_hash: int | None
    blocks: "tuple[tuple[int, tuple[int, ...]], ...]"  # (engine block hash, token ids)


@dataclasses.dataclass(frozen=True)
class RemovedBlocks:
    engine_hashes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Cleared:
    pass


KvEvent = StoredBlocks | RemovedBlocks | Cleared

# Resolved ops, what nodes send each other: (OP_STORE, [(our hash, engine hash), ...]),
# (OP_REMOVE, [engine hash, ...]), (OP_CLEAR,). Append-only values.
OP_STORE, OP_REMOVE, OP_CLEAR = 0, 1, 2


def prompt_block_hashes(token_ids: "Sequence[int]", block_size: int) -> list[int]:
    """The index's hash of every full block of a prompt, chained from the start (the same chain as
    the approximate prefix index's)."""
    return chained_block_hashes(token_ids, block_size)


# Engines the index follows at most: far more than a cluster runs, and a bound on what batches naming
# engines that do not exist (a buggy or hostile peer's) can make it hold.
ENGINES_MAX = 4096
_HASH_BITS = 64
_HASH_MASK = (1 << _HASH_BITS) - 1


class _Engine:
    __slots__ = ("number", "block_size", "blocks", "by_engine_hash", "next_sequence", "orphans")

    def __init__(self, number: int) -> None:
        self.number = number << _HASH_BITS  # the high bits of this engine's keys in the LRU order
        self.block_size = 0  # learned from the first stored event
        self.blocks: dict[int, int] = {}  # our hash -> engine hash
        self.by_engine_hash: dict[int, int] = {}  # engine hash -> our hash
        self.next_sequence = 0  # 0: nothing applied yet (the first batch sets it)
        self.orphans = 0  # stored blocks whose parent we did not know


class KvIndex:
    def __init__(self, blocks_max: int = 4_000_000) -> None:
        self.blocks_max = blocks_max
        self._engines: dict[str, _Engine] = {}
        self._engine_ids: dict[int, str] = {}  # by number
        self._next_engine_number = 0
        self._lru = IntLru()  # keys: engine number << 64 | our hash as unsigned 64 bits
        self.inserted = 0
        self.removed = 0
        self.evicted = 0

    # -- queries --------------------------------------------------------

    def has_engine(self, engine_id: str) -> bool:
        return engine_id in self._engines

    def block_size(self, engine_id: str) -> int:
        engine = self._engines.get(engine_id)
        return engine.block_size if engine is not None else 0

    def next_sequence(self, engine_id: str) -> int:
        engine = self._engines.get(engine_id)
        return engine.next_sequence if engine is not None else 0

    def block_count(self, engine_id: str | None = None) -> int:
        if engine_id is None:
            return len(self._lru)
        engine = self._engines.get(engine_id)
        return len(engine.blocks) if engine is not None else 0

    def matched_blocks(self, engine_id: str, hashes: "list[int]") -> int:
        """How many leading blocks of the prompt (hashed for this engine's block size) it holds."""
        engine = self._engines.get(engine_id)
        if engine is None:
            return 0
        blocks = engine.blocks
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        touch, number = self._lru.touch, engine.number
        for h in hashes[:n]:
            touch(number | h & _HASH_MASK)
        return n

    def orphans(self, engine_id: str) -> int:
        """Stored blocks dropped because their parent was unknown here (a sign of a missed batch)."""
        engine = self._engines.get(engine_id)
        return engine.orphans if engine is not None else 0

    def fingerprint(self, engine_id: str) -> int:
        """A hash of the engine's block set: equal on two nodes iff their views agree."""
        engine = self._engines.get(engine_id)
        return hash(frozenset(engine.blocks)) if engine is not None else 0

    # -- updates --------------------------------------------------------

    def _admit(self, engine_id: str, sequence: int, snapshot: bool) -> "tuple[_Engine, BatchOutcome | None]":
        engine = self._engines.get(engine_id)
        if engine is None:
            if len(self._engines) >= ENGINES_MAX:
                raise ValueError(f"the index follows {ENGINES_MAX} engines already")
            engine = self._engines[engine_id] = _Engine(self._next_engine_number)
            self._engine_ids[self._next_engine_number] = engine_id
            self._next_engine_number += 1
        if not snapshot and engine.next_sequence:
            if sequence < engine.next_sequence:
                return engine, BatchOutcome.DUPLICATE
            if sequence > engine.next_sequence:
                return engine, BatchOutcome.GAP
        return engine, None

    def apply_batch(self, engine_id: str, sequence: int, events: "Sequence[KvEvent]",
                    snapshot: bool = False, ops_out: "list | None" = None) -> BatchOutcome:
        """Apply an engine's batch. ``ops_out`` collects it as resolved ops for peers (see apply_ops)."""
        refused = self.begin_batch(engine_id, sequence, snapshot)
        if refused is not None:
            return refused
        self.apply_events(engine_id, events, ops_out)
        self.end_batch(engine_id, sequence)
        return BatchOutcome.APPLIED

    # apply_batch in three steps, for a caller that lets the event loop run between parts of a long
    # batch: begin_batch, then apply_events on consecutive parts of its events, then end_batch. Until
    # end_batch the engine's next sequence number stays where it was.

    def begin_batch(self, engine_id: str, sequence: int, snapshot: bool = False) -> BatchOutcome | None:
        """None when the batch is to be applied; else why not (a duplicate, or a gap before it)."""
        return self._admit(engine_id, sequence, snapshot)[1]

    def apply_events(self, engine_id: str, events: "Sequence[KvEvent]", ops_out: "list | None" = None) -> None:
        engine = self._engines.get(engine_id)
        if engine is None:
            return  # removed since begin_batch
        for event in events:
            if isinstance(event, StoredBlocks):
                self._store(engine_id, engine, event, ops_out)
            elif isinstance(event, RemovedBlocks):
                self._remove_all(engine, event.engine_hashes)
                if ops_out is not None:
                    ops_out.append((OP_REMOVE, list(event.engine_hashes)))
            else:
                self._clear(engine_id, engine)
                if ops_out is not None:
                    ops_out.append((OP_CLEAR,))

    def end_batch(self, engine_id: str, sequence: int) -> None:
        engine = self._engines.get(engine_id)
        if engine is not None:
            engine.next_sequence = sequence + 1
        self._evict()

    def apply_ops(self, engine_id: str, sequence: int, ops: "Sequence[tuple]", snapshot: bool = False,
                  block_size: int = 0) -> BatchOutcome:
        """Apply a batch another node resolved (our hashes computed once, no token ids to ship)."""
        engine, refused = self._admit(engine_id, sequence, snapshot)
        if refused is not None:
            return refused
        if block_size and not engine.block_size:
            engine.block_size = block_size
        for op in ops:
            if op[0] == OP_STORE:
                pairs = op[1]
                if any(len(pair) != 2 for pair in pairs):
                    raise ValueError("a stored block is not an (our hash, engine hash) pair")
                if pairs:
                    ours, engine_hashes = zip(*pairs)
                    self._put_all(engine, ours, engine_hashes)
            elif op[0] == OP_REMOVE:
                self._remove_all(engine, op[1])
            elif op[0] == OP_CLEAR:
                self._clear(engine_id, engine)
        engine.next_sequence = sequence + 1
        self._evict()
        return BatchOutcome.APPLIED

    def export_ops(self, engine_id: str) -> "tuple[int, int, list[tuple]]":
        """(block size, next sequence, ops that rebuild this engine's state from nothing)."""
        engine = self._engines.get(engine_id)
        if engine is None:
            return 0, 0, [(OP_CLEAR,)]
        return engine.block_size, engine.next_sequence, [(OP_CLEAR,), (OP_STORE, list(engine.blocks.items()))]

    def engines(self) -> list[str]:
        return list(self._engines)

    def remove_engine(self, engine_id: str) -> None:
        engine = self._engines.pop(engine_id, None)
        if engine is not None:
            self._clear(engine_id, engine)
            del self._engine_ids[engine.number >> _HASH_BITS]

    def _store(self, engine_id: str, engine: _Engine, event: StoredBlocks, ops_out: "list | None") -> None:
        if event.parent_engine_hash is None:
            parent = 0
        else:
            parent = engine.by_engine_hash.get(event.parent_engine_hash)
            if parent is None:
                engine.orphans += len(event.blocks)  # its prefix is unknown here: cannot be matched
                return
        if not event.blocks:
            return
        if not engine.block_size:
            engine.block_size = len(event.blocks[0][1])
        ours = []
        for _, tokens in event.blocks:
            parent = hash((parent, tokens))
            ours.append(parent)
        engine_hashes = [engine_hash for engine_hash, _ in event.blocks]
        self._put_all(engine, ours, engine_hashes)
        if ops_out is not None:
            ops_out.append((OP_STORE, list(zip(ours, engine_hashes))))

    # Blocks are recorded and forgotten a whole event at a time, with the dict work in C loops
    # (update, map): a 7,800-token prompt stores and evicts ~490 blocks each; with two method calls
    # per block a real simulated-engine batch of that size took ~1.8 ms to apply, this way ~1.5 ms.

    def _put_all(self, engine: _Engine, ours: "Sequence[int]", engine_hashes: "Sequence[int]") -> None:
        """Record blocks (our hash, engine hash), in chain order: the last ends most recent."""
        number = engine.number
        # First: a peer's non-int hash fails here (TypeError), before anything has changed.
        lru_keys = [number | h & _HASH_MASK for h in ours]
        blocks = engine.blocks
        before = len(blocks)
        blocks.update(zip(ours, engine_hashes))
        self.inserted += len(blocks) - before
        engine.by_engine_hash.update(zip(engine_hashes, ours))
        self._lru.put_all(lru_keys)

    def _remove_all(self, engine: _Engine, engine_hashes: "Sequence[int]") -> None:
        pop_ours, pop_block, number = engine.by_engine_hash.pop, engine.blocks.pop, engine.number
        gone = []
        for engine_hash in engine_hashes:
            ours = pop_ours(engine_hash, None)
            if ours is not None and pop_block(ours, None) is not None:
                gone.append(number | ours & _HASH_MASK)
        self._lru.discard_all(gone)
        self.removed += len(gone)

    def _clear(self, engine_id: str, engine: _Engine) -> None:
        for ours in engine.blocks:
            self._lru.discard(engine.number | ours & _HASH_MASK)
        engine.blocks.clear()
        engine.by_engine_hash.clear()

    def _evict(self) -> None:
        for key in self._lru.evict_over(self.blocks_max):
            engine = self._engines[self._engine_ids[key >> _HASH_BITS]]
            ours = key & _HASH_MASK
            if ours >= 1 << (_HASH_BITS - 1):
                ours -= 1 << _HASH_BITS  # back to Python's signed hash
            engine_hash = engine.blocks.pop(ours, None)
            if engine_hash is not None:
                engine.by_engine_hash.pop(engine_hash, None)
            self.evicted += 1


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--disable-kv-events", "kv_events", "disable", "do not follow the engines' KV events", "routing"),
    Option("--kv-events-always", "kv_events_always", "bool", "follow an engine's KV events even when no other "
           "engine serves its models", "routing"),
    Option("--kv-index-blocks-max", "kv_index_blocks_max", int, "KV index size in blocks (LRU beyond)", "routing"),
    Option("--kv-event-followers", "kv_event_followers", int, "members following each engine's KV events (same on "
           "every member; others receive them)", "routing"),
)

"""One node's memory of stored responses and conversations: shards, versioned, bounded, without I/O.

A shard is what one ring key owns: a stored response, or a conversation with all its items (so a
conversation's items live, and move, with it). Every write at a shard's primary gives it a new
version and yields a ``Change`` for its replicas: the whole shard when it is created (or when a
replica is behind), else a delta on the version the replica should hold (new head, added and
removed items), or its deletion. Replicas apply changes in any order: a whole shard or a deletion
wins when its version is newer, a delta only on the version it was made from (``apply`` answers
False otherwise, and the primary sends the whole shard).

Versions are ``max(previous + 1, wall clock in ns)``: increasing at one primary, and when two nodes
briefly both believe they are primary (a ring change in flight) the later write wins everywhere.
Deletions leave a tombstone (id and version, for the retention time) so that an older copy pushed
later by a peer that missed the deletion cannot bring the shard back.

Bounds (``HistoryConfig``): response count, conversation items, bytes per node, and the same per
owner (``tenant_bounds``: a quarter of the node's by default). A primary refuses a write that would
take its owner past the owner's bounds (``admit``: StorageQuotaExceeded) or a record past its size
bound (RecordTooLarge), before anything changes. When the node's bounds force an eviction (replicas
arrive from every primary, and the owners' quotas together may exceed the node's), the owner holding
the most of what is over goes first, least recently used shard first: an owner within its share never
loses data to make room for an owner over it. An owner past ``REPLICA_QUOTA_SLACK`` times its own bounds
on a replica loses its own least recently used shards: a replica holds what primaries admitted against
their own counts, which differ from its own (a member's share of the ring, stand-in copies while an owner
was away), and evicting at the bound itself lost acknowledged responses on all their holders at once (a
10-minute chaos run at 90 % of one tenant's quota: 110 of 3,760). A shard not written for the retention
time is gone (the clock is passed in: wall seconds, the same on every node, since shards move between
nodes).

Bytes are counted as the process holds them (``SHARD_OVERHEAD_BYTES``, ``ITEM_OVERHEAD_BYTES``,
measured), and values are kept as exact-size bytes (``stored_json``).
"""

from __future__ import annotations

import collections
import collections.abc
import dataclasses

from .store import OPEN_DATA_PLANE_OWNER, HistoryConfig, StorageQuotaExceeded, check_record_size

RESPONSE = "r"
CONVERSATION = "c"
KINDS = (RESPONSE, CONVERSATION)

# What the process holds per shard and per item beyond their ids and JSON, measured with tracemalloc on
# CPython 3.11 (tests/unit/test_history.py::test_counted_bytes_match_what_the_process_holds): a stored
# response ~350 bytes (the Shard, its entries in the node's and its owner's recency orders, the bytes and
# str headers), a conversation item ~120 (its dict entry and the same headers).
SHARD_OVERHEAD_BYTES = 384
ITEM_OVERHEAD_BYTES = 128
TOMBSTONES_MAX = 100_000
# How far past its bounds an owner may be on a node when the shards come as replicas (primaries refuse at
# the bound itself). Node counts of one owner differ by the ring's shares and stand-in copies (a member of
# five away: the other four hold 3/4 of new writes instead of 3/5, 1.25x); past this, the owner's own
# least recently used shards go, so a tenant still holds at most 1.5 quarters of a node.
REPLICA_QUOTA_SLACK = 1.5


def shard_size(shard_id: str, head: bytes, items: "collections.abc.Collection[tuple[str, bytes]]") -> int:
    size = SHARD_OVERHEAD_BYTES + len(shard_id) + len(head)
    return size + sum(ITEM_OVERHEAD_BYTES + len(k) + len(v) for k, v in items) if items else size


# As wire.VERSION_MAX (2^63 - 1 ns, the year 2262): versions saturate there, so no arithmetic on one a peer
# sent can leave what msgpack encodes. Only a peer's doing reaches it; writes to that shard then stop
# replicating (replicas refuse a delta whose base is not below its version) and are counted as failed.
VERSION_MAX = 2 ** 63 - 1
# A change stamped further ahead of our clock than this is not taken: a member's clock cannot be that wrong,
# and a shard "written" in the far future would never expire.
WRITTEN_AHEAD_MAX_S = 600.0


def version_after(previous: int, now_s: float) -> int:
    """``min(VERSION_MAX, max(previous + 1, now in ns))``, spelled out: on every write, and the builtins' calls
    took two thirds of its cost."""
    version = int(now_s * 1e9)
    if version <= previous:
        version = previous + 1
    return version if version < VERSION_MAX else VERSION_MAX


@dataclasses.dataclass(slots=True)
class Shard:
    id: str
    kind: str
    owner: str
    version: int
    written_at_s: float  # wall clock of the last write: retention counts from it
    head: bytes  # JSON: the stored response, or the conversation object
    items: dict[str, bytes]  # a conversation's items by id, in conversation order
    size_bytes: int = 0

    def measure(self) -> None:
        self.size_bytes = shard_size(self.id, self.head, self.items.items())

    def whole(self) -> "Change":
        return Change(self.id, self.kind, self.owner, self.version, self.written_at_s, 0, self.head,
                      tuple(self.items.items()), ())


# Not frozen: one is made for every replicated write, and a frozen dataclass's __init__ sets each field through
# object.__setattr__ (~14 k instructions for these ten, a third of a primary's write). Nothing changes a change
# once made.
@dataclasses.dataclass(slots=True)
class Change:
    """What one write did to a shard, as its replicas receive it (see the module docstring)."""

    id: str
    kind: str
    owner: str
    version: int
    written_at_s: float
    base_version: int  # 0: the whole shard; else a delta on this version
    head: bytes | None  # None: unchanged (a delta)
    added: tuple[tuple[str, bytes], ...]
    removed: tuple[str, ...]
    deleted: bool = False


@dataclasses.dataclass(slots=True)
class OwnerUsage:
    """What one owner holds on this node, and its shards, least recently used first."""

    bytes: int = 0
    responses: int = 0
    conversations: int = 0
    items: int = 0  # conversation items (the conversations themselves not counted)
    order: "collections.OrderedDict[str, None]" = dataclasses.field(default_factory=collections.OrderedDict)


class MemoryShards:
    def __init__(self, config: HistoryConfig) -> None:
        self.config = config
        self.tenant_bounds = config.tenant_bounds
        self.replica_bounds = self.tenant_bounds.scaled(REPLICA_QUOTA_SLACK)
        self._shards: collections.OrderedDict[str, Shard] = collections.OrderedDict()
        self._tombstones: collections.OrderedDict[str, tuple[int, float]] = collections.OrderedDict()
        self._owners: dict[str, OwnerUsage] = {}
        self.bytes = 0
        self.responses = 0
        self.items = 0  # conversation items, plus one per conversation
        self.evicted = 0
        self.installed = 0  # shards created or received whole: a copy this node does not own comes only so
        self.evicted_over_quota = 0  # of which: an owner's own shards, past its bounds on a replica
        self.refused_quota = 0  # writes refused at this primary: their owner's bounds
        self.refused_future = 0  # peers' changes stamped too far ahead of our clock
        # Told of every change this node's copy takes (its own writes, replicas' changes) and every copy it
        # forgets, as it happens: the node's journal on disk (journal.py). None: kept in memory only.
        self.on_change: "collections.abc.Callable[[Change], None] | None" = None
        self.on_forget: "collections.abc.Callable[[str], None] | None" = None

    def usage(self, owner: str) -> OwnerUsage:
        return self._owners.get(owner) or OwnerUsage()

    def owners(self) -> int:
        return len(self._owners)

    def admit(self, owner: str, kind: str, shard_id: str, size_bytes: int, items: int) -> None:
        """Raises StorageQuotaExceeded when holding a shard of ``size_bytes`` and ``items`` items in place of the
        one held under ``shard_id`` would take ``owner`` past its bounds; RecordTooLarge past a record's."""
        check_record_size(size_bytes, self.config.record_bytes_max,
                          "the response" if kind == RESPONSE else "the conversation")
        if owner == OPEN_DATA_PLANE_OWNER:
            return  # one owner for everyone: the node's bounds alone, its oldest records evicted (store.py)
        usage, limits = self.usage(owner), self.tenant_bounds
        held = self._shards.get(shard_id)
        replaced = held if held is not None and held.owner == owner else None
        new = 0 if replaced is not None else 1
        over = None
        if usage.bytes + size_bytes - (replaced.size_bytes if replaced is not None else 0) > limits.bytes:
            over = f"{limits.bytes} bytes"
        elif kind == RESPONSE and usage.responses + new > limits.responses:
            over = f"{limits.responses} stored responses"
        elif kind == CONVERSATION and usage.conversations + new > limits.conversations:
            over = f"{limits.conversations} conversations"
        elif kind == CONVERSATION and usage.items + items - (len(replaced.items) if replaced is not None else 0) \
                > limits.items:
            over = f"{limits.items} conversation items"
        if over is not None:
            self.refused_quota += 1
            raise StorageQuotaExceeded(f"storage quota exceeded: this tenant holds as much as it may on the node "
                                       f"storing it (at most {over}); delete stored responses or conversations "
                                       "you no longer need, or wait for them to expire")

    def __len__(self) -> int:
        return len(self._shards)

    def ids(self) -> list[str]:
        return list(self._shards)

    def peek(self, shard_id: str) -> Shard | None:
        """The shard as held, whatever its owner or age, without touching its recency (handoff, sync)."""
        return self._shards.get(shard_id)

    def deleted(self, shard_id: str) -> bool:
        return shard_id in self._tombstones

    def tombstone_version(self, shard_id: str) -> int | None:
        entry = self._tombstones.get(shard_id)
        return entry[0] if entry is not None else None

    def find(self, shard_id: str, kind: str, owner: str, now_s: float) -> Shard | None:
        """The live shard of this kind and owner, marked recently used; None for anything else."""
        shard = self._shards.get(shard_id)
        if shard is None or shard.kind != kind or shard.owner != owner:
            return None
        if now_s - shard.written_at_s > self.config.retention_s:
            self._drop(shard_id)
            return None
        self._touch(shard)
        return shard

    # -- writes at the primary --------------------------------------------------------------

    def create(self, shard_id: str, kind: str, owner: str, head: bytes, items: "list[tuple[str, bytes]]",
               now_s: float) -> Shard:
        """Holds a new shard in place of any held under ``shard_id``, once ``admit`` lets its owner hold it. Its
        replicas take it whole (``whole()``)."""
        by_id = dict(items)
        size_bytes = shard_size(shard_id, head, by_id.items())
        self.admit(owner, kind, shard_id, size_bytes, len(by_id))
        previous = self._shards.get(shard_id)
        base = previous.version if previous is not None else 0
        buried = self._tombstones.pop(shard_id, None)
        if buried is not None and buried[0] > base:
            base = buried[0]
        shard = Shard(shard_id, kind, owner, version_after(base, now_s), now_s, head, by_id, size_bytes)
        self._install(shard, now_s)
        if self.on_change is not None:
            self.on_change(shard.whole())
        return shard

    def update(self, shard: Shard, now_s: float, head: bytes | None = None,
               added: "list[tuple[str, bytes]]" = (), removed: "list[str]" = ()) -> Change:
        """Changes a held shard (found with ``find``) and returns the delta for its replicas."""
        change = self._update(shard, now_s, head, added, removed)
        if self.on_change is not None:
            self.on_change(change)
        return change

    def _update(self, shard: Shard, now_s: float, head: bytes | None, added: "list[tuple[str, bytes]]",
                removed: "list[str]") -> Change:
        base = shard.version
        self._account(shard, -1)
        if head is not None:
            shard.head = head
        for item_id in removed:
            shard.items.pop(item_id, None)
        shard.items.update(added)
        shard.version = version_after(base, now_s)
        shard.written_at_s = now_s
        shard.measure()
        self._account(shard, +1)
        self._shards.move_to_end(shard.id)
        self._evict(now_s, shard.owner)
        return Change(shard.id, shard.kind, shard.owner, shard.version, now_s, base, head, tuple(added),
                      tuple(removed))

    def delete(self, shard: Shard, now_s: float) -> Change:
        version = version_after(shard.version, now_s)
        self._drop(shard.id)
        self._bury(shard.id, version, now_s)
        change = Change(shard.id, shard.kind, shard.owner, version, now_s, 0, None, (), (), deleted=True)
        if self.on_change is not None:
            self.on_change(change)
        return change

    def forget(self, shard_id: str) -> None:
        """Drops this node's copy, no tombstone: the shard lives on at its owners (memory.py's trim)."""
        self._drop(shard_id)
        if self.on_forget is not None:
            self.on_forget(shard_id)

    def snapshot(self) -> "list[Change]":
        """Everything held, as the changes that would make it again: each shard whole, each tombstone a
        deletion (under a placeholder kind and owner: a deletion needs neither). For the journal's snapshot."""
        held = [shard.whole() for shard in self._shards.values()]
        buried = [Change(shard_id, RESPONSE, "~", version, buried_at_s, 0, None, (), (), deleted=True)
                  for shard_id, (version, buried_at_s) in self._tombstones.items()]
        return buried + held

    # -- changes from the primary -----------------------------------------------------------

    def apply(self, change: Change, now_s: float) -> bool:
        """Applies a replica's change; False when it is a delta on a version this node does not hold."""
        held = self._shards.get(change.id)
        held_version = max(held.version if held is not None else 0,
                           self._tombstones.get(change.id, (0, 0.0))[0])
        if change.version <= held_version:
            return True  # already as new (or deleted later): nothing to do
        if now_s - change.written_at_s > self.config.retention_s:
            return True  # expired on the way (or a stale copy): not worth keeping
        if change.written_at_s - now_s > WRITTEN_AHEAD_MAX_S:
            self.refused_future += 1
            return True  # from a clock far ahead of ours (or a forged stamp): dropped, counted
        if change.deleted:
            if held is not None:
                self._drop(change.id)
            self._bury(change.id, change.version, now_s)
        elif change.base_version == 0:
            self._tombstones.pop(change.id, None)
            shard = Shard(change.id, change.kind, change.owner, change.version, change.written_at_s,
                          change.head or b"", dict(change.added))
            shard.measure()
            self._install(shard, now_s)
        elif held is None or held.version != change.base_version:
            return False
        else:
            self._update(held, change.written_at_s, change.head, list(change.added), list(change.removed))
            held.version = change.version
        if self.on_change is not None:
            self.on_change(change)
        return True

    # -- bookkeeping ------------------------------------------------------------------------

    def _install(self, shard: Shard, now_s: float) -> None:
        """Holds a measured shard in place of any held under its id."""
        self.installed += 1
        if shard.id in self._shards:  # (a new shard, mostly: no call to drop nothing)
            self._drop(shard.id)
        self._shards[shard.id] = shard
        self._account(shard, +1)
        self._evict(now_s, shard.owner)

    def _touch(self, shard: Shard) -> None:
        self._shards.move_to_end(shard.id)
        usage = self._owners.get(shard.owner)
        if usage is not None:
            usage.order.move_to_end(shard.id)

    def _account(self, shard: Shard, sign: int) -> None:
        """Counts a held shard in (+1: its owner's most recently used; the node's order is the caller's: a shard
        just installed is last already) or out (-1)."""
        self.bytes += sign * shard.size_bytes
        usage = self._owners.get(shard.owner)
        if usage is None:
            usage = self._owners[shard.owner] = OwnerUsage()
        usage.bytes += sign * shard.size_bytes
        if shard.kind == RESPONSE:
            self.responses += sign
            usage.responses += sign
        else:
            self.items += sign * (1 + len(shard.items))
            usage.conversations += sign
            usage.items += sign * len(shard.items)
        if sign > 0:
            usage.order[shard.id] = None
        else:
            usage.order.pop(shard.id, None)
            if not usage.order:
                del self._owners[shard.owner]

    def _drop(self, shard_id: str) -> None:
        shard = self._shards.pop(shard_id, None)
        if shard is not None:
            self._account(shard, -1)

    def _bury(self, shard_id: str, version: int, now_s: float) -> None:
        self._tombstones[shard_id] = (version, now_s)
        self._tombstones.move_to_end(shard_id)
        while len(self._tombstones) > TOMBSTONES_MAX:
            self._tombstones.popitem(last=False)

    def _evict(self, now_s: float, written_by: str | None = None) -> None:
        config = self.config
        while self._shards:
            # What the node is over, and who holds the most of it: that owner's least recently used shard goes.
            if self.bytes > config.max_bytes:
                measure = lambda u: u.bytes  # noqa: E731
            elif self.responses > config.max_responses:
                measure = lambda u: u.responses  # noqa: E731
            elif self.items > config.max_items:
                measure = lambda u: u.items + u.conversations  # noqa: E731
            else:
                break
            heaviest = max(self._owners.values(), key=measure)
            self._drop(next(iter(heaviest.order)))
            self.evicted += 1
        usage = self._owners.get(written_by) if written_by is not None and written_by != OPEN_DATA_PLANE_OWNER \
            else None
        limits = self.replica_bounds
        while usage is not None and usage.order and (
                usage.bytes > limits.bytes or usage.responses > limits.responses
                or usage.conversations > limits.conversations or usage.items > limits.items):
            # A replica receives what primaries admitted against their own counts: an owner far over its
            # bounds here makes room from its own shards, never from another owner's.
            self._drop(next(iter(usage.order)))
            self.evicted += 1
            self.evicted_over_quota += 1
            usage = self._owners.get(written_by)
        retention = config.retention_s
        while self._shards:  # the least recently used first: expired ones gather there
            oldest = next(iter(self._shards.values()))
            if now_s - oldest.written_at_s <= retention:
                break
            self._drop(oldest.id)
        while self._tombstones:
            _, buried_at = next(iter(self._tombstones.values()))
            if now_s - buried_at <= retention:
                break
            self._tombstones.popitem(last=False)

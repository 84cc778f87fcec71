"""The memory backend, replicated across the mesh: a stored response or conversation lives on its owner on
the hash ring and on the next two members, as rate-limit counts do.

Routing. An operation goes to the first member of the shard's owners (primary first) that answers;
that member runs it on its own shards (``ops.py``) and, when it writes, sends the change to the
other owners before answering. A read is answered from this node's own copy when this node is one
of the owners and holds the shard (with three owners and three nodes, every read is local).

The guarantee. A write is acknowledged (the API answers 200) once it is held by at least two nodes
(machines: the processes of ``--workers N`` share a node tag, and a shard's three owners are on
three nodes when there are three), or by the only node when no other is known: a node's death, any
node's, loses nothing acknowledged before it. Failed members count as known until they are reaped (a
day, ``MeshConfig.dead_reap_s``, or at once by ``force-leave``),
since one may be cut off rather than dead and serving clients on its side: a node alone on its side
of a partition refuses writes, and a shard it cannot find while a possible holder does not answer is
unknown (504), not missing (404). When fewer than two nodes can take a write (owners dead but still
on the ring: the next members on the ring stand in), the API answers 504 (``StoreUnavailable``) and
the write may or may not survive. An owner that missed a change is repaired in the background until
it has it or leaves the ring. Two nodes dying together before repair can lose the changes only they
held.

Catching up. When the ring changes, the first surviving old owner of each shard pushes it to the
owners that are new for it (a replacement for a dead member, a member that joined). A node holding a
copy it no longer owns (members joined or came back; a stand-in's write) forgets it once every owner
says it holds it, as new or newer (``_trim``, every minute). A node that
starts asks every peer for the shards it should hold (``sync``): a process restarted under the same
name, before the others noticed it was gone, gets its shards back. Until then, a primary asked for
a shard it lacks fetches it from the other owners before it answers.

A lone node (no mesh) is one member owning everything: the same code, no peers.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import orjson
import trio

from mesh import PeerUnreachable
from mesh.ring import HashRing

from ..observe.metrics import counter, gauge
from .backends import HISTORY_BACKENDS, HistoryBackend
from .journal import HistoryJournal
from .ops import CREATING, OPERATIONS, HistoryOps
from .shards import RESPONSE, Change, MemoryShards
from .store import (HistoryConfig, ItemPage, RecordTooLarge, StorageQuotaExceeded, StoredResponse, StoreUnavailable,
                    stored_json)
from .wire import (HISTORY_MARK, BadFrame, change_from_wire, change_to_wire, changes_from_wire, operation_from_wire,
                   pack, unpack)

log = logging.getLogger("gateway.history")

OWNERS = 3  # a shard's primary and two replicas, on three different nodes when there are three
SPARES_TRIED_MAX = 2  # stand-ins asked, one after the other, when owners do not take a write
SYNC_PAGE_BYTES = 2 * 1024 * 1024  # one answer to "sync": well inside a mesh frame (8 MiB)
HAVE_BATCH_MAX = 4096  # shards asked about in one "have" (~40 bytes each): well inside a mesh frame


@dataclasses.dataclass(frozen=True)
class ReplicationConfig:
    # A peer's answer to an operation, replication included (the primary waits for its replicas).
    operation_timeout_s: float = 2.0
    # All of an operation's tries (owners, then stand-ins): under the 10 s a client may wait in the
    # chaos checks, and well under any SDK's timeout.
    operation_deadline_s: float = 5.0
    # One replica's answer to a change. Shorter than the operation's so a dead replica is given up
    # on while the caller still waits.
    replicate_timeout_s: float = 0.75
    # After a ring change, wait this long before handing shards off: SWIM changes often come in bursts.
    handoff_settle_s: float = 1.0
    # How often a node looks for copies it holds but no longer owns (members joined or came back, a stand-in's
    # write): each is forgotten once every owner holds it. A pass places every shard id held: 3.2 us each, 32 ms
    # for 10,000 on a 6-member ring (a scratch timing of ``placement``, 2026-11-28), skipped while nothing changed.
    trim_interval_s: float = 60.0
    repair_interval_s: float = 1.0
    sync_timeout_s: float = 10.0


class ClusterView(Protocol):
    """What the store needs from the mesh (``gateway.cluster.ClusterState`` provides it)."""

    node_name: str

    @property
    def ring(self) -> HashRing: ...
    @property
    def ring_changed(self) -> trio.Event: ...
    async def request_peer(self, name: str, payload: bytes, timeout_s: float) -> bytes: ...
    def serve_requests(self, mark: bytes, handler: Callable[[bytes], Any]) -> None: ...
    def machine_of(self, member: str) -> str: ...
    def owners(self, key: str, count: int, ring: HashRing | None = None) -> list[str]: ...
    def walk(self, key: str, ring: HashRing | None = None) -> list[str]: ...
    def known_members(self) -> list[str]: ...


@dataclasses.dataclass
class ReplicationStats:
    bad_frames: int = 0
    replica_failures: int = 0
    repaired: int = 0
    handed_off: int = 0
    synced: int = 0  # shards received from peers when this node caught up with them
    peers_synced: int = 0  # peers this node caught up with (once each, when it first sees them)
    fetched: int = 0
    trimmed: int = 0  # copies forgotten here: every owner held them and this node no longer is one


class MemoryHistory:
    def __init__(self, config: HistoryConfig = HistoryConfig(), cluster: ClusterView | None = None,
                 replication: ReplicationConfig = ReplicationConfig(),
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.shards = MemoryShards(config)
        self.ops = HistoryOps(self.shards)
        self.cluster = cluster
        self.replication = replication
        self.wall_clock = wall_clock
        self.name = cluster.node_name if cluster is not None else "local"
        self.stats = ReplicationStats()
        self._repairs: set[tuple[str, str]] = set()  # (member, shard id) that missed a change
        self._known: tuple[tuple[str, ...], HashRing] = ((), HashRing.build([]))
        self._trimmed_clean: tuple[HashRing, int] | None = None  # (ring, installs) of the last pass with nothing to do
        self.journal: HistoryJournal | None = None  # the shards on disk (keep_on_disk)
        if cluster is not None:
            cluster.serve_requests(HISTORY_MARK, self._serve)

    # -- HistoryStore -------------------------------------------------------------------------

    async def put_response(self, record: StoredResponse) -> None:
        await self._run("put_response", record.id, record.owner, [record.to_bytes()])

    def put_response_at_once(self, record: StoredResponse) -> bool:
        """Without a mesh the write is this node's alone (no copies to wait for, so no change for replicas
        either): the primary's write, run now. Awaited, the caller's cancel shield and the routing coroutines
        cost more than the write itself: ~110 k instructions a stored response against ~44 k at once
        (BENCHMARKS, Responses API)."""
        if self.cluster is not None:
            return False
        self.shards.create(record.id, RESPONSE, record.owner, record.to_bytes(), [], self.wall_clock())
        return True

    async def get_response(self, response_id: str, owner: str) -> StoredResponse | None:
        head = await self._run("get_response", response_id, owner, [])
        return StoredResponse.from_json(response_id, owner, orjson.loads(head)) if head is not None else None

    async def delete_response(self, response_id: str, owner: str) -> bool:
        return bool(await self._run("delete_response", response_id, owner, []))

    async def create_conversation(self, conversation: dict[str, Any], owner: str,
                                  items: "list[dict[str, Any]]") -> None:
        await self._run("create_conversation", conversation["id"], owner,
                        [stored_json(conversation), _encoded(items)])

    async def get_conversation(self, conversation_id: str, owner: str) -> dict[str, Any] | None:
        head = await self._run("get_conversation", conversation_id, owner, [])
        return orjson.loads(head) if head is not None else None

    async def update_conversation(self, conversation_id: str, owner: str,
                                  metadata: dict[str, str]) -> dict[str, Any] | None:
        head = await self._run("update_conversation", conversation_id, owner, [stored_json(metadata)])
        return orjson.loads(head) if head is not None else None

    async def delete_conversation(self, conversation_id: str, owner: str) -> bool:
        return bool(await self._run("delete_conversation", conversation_id, owner, []))

    async def add_items(self, conversation_id: str, owner: str, items: "list[dict[str, Any]]") -> bool:
        return bool(await self._run("add_items", conversation_id, owner, [_encoded(items)]))

    async def list_items(self, conversation_id: str, owner: str, after: str | None, limit: int,
                         descending: bool) -> ItemPage | None:
        page = await self._run("list_items", conversation_id, owner, [after or "", limit, descending])
        if page is None:
            return None
        items, has_more = page
        return ItemPage([orjson.loads(i) for i in items], bool(has_more))

    async def all_items(self, conversation_id: str, owner: str) -> "list[dict[str, Any]] | None":
        items = await self._run("all_items", conversation_id, owner, [])
        return [orjson.loads(i) for i in items] if items is not None else None

    async def get_item(self, conversation_id: str, owner: str, item_id: str
                       ) -> "tuple[bool, dict[str, Any] | None]":
        found, item = await self._run("get_item", conversation_id, owner, [item_id])
        return bool(found), orjson.loads(item) if item is not None else None

    async def delete_item(self, conversation_id: str, owner: str, item_id: str
                          ) -> "tuple[dict[str, Any] | None, bool]":
        head, deleted = await self._run("delete_item", conversation_id, owner, [item_id])
        return (orjson.loads(head) if head is not None else None), bool(deleted)

    # -- routing ------------------------------------------------------------------------------

    def placement(self, ring: HashRing, shard_id: str, owners_only: bool = True) -> list[str]:
        """The shard's owners on ``ring``: OWNERS members, one per machine (the cluster's one placement rule,
        HashRing.placement); unless ``owners_only``, then every other member."""
        if self.cluster is None:  # alone: every shard is this node's
            return ring.placement(shard_id, OWNERS, lambda member: member, owners_only)
        if owners_only:
            return self.cluster.owners(shard_id, OWNERS, ring)
        return self.cluster.walk(shard_id, ring)

    def _owners(self, shard_id: str) -> list[str]:
        if self.cluster is None:
            return [self.name]
        return self.placement(self.cluster.ring, shard_id) or [self.name]

    def _walk(self, shard_id: str) -> list[str]:
        """The owners, then the other members in ring order: where to look when the owners are down."""
        if self.cluster is None:
            return [self.name]
        return self.placement(self.cluster.ring, shard_id, owners_only=False) or [self.name]

    async def _run(self, name: str, shard_id: str, owner: str, args: list[Any]) -> Any:
        if not OPERATIONS[name][1] and self.name in self._owners(shard_id) and self.shards.peek(shard_id) is not None:
            return getattr(self.ops, name)(shard_id, owner, *args, self.wall_clock())
        # The owners, then two stand-ins; all within one deadline: a node cut off from the others meets
        # silence, not refusals, and its client must hear 504 long before it gives up.
        deadline = trio.current_time() + self.replication.operation_deadline_s
        for member in self._walk(shard_id)[:OWNERS + 2]:
            remaining_s = deadline - trio.current_time()
            if remaining_s <= 0:
                break
            if member == self.name:
                return await self.execute(name, shard_id, owner, args)
            try:
                answer = await self._request(member, ["op", name, shard_id, owner, args],
                                             min(self.replication.operation_timeout_s, remaining_s))
            except PeerUnreachable as e:
                log.debug("history: %s did not answer %s: %s", member, name, e)
                continue
            return _result(answer)
        raise StoreUnavailable(f"none of the members holding {shard_id} answered")

    async def execute(self, name: str, shard_id: str, owner: str, args: list[Any]) -> Any:
        """Runs an operation as the shard's primary: catch up with the shard first, replicate after. A shard
        found nowhere while one of its possible holders does not answer is unknown, not absent: 504."""
        if name not in CREATING and self.shards.peek(shard_id) is None and not self.shards.deleted(shard_id):
            if not await self._fetch(shard_id) and self.shards.peek(shard_id) is None:
                raise StoreUnavailable(f"{shard_id} is not here and a member that may hold it does not answer")
        outcome = getattr(self.ops, name)(shard_id, owner, *args, self.wall_clock())
        if not OPERATIONS[name][1]:
            return outcome
        result, change = outcome
        if change is not None:
            await self._replicate(change)
        return result

    async def _request(self, member: str, frame: list[Any], timeout_s: float) -> Any:
        if self.cluster is None:
            raise PeerUnreachable("no cluster")
        answer = await self.cluster.request_peer(member, HISTORY_MARK + pack(frame), timeout_s)  # PeerUnreachable
        try:
            reply = unpack(answer)
        except BadFrame as e:
            raise PeerUnreachable(f"{member}: {e}") from None
        if not isinstance(reply, list) or not reply:
            raise PeerUnreachable(f"{member}: an unreadable answer")
        return reply

    # -- replication --------------------------------------------------------------------------

    async def _replicate(self, change: Change) -> None:
        """Sends the change to the shard's other owners; when too few take it (owners dead but not yet off
        the ring), to the next members on the ring, which are the ones that become its owners once the
        dead are gone (Dynamo's sloppy quorum)."""
        if self.cluster is None:
            return
        ring = self.cluster.ring
        walk = [m for m in self.placement(ring, change.id, owners_only=False) if m != self.name]
        my_node = self.cluster.machine_of(self.name)
        targets = walk[:OWNERS - 1]
        # Copies count on other nodes only: a copy on this node's machine dies with it.
        spares = [m for m in walk[OWNERS - 1:] if self.cluster.machine_of(m) != my_node]
        # Two nodes, counting those that failed but may only be cut off (until reaped): a node alone on
        # its side of a partition must not acknowledge what the other side cannot read.
        needed = min(2, len({self.cluster.machine_of(m) for m in self.cluster.known_members()})) - 1
        acks = 0

        async def send(member: str, repair: bool) -> None:
            nonlocal acks
            if await self._push(member, change):
                acks += self.cluster.machine_of(member) != my_node
            elif repair:
                self.stats.replica_failures += 1
                self._repairs.add((member, change.id))

        async with trio.open_nursery() as nursery:
            for member in targets:
                nursery.start_soon(send, member, True)
        for spare in spares[:SPARES_TRIED_MAX]:
            if acks >= needed:
                break
            await send(spare, False)
        if acks < needed:
            raise StoreUnavailable(f"{change.id} could not be copied to another member: not acknowledged")

    async def _push(self, member: str, change: Change) -> bool:
        """Sends one change (and the whole shard if the member lacks the delta's base); True when it has it."""
        try:
            reply = await self._request(member, ["rep", [change_to_wire(change)]],
                                        self.replication.replicate_timeout_s)
            if reply[0] != "ok":
                return False
            if reply[1] == [True]:
                return True
            whole = self._state_of(change.id)
            if whole is None:
                return True  # gone here meanwhile: nothing left to copy
            reply = await self._request(member, ["rep", [change_to_wire(whole)]],
                                        self.replication.replicate_timeout_s)
            return reply[0] == "ok" and reply[1] == [True]
        except PeerUnreachable:
            return False

    def _state_of(self, shard_id: str) -> Change | None:
        shard = self.shards.peek(shard_id)
        if shard is not None:
            return shard.whole()
        version = self.shards.tombstone_version(shard_id)
        if version is None:
            return None
        return Change(shard_id, RESPONSE, "-", version, self.wall_clock(), 0, None, (), (), deleted=True)

    async def _fetch(self, shard_id: str) -> bool:
        """Copies the shard from a member that holds it. False when some member that may hold it did not
        answer: an owner among every member known or a stand-in on the ring that was asked, or any failed
        member not yet reaped (cut off, it may have taken writes as a stand-in on its side)."""
        if self.cluster is None:
            return True
        candidates = self.placement(self._known_ring(), shard_id)
        candidates += [m for m in self._walk(shard_id)[:OWNERS + 2] if m not in candidates]
        found: list[Change] = []
        silent = 0

        async def ask(member: str) -> None:  # all at once: one timeout, not one per silent member
            nonlocal silent
            try:
                reply = await self._request(member, ["fetch", shard_id], self.replication.replicate_timeout_s)
                change = change_from_wire(reply[1]) if reply[0] == "ok" and reply[1] is not None else None
            except (PeerUnreachable, BadFrame, IndexError):
                silent += 1
                return
            if change is not None:
                found.append(change)

        on_ring = set(self.cluster.ring.members)
        async with trio.open_nursery() as nursery:
            for member in candidates:
                if member == self.name:
                    continue
                if member not in on_ring:
                    # Held failed: it would not answer, only make the caller wait for its timeout (a day of
                    # lookups of absent ids after a crash: dead_reap_s). It still counts as silent.
                    silent += 1
                    continue
                nursery.start_soon(ask, member)
        if found:
            now = self.wall_clock()
            for change in found:  # the newest wins, whatever order they came in
                self.shards.apply(change, now)
            self.stats.fetched += 1
            return True
        return not silent and set(self.cluster.known_members()) <= set(self.cluster.ring.members)

    def _known_ring(self) -> HashRing:
        """The ring of every member known (failed ones included), built once per membership."""
        assert self.cluster is not None
        known = tuple(sorted(self.cluster.known_members()))
        if self._known[0] != known:
            self._known = (known, HashRing.build(known))
        return self._known[1]

    # -- background: repairs, handoff, start-up sync -------------------------------------------

    def metric_families(self) -> Iterator[Any]:
        shards, stats = self.shards, self.stats
        yield gauge("smg_history_records", "Stored responses and conversation items this node holds (owned and "
                    "replicated)", ["kind"], [(["response"], float(shards.responses)), (["item"], float(shards.items))])
        yield gauge("smg_history_bytes", "Bytes of stored responses and conversations this node holds", [],
                    [([], float(shards.bytes))])
        yield counter("smg_history_evicted", "Records forgotten to stay within the memory bounds", [],
                      [([], shards.evicted)])
        yield counter("smg_history_replication", "Replication events: copies a replica missed, repaired later, "
                      "handed to new owners, received when catching up, fetched by a primary, forgotten by a former owner", ["event"],
                      [(["replica_failed"], stats.replica_failures), (["repaired"], stats.repaired),
                       (["handed_off"], stats.handed_off), (["synced"], stats.synced), (["fetched"], stats.fetched),
                       (["trimmed"], stats.trimmed)])
        yield counter("smg_history_peers_synced", "Peers this node caught up with when it first saw them", [],
                      [([], stats.peers_synced)])
        yield counter("smg_history_bad_frames", "Peers' history requests refused as malformed", [],
                      [([], stats.bad_frames)])
        yield counter("smg_history_refused_changes", "Peers' shard changes dropped: stamped too far ahead of this "
                      "node's clock", [], [([], shards.refused_future)])

    def keep_on_disk(self, directory: Any, fsync_each: bool = False) -> Any:
        """Read the shards back from ``directory`` (before ``run``, before the node serves) and from now on write
        every change there as it is made (journal.py). Returns what was read (mesh.journal.Recovered)."""
        self.journal = HistoryJournal(directory, self.shards, fsync_each)
        return self.journal.restore(self.wall_clock())

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.journal is not None:
                nursery.start_soon(self.journal.run)
            if self.cluster is None:
                task_status.started()
                return
            self._ring_since = (self.cluster.ring, self.wall_clock())
            nursery.start_soon(self._watch_ring)
            nursery.start_soon(self._repair_loop)
            nursery.start_soon(self._handoff_loop)
            nursery.start_soon(self._trim_loop)
            task_status.started()

    async def _repair_loop(self) -> None:
        while True:
            await trio.sleep(self.replication.repair_interval_s)
            for member, shard_id in list(self._repairs):
                if member not in self._owners(shard_id):
                    self._repairs.discard((member, shard_id))  # it left the ring or the shard moved on
                    continue
                change = self._state_of(shard_id)
                if change is None or await self._push(member, change):
                    self._repairs.discard((member, shard_id))
                    self.stats.repaired += 1

    async def _handoff_loop(self) -> None:
        assert self.cluster is not None
        previous = self.cluster.ring
        synced_with: set[str] = set()
        while True:
            newcomers = [m for m in self.cluster.ring.members if m != self.name and m not in synced_with]
            if newcomers:
                await self._sync_from(newcomers)
                synced_with.update(newcomers)
            if self.cluster.ring is previous:  # rings are swapped whole: a change made meanwhile is not missed
                await self.cluster.ring_changed.wait()
            await trio.sleep(self.replication.handoff_settle_s)
            current, since = self._ring_since
            await self._hand_off(previous, current, since)
            previous = current

    async def _watch_ring(self) -> None:
        """Notes when each ring took effect here: writes after it were replicated to its owners."""
        assert self.cluster is not None
        while True:
            changed = self.cluster.ring_changed
            if self.cluster.ring is not self._ring_since[0]:
                self._ring_since = (self.cluster.ring, self.wall_clock())
            await changed.wait()

    async def _hand_off(self, previous: HashRing, current: HashRing, changed_at_s: float) -> None:
        """Pushes each shard this node should pass on to the owners that are new for it. Shards written
        since ``changed_at_s`` were replicated to the new owners already."""
        alive = set(current.members)
        pushes: dict[str, list[Change]] = {}
        for index, shard_id in enumerate(self.shards.ids()):
            if index % 512 == 511:
                await trio.lowlevel.checkpoint()  # a large store must not stall requests
            shard = self.shards.peek(shard_id)
            if shard is None or shard.written_at_s >= changed_at_s:
                continue
            old, new = self.placement(previous, shard_id), self.placement(current, shard_id)
            survivors = [m for m in old if m in alive]
            pusher = survivors[0] if survivors else self.name
            if pusher != self.name:
                continue
            for member in new:
                if member != self.name and member not in old:
                    pushes.setdefault(member, []).append(shard.whole())
        for member, changes in pushes.items():
            for batch in _batches(changes):
                try:
                    await self._request(member, ["rep", [change_to_wire(c) for c in batch]],
                                        self.replication.sync_timeout_s)
                    self.stats.handed_off += len(batch)
                except PeerUnreachable as e:
                    log.info("history: handing %d shards to %s failed: %s", len(batch), member, e)

    async def _trim_loop(self) -> None:
        while True:
            await trio.sleep(self.replication.trim_interval_s)
            await self._trim()

    async def _trim(self) -> None:
        """Forgets the copies this node holds but no longer owns, once every owner holds them (as new or newer).

        A node stops owning a shard when members join or come back after a partition, and a stand-in holds a
        write its owners could not take; its copy stayed until retention (a week): memory, and its tenant's
        count against the bounds here (a tenant at its bound stayed refused after the cluster grew). Each owner
        is asked which it holds ("have"); a copy is forgotten only when all of them do, the ring still does not
        make this node an owner, and the copy is the version they were asked about. One an owner lacks is kept,
        not pushed: getting it there is the hand-off's and the repairs' job, and an owner may lack it because it
        was deleted there and its tombstone is gone (a push would bring it back)."""
        assert self.cluster is not None
        ring = self.cluster.ring
        if self._trimmed_clean == (ring, self.shards.installed):
            return  # the last pass left no copy to forget, and neither the ring nor what is held changed since
        asks: dict[str, list[tuple[str, int]]] = {}
        for index, shard_id in enumerate(self.shards.ids()):
            if index % 512 == 511:
                await trio.lowlevel.checkpoint()  # a large store must not stall requests
            owners = self.placement(ring, shard_id)
            shard = self.shards.peek(shard_id)
            if shard is None or self.name in owners:
                continue
            for member in owners:
                asks.setdefault(member, []).append((shard_id, shard.version))
        self._trimmed_clean = (ring, self.shards.installed) if not asks else None
        confirmed: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
        for member, held in asks.items():
            for start in range(0, len(held), HAVE_BATCH_MAX):
                batch = held[start:start + HAVE_BATCH_MAX]
                try:
                    reply = await self._request(member, ["have", [list(entry) for entry in batch]],
                                                self.replication.sync_timeout_s)
                except PeerUnreachable as e:
                    log.info("history: asking %s which shards it holds failed: %s", member, e)
                    continue
                if reply[0] != "ok" or len(reply) != 2 or not isinstance(reply[1], list) or len(reply[1]) != len(batch):
                    continue
                for entry, has in zip(batch, reply[1]):
                    if has is True:
                        confirmed[entry].add(member)
        ring = self.cluster.ring  # as it is now: it may have changed while we asked
        for (shard_id, version), members in confirmed.items():
            shard = self.shards.peek(shard_id)
            owners = self.placement(ring, shard_id)
            if shard is not None and shard.version == version and self.name not in owners and members >= set(owners):
                self.shards.forget(shard_id)
                self.stats.trimmed += 1

    async def _sync_from(self, members: list[str]) -> None:
        for member in members:
            after = ""
            while True:
                try:
                    reply = await self._request(member, ["sync", self.name, after, SYNC_PAGE_BYTES],
                                                self.replication.sync_timeout_s)
                    changes = changes_from_wire(reply[1]) if reply[0] == "ok" else []
                    after = reply[2] if reply[0] == "ok" else None
                except (PeerUnreachable, BadFrame, IndexError) as e:
                    log.info("history: catching up from %s failed: %s", member, e)
                    break
                now = self.wall_clock()
                for change in changes:
                    self.shards.apply(change, now)
                self.stats.synced += len(changes)
                if not isinstance(after, str) or not after:
                    self.stats.peers_synced += 1
                    break

    # -- peers' requests ----------------------------------------------------------------------

    async def _serve(self, payload: bytes) -> bytes:
        try:
            frame = unpack(payload)
            if not isinstance(frame, list) or not frame:
                raise BadFrame("a frame is a non-empty list")
            return pack(await self._answer(frame))
        except (BadFrame, ValueError, TypeError, KeyError, IndexError) as e:
            # Checked frames carry values the operations still read (a conversation's metadata as JSON): what
            # they cannot read is the peer's fault, refused like a malformed frame.
            self.stats.bad_frames += 1
            log.debug("history: a peer's bad frame: %s", e)
            return pack(["bad", str(e)[:200]])

    async def _answer(self, frame: list[Any]) -> list[Any]:
        kind = frame[0]
        if kind == "op":
            name, shard_id, owner, args = operation_from_wire(frame)
            try:
                return ["ok", await self.execute(name, shard_id, owner, args)]
            except (RecordTooLarge, StorageQuotaExceeded) as e:
                return ["err", e.code, e.message]
            except StoreUnavailable as e:
                return ["unavailable", e.message]
        if kind == "rep" and len(frame) == 2:
            now = self.wall_clock()
            return ["ok", [self.shards.apply(c, now) for c in changes_from_wire(frame[1])]]
        if kind == "have" and len(frame) == 2 and isinstance(frame[1], list) and len(frame[1]) <= HAVE_BATCH_MAX:
            return ["ok", [self._holds(entry) for entry in frame[1]]]
        if kind == "fetch" and len(frame) == 2 and isinstance(frame[1], str):
            change = self._state_of(frame[1])
            return ["ok", change_to_wire(change) if change is not None else None]
        if kind == "sync" and len(frame) == 4:
            _, member, after, budget = frame
            if not (isinstance(member, str) and isinstance(after, str) and isinstance(budget, int)):
                raise BadFrame("sync: [\"sync\", member, after, budget]")
            return self._sync_page(member, after, min(max(budget, 1), SYNC_PAGE_BYTES))
        raise BadFrame(f"unknown request {kind!r}")

    def _holds(self, entry: Any) -> bool:
        """A "have" entry [shard id, version]: True when this node holds the shard at that version or newer (a
        later deletion included)."""
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], int) and not isinstance(entry[1], bool)):
            raise BadFrame("have: entries are [shard id, version]")
        shard = self.shards.peek(entry[0])
        held = max(shard.version if shard is not None else 0, self.shards.tombstone_version(entry[0]) or 0)
        return held >= entry[1] > 0

    def _sync_page(self, member: str, after: str, budget_bytes: int) -> list[Any]:
        """The shards ``member`` is an owner of (on this node's ring, with it on it), ids after ``after``."""
        ring = self.cluster.ring if self.cluster is not None else HashRing.build([self.name])
        if member not in ring.members:
            ring = HashRing.build([*ring.members, member])
        page, size = [], 0
        for shard_id in sorted(i for i in self.shards.ids() if i > after):
            if member not in self.placement(ring, shard_id):
                continue
            shard = self.shards.peek(shard_id)
            if shard is None:
                continue
            if page and size + shard.size_bytes > budget_bytes:
                return ["ok", page, page[-1][0]]
            page.append(change_to_wire(shard.whole()))
            size += shard.size_bytes
        return ["ok", page, None]


# The primary's refusals of a write, by code, as the node that asked raises them for its client.
_REFUSALS = {"record_too_large": RecordTooLarge, "storage_quota_exceeded": StorageQuotaExceeded}


def _encoded(items: "list[dict[str, Any]]") -> list[list[Any]]:
    return [[item["id"], stored_json(item)] for item in items]


def _result(reply: list[Any]) -> Any:
    if reply[0] == "ok" and len(reply) == 2:
        return reply[1]
    refusal = _REFUSALS.get(reply[1]) if reply[0] == "err" and len(reply) == 3 else None
    if refusal is not None:
        raise refusal(str(reply[2])[:500])
    if reply[0] == "unavailable":
        raise StoreUnavailable(str(reply[1]) if len(reply) > 1 else "a peer could not store it")
    raise StoreUnavailable(f"a peer answered {reply[0]!r}")


def _batches(changes: list[Change]) -> list[list[Change]]:
    batches: list[list[Change]] = [[]]
    size = 0
    for change in changes:
        weight = len(change.head or b"") + sum(len(v) for _, v in change.added) + 128
        if batches[-1] and size + weight > SYNC_PAGE_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(change)
        size += weight
    return [b for b in batches if b]


async def _start(section: None, history: HistoryConfig, cluster: Any, nursery: trio.Nursery) -> MemoryHistory:
    store = MemoryHistory(history, cluster)
    if history.data_dir is not None:
        recovered = store.keep_on_disk(history.data_dir, history.data_fsync)
        for problem in recovered.problems:
            log.warning("stored responses and conversations on disk: %s", problem)
        log.info("stored responses and conversations: %d shards read back from %s", len(store.shards),
                 history.data_dir)
    await nursery.start(store.run)
    return store


HISTORY_BACKENDS.add("memory", HistoryBackend(_start), "in the nodes' memory, each record on its owner on the ring and "
                     "the next two nodes (the default): no server to run, a node's death loses nothing acknowledged")

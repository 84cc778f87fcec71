"""One KV index for the whole cluster: each engine's events are followed by its ring owners (two
unless configured otherwise) and forwarded, resolved, to every other node.

Owner side: ``follow_kv_events`` applies an engine's batch to the local index
and hands the resolved ops (our block hashes, computed once) to ``published``;
they are kept in a bounded log and sent to every other alive member in small
coalesced requests over the mesh's sealed stream transport. Every owner sends:
a second copy of a batch is a duplicate, ignored by its sequence number.

Receiver side: batches are applied in each engine's order, exactly once. A
gap (a lost request, a node that was away) asks the sender to replay from the
first missing sequence number; an owner whose log no longer reaches back
answers with a snapshot of its index for that engine instead. A node that
starts (or restarts) asks an owner for every engine it knows nothing about:
it rebuilds the whole index from its peers, and the engines replay nothing.

A gap shows only when a later batch arrives: a node that missed the last
batches before an engine went quiet (a send that failed, a batch dropped while
the node was catching up after a restart) would stay behind for good. So every
CATCH_UP_INTERVAL_S each owner also tells the others the last sequence number it
published per engine (``kv_heads``, a few bytes); a node behind asks for a replay.
The heads sent are those of the round before: a batch still in flight has had a
round to arrive, and is not asked for twice.

When an owner dies, the ring changes; the new owner starts following the
engine from the last sequence number its own index applied.

Requests between members are ``K`` then a msgpack list (``peer_requests.py``).
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import msgpack
import trio

from mesh import PeerUnreachable

from ..routing.kv_index import OP_CLEAR, OP_REMOVE, OP_STORE, BatchOutcome, KvIndex

log = logging.getLogger("gateway.kv_sharing")

LOG_BATCHES_MAX = 4096  # per engine: how far back a peer can ask for a replay
# What a peer's item may hold (checked whole before any of it is applied): sequence numbers an engine's
# counter reaches in practice and that stay encodable after + 1; block sizes engines use (SGLang's page
# size, vLLM's block size: 1 to a few hundred tokens); ids as the registry makes them.
SEQUENCE_MAX = 2 ** 62
BLOCK_SIZE_MAX = 65_536
ENGINE_ID_CHARS_MAX = 128
BLOCKS_PER_ITEM_MAX = 1_000_000
FLUSH_INTERVAL_S = 0.02
REQUEST_BATCHES_MAX = 256
CATCH_UP_INTERVAL_S = 2.0
REQUEST_TIMEOUT_S = 5.0
HEADS_MAX = 4096  # engines in one kv_heads message (a peer's longer list is refused)
KV_MARK = b"K"


class KvSharing:
    def __init__(self, cluster: Any, index: KvIndex, followers: int) -> None:
        self.cluster = cluster
        self.index = index
        self.followers = followers  # ring owners per engine (GatewayConfig.kv_event_followers)
        self._log: dict[str, collections.deque] = {}
        self._outbox: dict[str, list] = collections.defaultdict(list)  # peer name -> pending items
        self._sending: set[str] = set()
        self._replaying: set[tuple[str, str]] = set()
        self._nursery: trio.Nursery | None = None
        self._pending = trio.Event()  # set when the outbox has something to send
        self._heads: list[list] = []  # [engine id, last published sequence], as of the last round
        self.forwarded = 0
        self.received = 0
        self.replays = 0
        self.refused = 0  # peers' items dropped as malformed or out of bounds
        cluster.serve_requests(KV_MARK, self.on_frame)

    # -- ownership --------------------------------------------------------

    def owners(self, engine_id: str) -> list[str]:
        return self.cluster.owners(engine_id, self.followers)  # one per machine

    def is_owner(self, engine_id: str) -> bool:
        owners = self.owners(engine_id)
        return not owners or self.cluster.node_name in owners

    def _peers(self) -> list[str]:
        return [n for n in self.cluster.ring.members if n != self.cluster.node_name]

    # -- owner side -----------------------------------------------------

    def published(self, engine_id: str, sequence: int, ops: list, snapshot: bool, block_size: int) -> None:
        item = [engine_id, sequence, snapshot, block_size, ops]
        log_ = self._log.get(engine_id)
        if log_ is None:
            log_ = self._log[engine_id] = collections.deque(maxlen=LOG_BATCHES_MAX)
        log_.append(item)
        for peer in self._peers():
            self._outbox[peer].append(item)
        self._pending.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            next_catch_up = trio.current_time()
            while True:
                with trio.move_on_at(next_catch_up):
                    await self._pending.wait()
                    await trio.sleep(FLUSH_INTERVAL_S)  # let batches that arrive together travel together
                self._pending = trio.Event()
                for peer, items in list(self._outbox.items()):
                    if items and peer not in self._sending:
                        self._outbox[peer] = []
                        self._sending.add(peer)
                        nursery.start_soon(self._send, peer, items)
                    elif items:
                        self._pending.set()  # a send to this peer is in flight: next round
                if trio.current_time() >= next_catch_up:
                    next_catch_up = trio.current_time() + CATCH_UP_INTERVAL_S
                    self._catch_up()
                    self._announce_heads()

    async def _send(self, peer: str, items: list) -> None:
        try:
            for start in range(0, len(items), REQUEST_BATCHES_MAX):
                chunk = items[start:start + REQUEST_BATCHES_MAX]
                request = KV_MARK + msgpack.packb(["kv_batches", self.cluster.node_name, chunk])
                await self.cluster.request_peer(peer, request, REQUEST_TIMEOUT_S)
                self.forwarded += len(chunk)
        except PeerUnreachable as e:  # (a member gone meanwhile included)
            log.debug("KV batches to %s not delivered (%s): it will ask for a replay", peer, e)
        finally:
            self._sending.discard(peer)

    def _announce_heads(self) -> None:
        """Send the last round's heads to every peer, and take this round's for the next."""
        heads, self._heads = self._heads, [[engine_id, log_[-1][1]] for engine_id, log_ in self._log.items()
                                           if log_ and self.is_owner(engine_id)][:HEADS_MAX]
        if heads and self._nursery is not None:
            request = KV_MARK + msgpack.packb(["kv_heads", self.cluster.node_name, heads])
            for peer in self._peers():
                self._nursery.start_soon(self._send_heads, peer, request)

    async def _send_heads(self, peer: str, request: bytes) -> None:
        try:
            await self.cluster.request_peer(peer, request, REQUEST_TIMEOUT_S)
        except PeerUnreachable as e:
            log.debug("KV heads to %s not delivered (%s): the next round's will be", peer, e)

    # -- receiver side --------------------------------------------------

    async def on_frame(self, payload: bytes) -> bytes:
        """A peer's request (after the mark): a msgpack list."""
        try:
            message = msgpack.unpackb(payload)
        except (ValueError, msgpack.UnpackException):
            return msgpack.packb(["bad_request"])
        if not isinstance(message, list):
            return msgpack.packb(["unknown"])
        return await self.on_request(message)

    async def on_request(self, message: list) -> bytes:
        kind = message[0] if message else None
        if kind == "kv_batches" and len(message) == 3 and isinstance(message[2], list):
            sender = str(message[1])
            for item in message[2]:
                self._apply(item, sender)
            return msgpack.packb(["ok"])
        if kind == "kv_heads" and len(message) == 3 and isinstance(message[2], list):
            self._behind_heads(str(message[1]), message[2])
            return msgpack.packb(["ok"])
        if kind == "kv_replay" and len(message) == 3 and isinstance(message[2], int):
            return msgpack.packb(["kv_items", self._replay_items(str(message[1]), message[2])])
        return msgpack.packb(["unknown"])

    def _apply(self, item: list, sender: str) -> None:
        """Apply one forwarded or replayed item; a gap asks the sender for a replay."""
        try:
            engine_id, sequence, snapshot, block_size, ops = _checked_item(item)
            if not snapshot and self.index.next_sequence(engine_id) == 0:
                # We know nothing of this engine yet (a node that just started or restarted): a batch
                # would only add to nothing, and the index would stay a fragment for good. Start from
                # the sender's whole view instead.
                self._ask_replay(engine_id, sender)
                return
            outcome = self.index.apply_ops(engine_id, sequence, ops, snapshot, block_size)
        except (ValueError, TypeError, IndexError) as e:
            self.refused += 1
            log.debug("dropped a malformed KV item from %s: %s", sender, e)
            return
        self.received += 1
        if snapshot and outcome is BatchOutcome.APPLIED:
            log.info("KV snapshot of %s at %d from %s applied (%d blocks now)", engine_id, sequence, sender,
                     self.index.block_count(engine_id))
        if outcome is BatchOutcome.GAP:
            self._ask_replay(engine_id, sender)  # no-op while a replay from that sender is running

    def _behind_heads(self, sender: str, heads: list) -> None:
        """An owner's last published sequence numbers: ask it for what we lack of the engines we follow
        through others (an owner reads its engine itself)."""
        if len(heads) > HEADS_MAX:
            self.refused += 1
            return
        for head in heads:
            if not (isinstance(head, list) and len(head) == 2 and isinstance(head[0], str)
                    and 0 < len(head[0]) <= ENGINE_ID_CHARS_MAX and _int_in(head[1], 0, SEQUENCE_MAX)):
                self.refused += 1
                continue
            engine_id, sequence = head
            if not self.is_owner(engine_id) and self.index.next_sequence(engine_id) <= sequence:
                self._ask_replay(engine_id, sender)

    def _replay_items(self, engine_id: str, from_sequence: int) -> list:
        log_ = self._log.get(engine_id)
        if from_sequence > 0 and log_ and log_[0][1] <= from_sequence:
            return [item for item in log_ if item[1] >= from_sequence]
        block_size, next_sequence, ops = self.index.export_ops(engine_id)
        if not next_sequence:
            return []
        return [[engine_id, next_sequence - 1, True, block_size, ops]]

    def _ask_replay(self, engine_id: str, owner: str) -> None:
        key = (engine_id, owner)
        if key in self._replaying or self._nursery is None:
            return
        self._replaying.add(key)
        self._nursery.start_soon(self._replay, engine_id, owner)

    async def _replay(self, engine_id: str, owner: str) -> None:
        try:
            self.replays += 1
            request = KV_MARK + msgpack.packb(["kv_replay", engine_id, self.index.next_sequence(engine_id)])
            answer = msgpack.unpackb(await self.cluster.request_peer(owner, request, REQUEST_TIMEOUT_S))
            if isinstance(answer, list) and len(answer) == 2 and answer[0] == "kv_items":
                for item in answer[1]:
                    self._apply(item, owner)
        except (PeerUnreachable, ValueError, msgpack.UnpackException) as e:
            log.debug("replay of %s from %s failed: %s", engine_id, owner, e)
        finally:
            self._replaying.discard((engine_id, owner))

    def _catch_up(self) -> None:
        """Engines we do not follow and know nothing of yet: ask an owner for everything."""
        for engine_id, spec in self.cluster.doc.workers().items():
            if not str(spec.get("url", "")).startswith("grpc://"):
                continue  # HTTP workers publish no KV events
            if not self.is_owner(engine_id) and self.index.next_sequence(engine_id) == 0:
                owners = [o for o in self.owners(engine_id) if o != self.cluster.node_name]
                if owners:
                    self._ask_replay(engine_id, owners[0])


def _int_in(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _checked_item(item: object) -> tuple[str, int, bool, int, list]:
    """A peer's ``[engine id, sequence, snapshot, block size, ops]``, every field and op checked (ValueError
    naming the first that is wrong), so that nothing of a bad item is applied."""
    if not isinstance(item, list) or len(item) != 5:
        raise ValueError("an item is [engine id, sequence, snapshot, block size, ops]")
    engine_id, sequence, snapshot, block_size, ops = item
    if not isinstance(engine_id, str) or not 0 < len(engine_id) <= ENGINE_ID_CHARS_MAX:
        raise ValueError(f"engine id: 1 to {ENGINE_ID_CHARS_MAX} characters")
    if not _int_in(sequence, 0, SEQUENCE_MAX) or not isinstance(snapshot, bool) \
            or not _int_in(block_size, 0, BLOCK_SIZE_MAX) or not isinstance(ops, list):
        raise ValueError("sequence, snapshot or block size out of range")
    blocks = 0
    for op in ops:
        if not isinstance(op, list) or not op or op[0] not in (OP_STORE, OP_REMOVE, OP_CLEAR):
            raise ValueError("an op is [OP_STORE, pairs], [OP_REMOVE, hashes] or [OP_CLEAR]")
        if op[0] == OP_CLEAR:
            if len(op) != 1:
                raise ValueError("OP_CLEAR takes nothing")
            continue
        if len(op) != 2 or not isinstance(op[1], list):
            raise ValueError("an op's payload is a list")
        blocks += len(op[1])
        if op[0] == OP_STORE:
            if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and isinstance(p[1], int)
                       for p in op[1]):
                raise ValueError("a stored block is an [our hash, engine hash] pair of integers")
        elif not all(isinstance(h, int) for h in op[1]):
            raise ValueError("removed blocks are engine hashes (integers)")
    if blocks > BLOCKS_PER_ITEM_MAX:
        raise ValueError(f"more than {BLOCKS_PER_ITEM_MAX} blocks in one item")
    return engine_id, sequence, snapshot, block_size, ops

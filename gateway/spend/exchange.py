"""The spend ledger between nodes and on disk: every node's rows reach every other node, and survive restarts.

Each round (``push_interval_s``) a node sends the rows it counted since the last round to every member on the
ring (``P``: ``[origin, rows]``), and appends every row that changed here (its own and its peers') to its journal
(mesh/journal.py) when it has a data directory. At start, and every ``pull_interval_s`` from one member drawn at
random, it pulls a peer's whole ledger in pages (``F``: ``page`` -> ``[{origin: rows}, more]``), which brings
back what a push missed (a partition, a restart). Rows merge as grow-only counters (ledger.py): repeats, reorders
and overlaps count nothing twice.

What a crash loses: the rows counted since the last round that no peer received (at most ``push_interval_s`` of
this node's requests); budgets are not among them (the rate limiter's counters hold those).

Frames: ``b"S"`` then one byte for the method, then msgpack. A peer's frame is checked row by row; one that does
not parse is dropped and counted (``bad_frames``).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from mesh import PeerUnreachable
from mesh.journal import Journal

from ..base import packing
from ..base.packing import pack
from .ledger import BadRows, SpendLedger

log = logging.getLogger("gateway.spend")

SPEND_MARK = b"S"
METHOD_PUSH = b"P"
METHOD_PULL = b"F"
PAGE_ROWS = 20_000  # rows per pulled page: ~2 MiB, under the mesh's 8 MiB frames
PAGES_MAX = 1_000
JOURNAL_NAME = "spend"
# Version history of the records (append-only): 1, 2026-11-29, the first.
RECORD_VERSION = 1
COMPACT_BYTES_MIN = 8 * 1024 * 1024
ROW_BYTES_ESTIMATE = 120


def unpack(data: bytes) -> Any:
    return packing.unpack(data, BadRows)


class SpendExchange:
    def __init__(self, ledger: SpendLedger, cluster: Any, clock: Any, push_interval_s: float = 1.0,
                 pull_interval_s: float = 60.0, peer_timeout_s: float = 2.0) -> None:
        self.ledger = ledger
        self.cluster = cluster
        self.clock = clock  # wall time: days are the calendar's
        self.push_interval_s = push_interval_s
        self.pull_interval_s = pull_interval_s
        self.peer_timeout_s = peer_timeout_s
        self.journal: Journal | None = None
        self.bad_frames = 0
        self.pushes_failed = 0
        self.pulls = 0
        self.compactions = 0
        self._forgot_on = ""
        self._work = trio.Event()
        self.after_pull: Any = None  # called when a pull brought rows (the service reconciles budgets)
        self.before_round: Any = None  # what brings the ledger up to date first (the service's fold)
        if cluster is not None:
            cluster.serve_requests(SPEND_MARK, self.on_peer_request)

    # -- on disk --------------------------------------------------------------

    def keep_on_disk(self, directory: Path, fsync_each: bool = False) -> list[str]:
        """Read the journal back into the ledger (before the node serves); the problems to say."""
        self.journal = Journal(directory, JOURNAL_NAME, RECORD_VERSION, fsync_each)
        recovered = self.journal.open()
        today = self.ledger.today(self.clock())
        refused = 0
        for record in recovered.records:
            try:
                origin, rows = _origin_rows(unpack(record))
                self.ledger.merge(origin, rows, today)
            except BadRows:
                refused += 1
        self.ledger.take_changed()  # read back: already on disk
        problems = list(recovered.problems)
        if refused:
            problems.append(f"{JOURNAL_NAME}: {refused} of {len(recovered.records)} records could not be read")
        log.info("spend: %d rows read back from %s", self.ledger.rows, directory)
        return problems

    def _journal(self) -> None:
        changed = self.ledger.take_changed()
        if self.journal is None:
            return
        for origin, rows in changed.items():
            self.journal.append(pack([origin, rows]))

    def _compact_wanted(self) -> bool:
        return self.journal is not None and self.journal.log_bytes > max(
            COMPACT_BYTES_MIN, 2 * ROW_BYTES_ESTIMATE * self.ledger.rows)

    async def _compact(self) -> None:
        assert self.journal is not None
        generation = self.journal.rotate()
        tables = self.ledger.wire()  # lists made here: the thread reads nothing that changes
        records = [pack([origin, rows]) for origin, rows in tables.items()]
        await trio.to_thread.run_sync(self.journal.write_snapshot, generation, records)
        self.compactions += 1

    # -- between nodes --------------------------------------------------------

    def _peers(self) -> list[str]:
        if self.cluster is None:
            return []
        return [m for m in self.cluster.ring.members if m != self.cluster.node_name]

    async def on_peer_request(self, payload: bytes) -> bytes:
        method, body = payload[:1], payload[1:]
        try:
            if method == METHOD_PUSH:
                origin, rows = _origin_rows(unpack(body))
                if self.ledger.merge(origin, rows, self.ledger.today(self.clock())):
                    self.wake()  # journaled at the next round
                return b"k"
            if method == METHOD_PULL:
                page = unpack(body)
                if isinstance(page, bool) or not isinstance(page, int) or not 0 <= page < PAGES_MAX:
                    raise BadRows("a page number")
                return pack(self._page(page))
            raise BadRows(f"unknown method {method!r}")
        except BadRows as e:
            self.bad_frames += 1
            log.debug("dropped a peer's spend frame: %s", e)
            return b""

    def _page(self, page: int) -> list[Any]:
        skip = page * PAGE_ROWS
        out: dict[str, list[Any]] = {}
        taken = 0
        for origin, row in self._all_rows():
            if skip:
                skip -= 1
                continue
            if taken == PAGE_ROWS:
                return [out, True]
            out.setdefault(origin, []).append(row)
            taken += 1
        return [out, False]

    def _all_rows(self) -> Iterator[tuple[str, list[Any]]]:
        for origin in sorted(self.ledger.origins):
            for row, values in list(self.ledger.origins[origin].items()):
                yield origin, [*row, *values]

    async def pull_from(self, peer: str) -> int:
        """A peer's whole ledger merged here; the rows taken."""
        taken = 0
        today = self.ledger.today(self.clock())
        for page in range(PAGES_MAX):
            answer = await self.cluster.request_peer(peer, SPEND_MARK + METHOD_PULL + pack(page),
                                                     self.peer_timeout_s)
            try:
                tables, more = unpack(answer)
                if not isinstance(tables, dict) or not isinstance(more, bool):
                    raise BadRows("a page is [tables, more]")
                for origin, rows in tables.items():
                    taken += self.ledger.merge(*_origin_rows([origin, rows]), today)
                if taken:
                    self.wake()
                    if self.after_pull is not None:
                        self.after_pull()
            except (BadRows, ValueError, TypeError) as e:
                self.bad_frames += 1
                log.debug("dropped %s's spend page: %s", peer, e)
                break
            if not more:
                break
        self.pulls += 1
        return taken

    async def _push(self, rows: list[Any]) -> None:
        frame = SPEND_MARK + METHOD_PUSH + pack([self.ledger.origin, rows])

        async def one(peer: str) -> None:
            try:
                await self.cluster.request_peer(peer, frame, self.peer_timeout_s)
            except PeerUnreachable:
                self.pushes_failed += 1  # the peer's next pull brings it back

        async with trio.open_nursery() as nursery:
            for peer in self._peers():
                nursery.start_soon(one, peer)

    async def round(self) -> None:
        """Send what this node counted, journal what changed, forget what is past the retention."""
        if self.before_round is not None:
            self.before_round()
        ledger = self.ledger
        today = ledger.today(self.clock())
        if today != self._forgot_on:  # a scan of every row: once a day
            ledger.forget_before(today)
            self._forgot_on = today
        rows = ledger.take_dirty()
        self._journal()
        if rows and self.cluster is not None:
            await self._push(rows)
        if self._compact_wanted():
            await self._compact()

    async def _pull_one(self) -> None:
        peers = self._peers()
        if not peers:
            return
        peer = random.choice(peers)
        try:
            await self.pull_from(peer)
        except PeerUnreachable as e:
            log.debug("spend: could not pull from %s: %s", peer, e)

    def wake(self) -> None:
        """Something to send or journal arrived (a request counted, a peer's rows): a round follows."""
        self._work.set()

    async def _follow_ring(self) -> None:
        """A member that (re)appears on the ring is pulled from at once: what it counted while it was away (a
        partition, a restart) comes back within a round trip, not at the next minute's pull."""
        seen = set(self.cluster.ring.members)
        while True:
            await self.cluster.ring_changed.wait()
            members = set(self.cluster.ring.members)
            for member in sorted(members - seen - {self.cluster.node_name}):
                try:
                    await self.pull_from(member)
                except PeerUnreachable as e:
                    log.debug("spend: could not pull from %s: %s", member, e)
            seen = members

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        if self.cluster is None:
            await self._rounds(task_status)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_ring)
            await self._rounds(task_status)

    async def _rounds(self, task_status: Any) -> None:
        """Rounds while there is work (a node without requests sleeps: no idle cost), and the pulls."""
        task_status.started()
        next_pull = trio.current_time()  # at once: a node that (re)starts catches up with its peers
        while True:
            wait_s = max(0.0, next_pull - trio.current_time()) if self.cluster is not None else math.inf
            with trio.move_on_after(wait_s):
                await self._work.wait()
                await trio.sleep(self.push_interval_s)  # a round's worth gathers
            self._work = trio.Event()
            try:
                await self.round()
                if self.cluster is not None and trio.current_time() >= next_pull:
                    next_pull = trio.current_time() + self.pull_interval_s
                    await self._pull_one()
            except OSError as e:  # the disk: counted in the log, the next round tries again
                log.warning("spend: could not write the journal: %s", e)


def _origin_rows(value: Any) -> tuple[str, list[Any]]:
    if not isinstance(value, list) or len(value) != 2:
        raise BadRows("a frame is [origin, rows]")
    origin, rows = value
    if not isinstance(origin, str) or not 0 < len(origin) <= 256 or not isinstance(rows, list):
        raise BadRows("an origin is a member's name, rows a list")
    return origin, rows

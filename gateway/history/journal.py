"""The memory backend's shards kept on disk (issue 62): stored responses and conversations survive a restart of
every node at once.

Every change this node's copy takes (a write it ran as primary, a replica's change, a deletion) and every copy
it forgets is appended to a journal (mesh/journal.py) as it happens, inside the call that made it: a write is
in the journal of each holder before the primary answers, since the primary answers after its replicas did.
At start, before the node serves, the records go back through ``MemoryShards.apply`` (a replica's path: the
bounds, retention and version rules hold as for a peer's change); a change older than the retention is dropped
there. Then the node catches up with its peers as any restarted node does (memory.py's sync).

Compaction: when the log outgrows twice what the shards hold (and at least ``COMPACT_BYTES_MIN``), the log is
rotated at once and the snapshot (every shard whole, every tombstone) written by a thread while requests go on.

Records, msgpack (wire.py's change encoding): ``["c", change]`` or ``["f", shard id]`` (a copy forgotten).
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from mesh.journal import Journal, Recovered

from .shards import Change, MemoryShards
from .wire import BadFrame, change_from_wire, change_to_wire, pack, unpack

log = logging.getLogger("gateway.history")

JOURNAL_NAME = "history"
# Version history of the records (append-only): 1, 2026-11-29, the first.
RECORD_VERSION = 1
COMPACT_BYTES_MIN = 16 * 1024 * 1024
COMPACT_RATIO = 2


class HistoryJournal:
    def __init__(self, directory: Path, shards: MemoryShards, fsync_each: bool = False) -> None:
        self.journal = Journal(directory, JOURNAL_NAME, RECORD_VERSION, fsync_each)
        self.shards = shards
        self.compact_wanted = trio.Event()
        self.compactions = 0

    def restore(self, now_s: float) -> Recovered:
        """Apply what the journal holds to the (empty) shards, then follow their changes from now on."""
        recovered = self.journal.open()
        refused = 0
        for record in recovered.records:
            try:
                kind, body = unpack(record)
                if kind == "c":
                    self.shards.apply(change_from_wire(body), now_s)
                elif kind == "f" and isinstance(body, str):
                    self.shards.forget(body)
                else:
                    raise BadFrame(f"unknown record {kind!r}")
            except (BadFrame, ValueError, TypeError) as e:
                refused += 1
                log.debug("a history journal record refused: %s", e)
        if refused:
            recovered.problems.append(f"{JOURNAL_NAME}: {refused} of {len(recovered.records)} records could not be "
                                      "read")
        self.shards.on_change = self._changed
        self.shards.on_forget = self._forgot
        return recovered

    def _append(self, record: bytes) -> None:
        self.journal.append(record)
        if self.journal.log_bytes > max(COMPACT_BYTES_MIN, COMPACT_RATIO * self.shards.bytes):
            self.compact_wanted.set()

    def _changed(self, change: Change) -> None:
        self._append(pack(["c", change_to_wire(change)]))

    def _forgot(self, shard_id: str) -> None:
        self._append(pack(["f", shard_id]))

    async def compact(self) -> None:
        """Replace the log by a snapshot of the shards: taken here (a list of immutable parts), written by a thread."""
        self.compact_wanted = trio.Event()
        generation = self.journal.rotate()
        changes = self.shards.snapshot()
        size = await trio.to_thread.run_sync(
            self.journal.write_snapshot, generation, (pack(["c", change_to_wire(c)]) for c in changes))
        self.compactions += 1
        log.info("history journal compacted: %d shards and tombstones, %d bytes", len(changes), size)

    async def run(self) -> None:
        """Compact whenever the log asks for it (memory.py runs this)."""
        while True:
            await self.compact_wanted.wait()
            await self.compact()

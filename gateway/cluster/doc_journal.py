"""The cluster's document kept on disk (issue 62): run-time API keys, the other settings and the workers survive
a restart of every node at once.

Every change the document takes (this node's writes, a peer's update, a compaction) is appended to a journal
(mesh/journal.py) as the update that made it, before the change is acknowledged: ``record`` runs inside the
call that changed the document, so an admin request that created a key is answered after its record is
written. At start, before the node serves or joins, the records are merged back through ``WorkerDoc.merge``:
the checks a peer's update gets, and the entries keep their stamps, so a key revoked on a peer while this node
was down stays revoked when the two meet (a value written again on restart would win with a new stamp). The
journal is compacted to one record, the whole document, when it outgrows a few times the document.

Health verdicts are in the document too and recorded like the rest (a health change is rare next to requests);
they are recomputed by the owners anyway.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mesh.journal import Journal, Recovered
from mesh.worker_doc import DocError, WorkerDoc

log = logging.getLogger("gateway.cluster")

JOURNAL_NAME = "cluster-doc"
# Version history of the records (append-only): 1, 2026-11-29: WorkerDoc updates as merge takes them
# (msgpack [epoch, pycrdt update]).
RECORD_VERSION = 1
# The log is compacted past this many times the document's size (and at least COMPACT_BYTES_MIN): the log
# stays within a small multiple of what it holds, and a busy document is not rewritten at every change.
COMPACT_RATIO = 4
COMPACT_BYTES_MIN = 1024 * 1024


class DocJournal:
    def __init__(self, directory: Path, doc: WorkerDoc, fsync_each: bool = False) -> None:
        self.journal = Journal(directory, JOURNAL_NAME, RECORD_VERSION, fsync_each)
        self.doc = doc
        self._written: bytes | None = None  # the document's state vector as of the last record
        self.compactions = 0

    def restore(self) -> Recovered:
        """Merge what the journal holds into the document (before anything else writes to it). Records the
        document refuses are counted among the problems, not fatal."""
        recovered = self.journal.open()
        refused = 0
        for record in recovered.records:
            try:
                self.doc.merge(record)
            except DocError as e:
                refused += 1
                log.debug("a journal record of the cluster document refused: %s", e)
        if refused:
            recovered.problems.append(f"{JOURNAL_NAME}: {refused} of {len(recovered.records)} records refused by "
                                      "the document's checks")
        self._written = self.doc.state_vector()
        return recovered

    def record(self) -> None:
        """Append what changed since the last record (nothing when nothing did); OSError when the disk refuses."""
        now = self.doc.state_vector()
        if now == self._written:
            return
        self.journal.append(self.doc.update_since(self._written))
        self._written = now
        if self.journal.log_bytes > max(COMPACT_BYTES_MIN, COMPACT_RATIO * self.doc.size_bytes()):
            self.journal.compact([self.doc.state()])
            self.compactions += 1

    def set_aside(self) -> "list[Path]":
        """What a start set aside and nobody accepted yet (torn tails, unreadable snapshots, files of another
        version): while any is there, the node may have lost keys it once held."""
        directory = self.journal.directory
        return sorted(p for p in directory.glob(f"{JOURNAL_NAME}.*")
                      if p.name.endswith((".torn", ".unreadable")) or ".kept-v" in p.name)

    def accept_loss(self) -> "list[Path]":
        """The operator's word that what was set aside is not needed: each is renamed ``*.accepted`` (kept, no
        longer counted). Returns the new names."""
        accepted = []
        for path in self.set_aside():
            target = path.with_name(path.name + ".accepted")
            path.rename(target)
            accepted.append(target)
        return accepted

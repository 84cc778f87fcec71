"""A journal on disk: an append-only log of records compacted by snapshots, read back whole at start.

What a node must not forget on a restart (the cluster's document, stored conversations: issue 62) is written
here as it is accepted, and read back before the node serves. The journal knows nothing of what its records
mean; its owner appends one record per change and, now and then, replaces the log by a snapshot of its state.

Files, for a journal ``NAME`` in a data directory::

    NAME.log.G    records appended since snapshot G (G = 0: since the beginning)
    NAME.snap.G   the owner's whole state as records, as of the moment log G was opened

Compaction (``rotate`` then ``write_snapshot``): log G+1 is opened first, so appends go on at once; the
snapshot G+1 (everything before log G+1) is written beside it to a temporary file, fsynced, renamed and the
directory fsynced; only then are snapshot G and log G removed. A crash at any step leaves a readable set: the
newest snapshot that is whole, and every log from its generation on. Reading replays exactly that.

Every file starts with a header::

    magic            b"SMGJ"
    format version   1 byte   this framing (FORMAT_VERSION)
    content version  2 bytes  the owner's record format (its own constant)

then records, each ``length`` (4 bytes, big-endian), ``crc32`` of the payload (4 bytes), payload. A record
is appended with one ``write(2)``: once it returns, the record survives the process (SIGKILL, OOM) since it
is in the kernel's page cache. ``fsync_each`` also fsyncs every record before ``append`` returns, so that a
power cut loses nothing acknowledged either, for a disk flush per change. Snapshots are always fsynced.

Reading is forgiving where it can be and loud always (``Recovered.problems``, one line each):

* a torn or corrupt record (a short tail, a checksum that does not match, a length past ``RECORD_BYTES_MAX``)
  ends that log: the records before it are kept, the rest of the file is moved to ``NAME.log.G.torn`` for
  the operator and the log truncated to its intact prefix, so new records follow valid ones;
* a snapshot that cannot be read is set aside (``.unreadable``) and the one before it, if still there, used;
* a file of a format or content version this code does not know is never read nor changed: every file of the
  journal is moved to ``NAME.kept-v<version>/`` and the journal starts empty (``Recovered.kept_aside``), so a
  node downgraded by mistake says so in one line and a later version can still read the data.

Files are 0600 in a 0700 directory: what they hold is as secret as the admin token.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

MAGIC = b"SMGJ"
# Version history of the framing (append-only): 1, 2026-11-29, the first.
FORMAT_VERSION = 1
_HEADER = struct.Struct(">4sBH")
_RECORD = struct.Struct(">II")
# One record: a whole conversation shard (its bytes bound is 16 MiB by default, history/store.py) or the
# cluster document (a 1 MiB value times a few): a length past this is corruption, not a record.
RECORD_BYTES_MAX = 256 * 1024 * 1024
_FILE = re.compile(r"(?P<name>[A-Za-z0-9_-]+)\.(?P<kind>log|snap)\.(?P<generation>[0-9]{1,18})")


class JournalError(Exception):
    """The journal's directory cannot be used (the message says why, in one line)."""


@dataclasses.dataclass
class Recovered:
    """What ``Journal.open`` read back."""

    records: list[bytes]  # the newest whole snapshot's records, then every later log's, in order
    problems: list[str]  # one line for each thing dropped or set aside
    had_files: bool  # the journal existed before (a node's later start, not its first)
    kept_aside: Path | None = None  # where files of an unknown version went (None: none were)

    @property
    def damaged(self) -> bool:
        """Something was there and not all of it could be read."""
        return bool(self.problems)


def _frame(payload: bytes) -> bytes:
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


class _UnknownVersion(Exception):
    def __init__(self, version: str) -> None:
        super().__init__(version)
        self.version = version


class Journal:
    """The journal ``name`` in ``directory`` (made 0700 when missing), its records in ``content_version``."""

    def __init__(self, directory: Path, name: str, content_version: int, fsync_each: bool = False) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(f"a journal's name is letters, digits, - and _: {name!r}")
        self.directory = Path(directory)
        self.name = name
        self.content_version = content_version
        self.fsync_each = fsync_each
        self.generation = 0
        self.log_bytes = 0  # of the current log, header included
        self.appended = 0  # records appended since open
        self._fd: int | None = None

    # -- reading ---------------------------------------------------------------------------

    def open(self) -> Recovered:
        """Read back what the journal holds, repair what can be repaired (the module's docstring), and open the
        log for appends. JournalError when the directory cannot be made or read."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            files = self._files()
        except OSError as e:
            raise JournalError(f"{self.directory}: {e.strerror or e}") from None
        recovered = Recovered([], [], had_files=bool(files))
        try:
            self._read(files, recovered)
        except _UnknownVersion as unknown:
            recovered.records.clear()
            recovered.kept_aside = self._keep_aside(files, unknown.version)
            recovered.problems.append(f"{self.name}: written in {unknown.version}, which this version does not "
                                      f"read: kept as it was in {recovered.kept_aside}, started empty")
            self.generation = 0
        self._open_log()
        return recovered

    def _files(self) -> dict[str, dict[int, Path]]:
        found: dict[str, dict[int, Path]] = {"log": {}, "snap": {}}
        for entry in os.scandir(self.directory):
            match = _FILE.fullmatch(entry.name)
            if match is not None and match["name"] == self.name:
                found[match["kind"]][int(match["generation"])] = Path(entry.path)
        return found if found["log"] or found["snap"] else {}

    def _read(self, files: dict[str, dict[int, Path]], recovered: Recovered) -> None:
        if not files:
            return
        for path in [*files["snap"].values(), *files["log"].values()]:  # nothing is used before all are known
            self._check_header(path)
        snapshot_generation = 0
        for generation in sorted(files["snap"], reverse=True):
            path = files["snap"][generation]
            records, torn = self._records(path.read_bytes())
            if torn is None:
                recovered.records.extend(records)
                snapshot_generation = generation
                break
            kept = path.with_name(path.name + ".unreadable")
            os.replace(path, kept)
            recovered.problems.append(f"{self.name}: snapshot {generation} is damaged ({torn}): set aside as "
                                      f"{kept.name}")
        logs = sorted(g for g in files["log"] if g >= snapshot_generation)
        for generation in logs:
            path = files["log"][generation]
            data = path.read_bytes()
            if len(data) < _HEADER.size:  # cut before its header was whole (a crash as it was opened)
                path.write_bytes(self._header())
                if data:
                    recovered.problems.append(f"{self.name}: log {generation} was cut in its header: started again")
                continue
            records, torn = self._records(data)
            recovered.records.extend(records)
            if torn is not None:
                intact = _HEADER.size + sum(_RECORD.size + len(r) for r in records)
                tail = path.with_name(path.name + ".torn")
                tail.write_bytes(data[intact:])
                os.chmod(tail, 0o600)
                with open(path, "r+b") as f:
                    f.truncate(intact)
                    os.fsync(f.fileno())
                recovered.problems.append(f"{self.name}: log {generation} is damaged after {len(records)} records "
                                          f"({torn}): {len(data) - intact} bytes dropped, kept in {tail.name}")
        self.generation = max([snapshot_generation, *logs])

    def _check_header(self, path: Path) -> None:
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return  # a file cut inside its header: read as damaged, not as another version
        magic, format_version, content_version = _HEADER.unpack(head)
        if magic != MAGIC:
            raise _UnknownVersion(f"something that is not a journal ({path.name})")
        if format_version != FORMAT_VERSION:
            raise _UnknownVersion(f"journal format {format_version} (this node writes {FORMAT_VERSION})")
        if content_version != self.content_version:
            raise _UnknownVersion(f"record format {content_version} (this node writes {self.content_version})")

    @staticmethod
    def _records(data: bytes) -> tuple[list[bytes], str | None]:
        """The whole records of a file's bytes, and why reading stopped early (None: it did not)."""
        if len(data) < _HEADER.size:
            return [], f"{len(data)} bytes, shorter than a header"
        records, offset, end = [], _HEADER.size, len(data)
        while offset < end:
            if end - offset < _RECORD.size:
                return records, f"a record cut in its header at byte {offset}"
            length, crc = _RECORD.unpack_from(data, offset)
            start = offset + _RECORD.size
            if length > RECORD_BYTES_MAX:
                return records, f"a record of {length} bytes at byte {offset}"
            if start + length > end:
                return records, f"a record cut short at byte {offset}"
            payload = data[start:start + length]
            if zlib.crc32(payload) != crc:
                return records, f"a checksum that does not match at byte {offset}"
            records.append(payload)
            offset = start + length
        return records, None

    def _keep_aside(self, files: dict[str, dict[int, Path]], version: str) -> Path:
        number = re.search(r"[0-9]+", version)
        kept = self.directory / f"{self.name}.kept-v{number.group() if number else 'unknown'}"
        suffix = 1
        while kept.exists():
            suffix += 1
            kept = kept.with_name(f"{kept.name.split('~')[0]}~{suffix}")
        kept.mkdir(mode=0o700)
        for path in [*files["snap"].values(), *files["log"].values()]:
            os.replace(path, kept / path.name)
        return kept

    # -- writing ---------------------------------------------------------------------------

    def _path(self, kind: str, generation: int) -> Path:
        return self.directory / f"{self.name}.{kind}.{generation}"

    def _header(self) -> bytes:
        return _HEADER.pack(MAGIC, FORMAT_VERSION, self.content_version)

    def _open_log(self) -> None:
        path = self._path("log", self.generation)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        size = os.fstat(fd).st_size
        if size == 0:
            os.write(fd, self._header())
            size = _HEADER.size
            self._sync_directory()  # the new file's name survives a power cut too
        self._fd, self.log_bytes = fd, size

    def append(self, payload: bytes) -> None:
        """One record, written (and with ``fsync_each`` fsynced) before this returns; OSError when the disk
        refuses (the caller must not acknowledge what it could not write)."""
        if len(payload) > RECORD_BYTES_MAX:
            raise ValueError(f"a journal record of {len(payload)} bytes, past {RECORD_BYTES_MAX}")
        header = _RECORD.pack(len(payload), zlib.crc32(payload))
        size = len(header) + len(payload)
        written = os.writev(self._fd, (header, payload))  # one call, no copy of the payload into a frame
        if written < size:  # a short write (a full disk, a signal): the rest, in order
            view = memoryview(header + payload)[written:]
            while view:
                view = view[os.write(self._fd, view):]
        if self.fsync_each:
            os.fsync(self._fd)
        self.log_bytes += size
        self.appended += 1

    def rotate(self) -> int:
        """Start the next log (appends go there from now on) and return its generation: the snapshot of the
        owner's state as of now is to be written under it (``write_snapshot``)."""
        os.fsync(self._fd)  # what the snapshot will cover must not be lost while it is written
        os.close(self._fd)
        self.generation += 1
        self._open_log()
        return self.generation

    def write_snapshot(self, generation: int, records: Iterable[bytes]) -> int:
        """Write the snapshot of ``generation`` (everything before its log) durably, then remove what it replaces.
        Touches only files: it may run in a thread while appends go on. Returns its size in bytes."""
        path = self._path("snap", generation)
        temporary = path.with_name(path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        size = 0
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(self._header())
                size += _HEADER.size
                for record in records:
                    frame = _frame(record)
                    f.write(frame)
                    size += len(frame)
                f.flush()
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        self._sync_directory()
        for kind in ("snap", "log"):
            for older in range(generation - 1, -1, -1):
                try:
                    os.unlink(self._path(kind, older))
                except FileNotFoundError:
                    if older < generation - 1:
                        break  # removed at an earlier compaction: nothing older is left either
        return size

    def compact(self, records: Iterable[bytes]) -> int:
        """``rotate`` and ``write_snapshot`` at once, for a state small enough to write where it is."""
        return self.write_snapshot(self.rotate(), records)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

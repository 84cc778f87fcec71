"""The cluster's worker registry as a pycrdt document, with its history kept bounded. No I/O.

Three maps: ``workers`` (worker id -> spec: url, kind, model, labels),
``health`` (worker id -> healthy, circuit state, load summary, written only
by the worker's owner on the ring) and ``settings`` (cluster-wide settings
changed at run time, such as the rate limits: name -> {"value": ...}). Every value is a JSON object stamped with
``t`` (a hybrid logical clock: wall milliseconds, ticked past anything seen)
and ``by`` (the writing node). A removal is a tombstone value, not a deleted
key, so "removed at t" can win against "registered at an earlier t" wherever
the two meet.

Replication: a local write returns the update (a state-vector delta) to
broadcast; ``merge`` applies one from a peer; ``state`` is the whole document
for push-pull (a joining node gets everything at once). Updates are
idempotent and commute: the order and the number of deliveries do not matter.

Bounded history. A long-lived pycrdt document grows with every overwrite
(~11 bytes per write when several nodes take turns, measured: 10,000 health
flaps from two writers make 115 KB). So the document has an epoch: when it
outgrows ``compact_bytes`` a node starts epoch+1 from the current values alone
(tombstones older than ``tombstone_s`` dropped) and sends it whole. A node
that receives a newer epoch adopts it, then re-applies its own writes that the
new epoch does not reflect yet (their stamp is newer than the entry there), so
a write racing with the compaction is not lost. Two nodes compacting at once
create two docs of the same epoch, which merge like any updates.

What a peer may send (``merge``), checked before anything changes: an epoch from 0 to
``EPOCH_MAX``, and a document whose every entry is a JSON object under a bounded key, stamped
with an integer time no further than ``stamp_ahead_max_s`` past our wall clock (members' clocks
agree far better than that; the gossip's replay window already requires 120 s). The update is
applied to a trial copy first and adopted only when every entry passes, so a frame that fails
(garbage, a stamp of 2^64 - 1, an epoch that would overflow what msgpack encodes) leaves the
document exactly as it was: the caller drops and counts it. The trial copy is a shadow kept in step
with the document (brought up to date with our own writes by a state-vector delta before each merge),
and only the entries the update changed are checked: a merge costs two applies of the update, not a
copy of the document. Arithmetic on the epoch saturates:
at ``EPOCH_MAX`` the document stops compacting rather than computing a number it cannot send.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import msgpack
import orjson
import pycrdt

COMPACT_BYTES_DEFAULT = 64 * 1024
TOMBSTONE_S_DEFAULT = 3600.0  # a removal is remembered this long, then forgotten at a compaction
MAPS = ("workers", "health", "settings")
# A compaction every 64 KiB of history: 2^31 of them is ~128 TiB of writes, more than a cluster makes.
EPOCH_MAX = 2 ** 31 - 1
# A stamp further ahead of our clock than this is refused: a peer's clock cannot be that wrong, and an
# adopted stamp near 2^64 would push our own clock (and the next stamp we encode) past what fits.
STAMP_AHEAD_MAX_S = 600.0
KEY_CHARS_MAX = 256  # worker ids, setting names ("api_key:<id>")
VALUE_BYTES_MAX = 1024 * 1024  # one entry's JSON (a setting holding every rate limit is the largest)
ENTRIES_PER_MAP_MAX = 100_000
NODE_CHARS_MAX = 256  # the "by" of an entry: a member's name


class DocError(Exception):
    """A peer's payload cannot be read (it is dropped)."""


@dataclasses.dataclass
class _OwnWrite:
    value: dict[str, Any]


class WorkerDoc:
    def __init__(self, node: str, compact_bytes: int = COMPACT_BYTES_DEFAULT,
                 tombstone_s: float = TOMBSTONE_S_DEFAULT, clock=time.time,
                 stamp_ahead_max_s: float = STAMP_AHEAD_MAX_S) -> None:
        self.node = node
        self.compact_bytes = compact_bytes
        self.tombstone_s = tombstone_s
        self.stamp_ahead_max_s = stamp_ahead_max_s
        self._clock = clock
        self._hlc = 0
        self.epoch = 0
        self._doc, self._maps = self._new_doc()
        # The document's entries as raw JSON text, as of the last merge or write: what an update changed is
        # what differs from these in the shadow after it (pycrdt's own change events panicked in yrs on
        # some update orders, pycrdt 0.14 / yrs 0.28, so they are not used).
        self._raw: dict[str, dict[str, str]] = {name: {} for name in MAPS}
        # What the last merge changed, by map: the keys whose entry is new, different or gone.
        self.changed: dict[str, set[str]] = {}
        self._shadow = self._new_shadow()
        # Our writes not yet known to be superseded: re-applied after an epoch change.
        self._own: dict[tuple[str, str], _OwnWrite] = {}
        self.compactions = 0

    # -- reading --------------------------------------------------------

    def workers(self) -> dict[str, dict[str, Any]]:
        """Registered (not removed) workers: id -> spec."""
        return {k: v for k, v in self._items("workers") if not v.get("removed")}

    def health(self) -> dict[str, dict[str, Any]]:
        return dict(self._items("health"))

    def get(self, map_name: str, key: str) -> dict[str, Any] | None:
        raw = self._maps[map_name].get(key)
        if raw is None:
            return None
        try:
            value = orjson.loads(raw)
        except (orjson.JSONDecodeError, TypeError):
            return None  # a value a peer wrote that we cannot read counts as absent
        return value if isinstance(value, dict) else None

    def size_bytes(self) -> int:
        return len(self._doc.get_update())

    def state_vector(self) -> bytes:
        """What this document has seen (changes whenever a new update is applied)."""
        return msgpack.packb([self.epoch, self._doc.get_state()])

    def state(self) -> bytes:
        """The whole document, for push-pull."""
        return msgpack.packb([self.epoch, self._doc.get_update()])

    def update_since(self, state_vector: bytes | None) -> bytes:
        """What changed since ``state_vector`` (one ``state_vector()`` returned), as ``merge`` takes it: a delta
        within the same epoch, else the whole document (a journal keeps the document this way)."""
        if state_vector is not None:
            epoch, vector = msgpack.unpackb(state_vector)
            if epoch == self.epoch:
                return msgpack.packb([self.epoch, self._doc.get_update(vector)])
        return self.state()

    # -- writing --------------------------------------------------------

    def register(self, worker_id: str, spec: dict[str, Any]) -> bytes:
        return self._write("workers", worker_id, {**spec, "removed": False})

    def remove(self, worker_id: str) -> bytes:
        return self._write("workers", worker_id, {"removed": True})

    def set_health(self, worker_id: str, health: dict[str, Any]) -> bytes | None:
        """Write the owner's health verdict; None when nothing changed (no history spent).

        A new owner writes once even if the verdict is the same, so everyone sees who checks."""
        current = self.get("health", worker_id)
        if current is not None and current.get("by") == self.node and \
                {k: v for k, v in current.items() if k not in ("t", "by")} == health:
            return None
        return self._write("health", worker_id, dict(health))

    def set_setting(self, name: str, value: Any) -> bytes:
        return self._write("settings", name, {"value": value})

    def settings(self) -> dict[str, dict[str, Any]]:
        """name -> the stamped entry ({"value": ..., "t": ..., "by": ...})."""
        return dict(self._items("settings"))

    def setting(self, name: str) -> Any:
        entry = self.get("settings", name)
        return entry.get("value") if entry is not None else None

    def _tick(self, seen: int = 0) -> int:
        self._hlc = max(self._hlc + 1, int(self._clock() * 1000), seen)
        return self._hlc

    def _write(self, map_name: str, key: str, value: dict[str, Any]) -> bytes:
        stamped = {**value, "t": self._tick(), "by": self.node}
        before = self._doc.get_state()
        raw = orjson.dumps(stamped).decode()
        with self._doc.transaction():
            self._maps[map_name][key] = raw
        self._raw[map_name][key] = raw
        self._own[(map_name, key)] = _OwnWrite(stamped)
        return msgpack.packb([self.epoch, self._doc.get_update(before)])

    # -- replication ----------------------------------------------------

    def merge(self, payload: bytes) -> "list[bytes]":
        """Apply a peer's update or state. Returns updates to send on (re-applied writes, a compaction).

        Raises DocError, with the document unchanged, for anything outside the bounds above."""
        try:
            epoch, update = msgpack.unpackb(payload)
        except Exception as e:  # msgpack raises many types on garbage
            raise DocError(f"unreadable worker document payload: {e}") from None
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not isinstance(update, bytes):
            raise DocError("unreadable worker document payload: not [epoch, update]")
        if not 0 <= epoch <= EPOCH_MAX:
            raise DocError(f"epoch {epoch} outside 0..{EPOCH_MAX}")
        if epoch < self.epoch:
            return [self.state()]  # the sender is behind: hand it the current epoch
        # Applied to the shadow first: pycrdt may have applied part of an update before it fails, and an
        # entry we refuse must never reach the document others read from us.
        if epoch == self.epoch:
            self._apply(self._shadow, self._doc.get_update(self._shadow.get_state()))  # our writes since
            known = self._raw
        else:
            self._shadow = self._new_shadow()  # a new epoch starts from the sender's document alone
            known = {name: {} for name in MAPS}
        seen = self._shadow.get_state()
        try:
            self._apply(self._shadow, update)
            if epoch == self.epoch and self._shadow.get_state() == seen:
                # Nothing new (gossip delivers most updates several times): no entry to check. An update
                # waiting for one it depends on is kept by both documents and checked when it lands.
                self._apply(self._doc, update)
                self.changed = {}
                return self._reapply_own()  # (a deletion moves no state vector: ours are written again)
            after = {name: dict(self._shadow.get(name, type=pycrdt.Map).items()) for name in MAPS}
            newest = self._check({name: {k: v for k, v in entries.items() if known[name].get(k) != v}
                                  for name, entries in after.items()}, after)
        except DocError:
            self._shadow = self._new_shadow(self._doc)
            raise
        self.changed = {name: {k for k, v in entries.items() if self._raw[name].get(k) != v}
                        | (self._raw[name].keys() - entries.keys()) for name, entries in after.items()}
        if epoch > self.epoch:
            self.epoch = epoch
            self._doc, self._maps = self._new_doc()
        self._apply(self._doc, update)  # the shadow's state before it was ours: the same outcome
        self._raw = after
        self._tick(newest)
        # pycrdt settles concurrent writes to one key by client id; we want the newest stamp
        # to win, so a writer whose newer value lost re-writes it (and one that sees a newer
        # stamp than its own stops caring). After an epoch change this also restores our
        # writes that raced with the compaction.
        out = self._reapply_own()
        self._forget_superseded()
        return out

    def maybe_compact(self) -> bytes | None:
        """Start a new epoch if the document outgrew its bound; returns the state to send."""
        if self.size_bytes() <= self.compact_bytes or self.epoch >= EPOCH_MAX:
            return None  # at EPOCH_MAX (never reached but by a peer's doing) the history just grows
        now_ms = int(self._clock() * 1000)
        values = {name: [(k, v) for k, v in self._items(name)
                         if not (v.get("removed") and now_ms - v.get("t", 0) > self.tombstone_s * 1000)]
                  for name in MAPS}
        self.epoch += 1
        self._doc, self._maps = self._new_doc()
        with self._doc.transaction():
            for name, items in values.items():
                for k, v in items:
                    self._maps[name][k] = orjson.dumps(v).decode()
        self._raw = {name: dict(self._maps[name].items()) for name in MAPS}
        self._shadow = self._new_shadow(self._doc)
        self.compactions += 1
        return self.state()

    # -- internals ------------------------------------------------------

    @staticmethod
    def _new_doc() -> tuple[pycrdt.Doc, dict[str, pycrdt.Map]]:
        doc = pycrdt.Doc()
        return doc, {name: doc.get(name, type=pycrdt.Map) for name in MAPS}

    def _items(self, map_name: str):
        for k, raw in self._maps[map_name].items():
            try:
                value = orjson.loads(raw)
            except (orjson.JSONDecodeError, TypeError):
                continue  # a value we cannot read is skipped, not fatal
            if isinstance(value, dict):
                yield k, value

    @staticmethod
    def _apply(doc: pycrdt.Doc, update: bytes) -> None:
        try:
            doc.apply_update(update)
        except Exception as e:  # pycrdt raises ValueError/RuntimeError on a bad update
            raise DocError(f"bad worker document update: {e}") from None
        except BaseException as e:
            # A panic in pycrdt's Rust code reaches Python as pyo3's PanicException, a BaseException (it is
            # not importable by name): one crafted update must not end the process through it.
            if type(e).__name__ != "PanicException":
                raise
            raise DocError(f"the worker document update made pycrdt panic: {e}") from None

    @staticmethod
    def _new_shadow(like: pycrdt.Doc | None = None) -> pycrdt.Doc:
        shadow = pycrdt.Doc()
        if like is not None:
            shadow.apply_update(like.get_update())
        return shadow

    def _check(self, changed: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> int:
        """Every entry the update added or changed within bounds (DocError naming the first that is
        not); returns the newest stamp among them."""
        stamp_max = int((self._clock() + self.stamp_ahead_max_s) * 1000)
        newest = 0
        for name, entries in changed.items():
            if len(after[name]) > ENTRIES_PER_MAP_MAX:
                raise DocError(f"{name}: more than {ENTRIES_PER_MAP_MAX} entries")
            for key, raw in entries.items():
                if not isinstance(key, str) or not 0 < len(key) <= KEY_CHARS_MAX:
                    raise DocError(f"{name}: a key of 1 to {KEY_CHARS_MAX} characters")
                if not isinstance(raw, str) or len(raw) > VALUE_BYTES_MAX:
                    raise DocError(f"{name}[{key}]: not a JSON text of at most {VALUE_BYTES_MAX} bytes")
                try:
                    value = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    raise DocError(f"{name}[{key}]: not JSON") from None
                if not isinstance(value, dict):
                    raise DocError(f"{name}[{key}]: not an object")
                stamp, by = value.get("t"), value.get("by")
                if not isinstance(stamp, int) or isinstance(stamp, bool) or not 0 <= stamp <= stamp_max:
                    raise DocError(f"{name}[{key}]: stamp {stamp!r} is not a time up to "
                                   f"{self.stamp_ahead_max_s:g} s ahead of ours")
                if not isinstance(by, str) or len(by) > NODE_CHARS_MAX:
                    raise DocError(f"{name}[{key}]: 'by' is not a member name")
                newest = max(newest, stamp)
        return newest

    @staticmethod
    def _stamp(value: dict[str, Any]) -> tuple[int, str]:
        return value.get("t", 0), value.get("by", "")

    def _reapply_own(self) -> list[bytes]:
        out = []
        for (map_name, key), own in list(self._own.items()):
            current = self.get(map_name, key)
            if current is None or self._stamp(current) < self._stamp(own.value):
                before = self._doc.get_state()
                raw = self._raw[map_name][key] = orjson.dumps(own.value).decode()
                with self._doc.transaction():
                    self._maps[map_name][key] = raw
                out.append(msgpack.packb([self.epoch, self._doc.get_update(before)]))
        return out

    def _forget_superseded(self) -> None:
        old_ms = int(self._clock() * 1000) - self.tombstone_s * 1000
        for (map_name, key), own in list(self._own.items()):
            current = self.get(map_name, key)
            superseded = current is not None and self._stamp(current) > self._stamp(own.value)
            if superseded or own.value["t"] < old_ms:  # settled long ago: every node has it by now
                del self._own[(map_name, key)]

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


class DocError(Exception):
    """A peer's payload cannot be read (it is dropped)."""


@dataclasses.dataclass
class _OwnWrite:
    value: dict[str, Any]


class WorkerDoc:
    def __init__(self, node: str, compact_bytes: int = COMPACT_BYTES_DEFAULT,
                 tombstone_s: float = TOMBSTONE_S_DEFAULT, clock=time.time) -> None:
        self.node = node
        self.compact_bytes = compact_bytes
        self.tombstone_s = tombstone_s
        self._clock = clock
        self._hlc = 0
        self.epoch = 0
        self._doc, self._maps = self._new_doc()
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
        with self._doc.transaction():
            self._maps[map_name][key] = orjson.dumps(stamped).decode()
        self._own[(map_name, key)] = _OwnWrite(stamped)
        return msgpack.packb([self.epoch, self._doc.get_update(before)])

    # -- replication ----------------------------------------------------

    def merge(self, payload: bytes) -> "list[bytes]":
        """Apply a peer's update or state. Returns updates to send on (re-applied writes, a compaction)."""
        try:
            epoch, update = msgpack.unpackb(payload)
            if not isinstance(epoch, int) or not isinstance(update, bytes):
                raise ValueError("bad shape")
        except Exception as e:  # msgpack raises many types on garbage
            raise DocError(f"unreadable worker document payload: {e}") from None
        if epoch < self.epoch:
            return [self.state()]  # the sender is behind: hand it the current epoch
        if epoch > self.epoch:
            self.epoch = epoch
            self._doc, self._maps = self._new_doc()
        self._apply(update)
        # pycrdt settles concurrent writes to one key by client id; we want the newest stamp
        # to win, so a writer whose newer value lost re-writes it (and one that sees a newer
        # stamp than its own stops caring). After an epoch change this also restores our
        # writes that raced with the compaction.
        out = self._reapply_own()
        self._forget_superseded()
        return out

    def maybe_compact(self) -> bytes | None:
        """Start a new epoch if the document outgrew its bound; returns the state to send."""
        if self.size_bytes() <= self.compact_bytes:
            return None
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

    def _apply(self, update: bytes) -> None:
        try:
            self._doc.apply_update(update)
        except Exception as e:  # pycrdt raises ValueError/RuntimeError on a bad update
            raise DocError(f"bad worker document update: {e}") from None
        for name in MAPS:
            for _, v in self._items(name):
                stamp = v.get("t", 0)
                if isinstance(stamp, int):
                    self._tick(stamp)

    @staticmethod
    def _stamp(value: dict[str, Any]) -> tuple[int, str]:
        return value.get("t", 0), value.get("by", "")

    def _reapply_own(self) -> list[bytes]:
        out = []
        for (map_name, key), own in list(self._own.items()):
            current = self.get(map_name, key)
            if current is None or self._stamp(current) < self._stamp(own.value):
                before = self._doc.get_state()
                with self._doc.transaction():
                    self._maps[map_name][key] = orjson.dumps(own.value).decode()
                out.append(msgpack.packb([self.epoch, self._doc.get_update(before)]))
        return out

    def _forget_superseded(self) -> None:
        old_ms = int(self._clock() * 1000) - self.tombstone_s * 1000
        for (map_name, key), own in list(self._own.items()):
            current = self.get(map_name, key)
            superseded = current is not None and self._stamp(current) > self._stamp(own.value)
            if superseded or own.value["t"] < old_ms:  # settled long ago: every node has it by now
                del self._own[(map_name, key)]

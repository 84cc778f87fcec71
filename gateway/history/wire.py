"""The history's peer protocol: msgpack frames after the ``H`` mark, each checked before it is used.

    ["op", name, shard_id, owner, args]     run an operation as the shard's primary
        -> ["ok", result] | ["err", code, message] | ["unavailable", message]
    ["rep", [change, ...]]                  changes from a primary -> ["ok", [applied, ...]]
                                            (False: a delta on a version this node lacks)
    ["fetch", shard_id]                     the whole shard -> ["ok", change or nil]
    ["sync", member, after, budget_bytes]   the shards ``member`` should hold, ids after ``after``
        -> ["ok", [change, ...], next_after or nil]

A change is ``[id, kind, owner, version, written_at_s, base_version, head, [[item_id, item], ...],
[removed_id, ...], deleted]``. Peers are authenticated by the mesh (sealed streams), yet a frame that
is not one of these, or breaks a bound, is refused as a whole (``BadFrame``) and counted.
"""

from __future__ import annotations

import math
from typing import Any

from ..base import packing
from ..base.packing import pack  # noqa: F401  (the history package packs through here)
from .ops import OPERATIONS
from .shards import KINDS, VERSION_MAX, Change
from .store import ID_CHARS_MAX, OWNER_CHARS_MAX

HISTORY_MARK = b"H"
CHANGES_PER_FRAME_MAX = 10_000
ITEMS_PER_CHANGE_MAX = 100_000
# A peer's version is taken only up to shards.VERSION_MAX, so ``version + 1`` here still fits the uint64
# msgpack encodes (a version of 2^64 - 1 from a peer would otherwise end the next write to that shard).
# Wall-clock seconds of a shard's last write: from 1970 to 2^34 s (the year 2514), finite.
WRITTEN_AT_MAX_S = float(2 ** 34)
LIST_LIMIT_ARG_MAX = 1_000_000  # list_items' page size from a peer (the API's own bound is 100)


class BadFrame(Exception):
    pass


def unpack(data: bytes) -> Any:
    return packing.unpack(data, BadFrame)


def change_to_wire(change: Change) -> list[Any]:
    return [change.id, change.kind, change.owner, change.version, change.written_at_s, change.base_version,
            change.head, [list(item) for item in change.added], list(change.removed), change.deleted]


def _text(value: Any, limit: int, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise BadFrame(f"{what}: a string of 1 to {limit} characters")
    return value


def change_from_wire(raw: Any) -> Change:
    if not isinstance(raw, list) or len(raw) != 10:
        raise BadFrame("a change is a list of 10 fields")
    shard_id, kind, owner, version, written_at, base, head, added, removed, deleted = raw
    _text(shard_id, ID_CHARS_MAX, "shard id")
    if kind not in KINDS:
        raise BadFrame(f"unknown shard kind {kind!r}")
    _text(owner, OWNER_CHARS_MAX, "owner")
    if not (isinstance(version, int) and isinstance(base, int) and not isinstance(version, bool)
            and not isinstance(base, bool) and 0 <= base < version <= VERSION_MAX):
        raise BadFrame(f"versions: 0 <= base < version <= {VERSION_MAX}")
    if not isinstance(written_at, float) or not math.isfinite(written_at) or not 0 <= written_at <= WRITTEN_AT_MAX_S:
        raise BadFrame(f"written_at: a float from 0 to {WRITTEN_AT_MAX_S:g}")
    if head is not None and not isinstance(head, bytes):
        raise BadFrame("head: bytes or nil")
    if not isinstance(added, list) or len(added) > ITEMS_PER_CHANGE_MAX or not all(
            isinstance(i, list) and len(i) == 2 and isinstance(i[0], str) and 0 < len(i[0]) <= ID_CHARS_MAX
            and isinstance(i[1], bytes) for i in added):
        raise BadFrame("added: [[item id, item bytes], ...]")
    if not isinstance(removed, list) or len(removed) > ITEMS_PER_CHANGE_MAX or not all(
            isinstance(i, str) for i in removed):
        raise BadFrame("removed: [item id, ...]")
    if not isinstance(deleted, bool):
        raise BadFrame("deleted: a boolean")
    if base == 0 and head is None and not deleted:
        raise BadFrame("a whole shard needs its head")
    return Change(shard_id, kind, owner, version, written_at, base, head, tuple((k, v) for k, v in added),
                  tuple(removed), deleted)


def changes_from_wire(raw: Any) -> list[Change]:
    if not isinstance(raw, list) or len(raw) > CHANGES_PER_FRAME_MAX:
        raise BadFrame(f"changes: a list of at most {CHANGES_PER_FRAME_MAX}")
    return [change_from_wire(c) for c in raw]


def operation_from_wire(frame: list[Any]) -> tuple[str, str, str, list[Any]]:
    """(name, shard id, owner, arguments) of an "op" frame, each checked against ``OPERATIONS``."""
    if len(frame) != 5:
        raise BadFrame("op: [\"op\", name, shard id, owner, args]")
    _, name, shard_id, owner, args = frame
    spec = OPERATIONS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise BadFrame(f"unknown operation {name!r}")
    _text(shard_id, ID_CHARS_MAX, "shard id")
    _text(owner, OWNER_CHARS_MAX, "owner")
    types, _ = spec
    if not isinstance(args, list) or len(args) != len(types) or not all(
            isinstance(a, t) and (t is not int or not isinstance(a, bool)) for a, t in zip(args, types)):
        raise BadFrame(f"{name}: arguments of types {[t.__name__ for t in types]}")
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and not 0 <= a <= LIST_LIMIT_ARG_MAX:
            raise BadFrame(f"{name}: a count from 0 to {LIST_LIMIT_ARG_MAX}")
        if isinstance(a, str) and len(a) > ID_CHARS_MAX:
            raise BadFrame(f"{name}: an id of at most {ID_CHARS_MAX} characters")
        if isinstance(a, list) and (len(a) > ITEMS_PER_CHANGE_MAX or not all(
                isinstance(i, list) and len(i) == 2 and isinstance(i[0], str) and 0 < len(i[0]) <= ID_CHARS_MAX
                and isinstance(i[1], bytes) for i in a)):
            raise BadFrame(f"{name}: items as [[item id, item bytes], ...]")
    return name, shard_id, owner, args

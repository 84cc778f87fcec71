"""A long prompt's token ids written into protobuf's packed encoding by whole-array operations, not through upb.

Why: upb fills a repeated uint32 field only from Python ints, one at a time. For a 7,800-token prompt the
request's ``input_ids.extend`` costs ~146 us and serializing them ~54 us more, on the event loop's thread, every
request (BENCHMARKS.md, "Long prompts"); a conversation resending its history pays it for the whole history each
turn. The ids packed into a uint32 array (``array.fromlist``, one C loop) and varint-encoded by numpy cost a
fraction of it (the figures: BENCHMARKS.md, "A long prompt's ids into the request").

How the engine still reads the message upb would have written: protobuf's encoding lets a message carry an embedded
message field more than once, and a parser merges the instances (protobuf.dev, "Encoding", "Last One Wins"). So
the request is serialized by upb without the field that holds the ids (``tokenized``), and that field follows,
written here: its other fields as upb serializes them, then the ids as one packed field. The varints are the
shortest (canonical), so the ids' bytes are exactly upb's.

Short prompts keep upb's path: below ``PACKED_IDS_MIN`` numpy's fixed cost per call is more than upb's per id.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

# Where numpy's whole-array operations (~17 us of fixed cost: a dozen calls) cost less than upb's ~19 ns an id: the
# two are even at ~1,500-1,700 ids (tests/bench/packed_ids.py).
PACKED_IDS_MIN = 2048

# Ids this encoder writes: up to four varint bytes (2^28 ids: every vocabulary there is by far). A larger id
# (never a real token; upb would write it in five bytes) sends the prompt through upb's path.
_IDS_LIMIT = 1 << 28

_LENGTH_DELIMITED = 2  # protobuf's wire type for embedded messages and packed repeated fields


def varint(value: int) -> bytes:
    """``value`` (>= 0) as protobuf's base-128 varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def packed_varints(ids: "list[int]") -> bytes | None:
    """The ids as a packed repeated field's payload (each id's shortest varint, in order); None when an id is
    outside 0 .. 2^28 - 1 (the caller takes upb's path, which says what is wrong with it)."""
    packed = array("I")
    try:
        packed.fromlist(ids)  # refuses what no uint32 holds: negative ids, ids of 2^32 and more
    except (OverflowError, TypeError):
        return None
    x = np.frombuffer(packed, dtype=np.uint32)
    if x.size and int(x.max()) >= _IDS_LIMIT:
        return None
    # Each id's four 7-bit groups, one to a byte (little-endian), with the continuation bit set on each byte another
    # follows; then only each id's first bytes are kept: byte k + 1 where byte k has a continuation bit. In place,
    # and np.compress rather than a boolean index (22 against 56 us for 7,800 ids): tests/bench/packed_ids.py.
    more = (x >= 0x80).view(np.uint8).astype(np.uint32) << 7
    more |= (x >= 0x4000).view(np.uint8).astype(np.uint32) << 15
    more |= (x >= 0x200000).view(np.uint8).astype(np.uint32) << 23
    spread = x & 0x7F
    spread |= (x << 1) & 0x7F00
    spread |= (x << 2) & 0x7F0000
    spread |= (x << 3) & 0x7F000000
    spread |= more
    more <<= 1  # a byte is kept where the byte before it continues, and every id's first
    more |= 1
    return np.compress(more.astype("<u4", copy=False).view(np.bool_),
                       spread.astype("<u4", copy=False).view(np.uint8)).tobytes()


class WithPromptIds:
    """A request serialized by upb without its prompt ids, followed by the field holding them (see above).

    Stands where the request message stood for the transports, which only serialize it."""

    __slots__ = ("message", "tail")

    def __init__(self, message: Any, tail: bytes) -> None:
        self.message = message
        self.tail = tail

    def SerializeToString(self, deterministic: bool = False) -> bytes:  # noqa: N802 - protobuf's name
        return self.message.SerializeToString(deterministic=deterministic) + self.tail


def with_prompt_ids(message: Any, holder_name: str, ids_name: str, ids: "list[int]") -> Any:
    """``message`` with ``ids`` in the repeated field ``ids_name`` of its embedded message ``holder_name`` (set
    even when ``ids`` is empty): the message itself for a short prompt, a ``WithPromptIds`` for a long one. Call
    it last: the holder's other fields are serialized now."""
    holder = getattr(message, holder_name)
    payload = packed_varints(ids) if len(ids) >= PACKED_IDS_MIN else None
    if payload is None:
        holder.SetInParent()
        getattr(holder, ids_name).extend(ids)
        return message
    ids_key = varint(holder.DESCRIPTOR.fields_by_name[ids_name].number << 3 | _LENGTH_DELIMITED)
    inner = holder.SerializeToString() + ids_key + varint(len(payload)) + payload
    message.ClearField(holder_name)
    holder_key = varint(message.DESCRIPTOR.fields_by_name[holder_name].number << 3 | _LENGTH_DELIMITED)
    return WithPromptIds(message, holder_key + varint(len(inner)) + inner)

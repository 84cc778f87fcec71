"""msgpack as the node's peer protocols use it (history, spend): strings as str, bytes as bytes, lists, only
string keys; anything unreadable raised as the caller's own error."""

from __future__ import annotations

from typing import Any

import msgpack


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes, error: "type[Exception]") -> Any:
    try:
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # msgpack's ExtraData, FormatError, ValueError and friends
        raise error(f"not msgpack: {e}") from None

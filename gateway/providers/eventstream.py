"""AWS's event stream encoding (``application/vnd.amazon.eventstream``), read as it arrives: how Bedrock's
ConverseStream sends its events.

A message, as AWS specifies it ("Event stream encoding", the Amazon Transcribe and S3 Select documentation):

    total length     4 bytes, big-endian: the whole message, these 4 bytes and the last 4 included
    headers length   4 bytes, big-endian
    prelude CRC      4 bytes: CRC-32 of the 8 bytes before it
    headers          each: name length (1 byte), name (UTF-8), value type (1 byte), value
    payload          the rest (Bedrock's: a JSON object)
    message CRC      4 bytes: CRC-32 of everything before it

Header values by type: 0 true, 1 false, 2 int8, 3 int16, 4 int32, 5 int64, 6 bytes (2-byte length), 7 string
(2-byte length), 8 timestamp (int64 milliseconds), 9 UUID (16 bytes). ``EventStreamDecoder.feed`` takes the body in
any pieces and returns the messages they complete as (headers, payload); a CRC that does not match, a length past
``message_bytes_max`` or a header it cannot read is a ``ProviderError`` (a broken or hostile stream ends here).
"""

from __future__ import annotations

import struct
import zlib

from .base import SERVER, ProviderError

# AWS's own limit on one message's payload is 16 MiB; with headers and framing, 16 MiB + a little.
MESSAGE_BYTES_MAX = 16 * 1024 * 1024 + 64 * 1024
_PRELUDE = struct.Struct(">III")
_FIXED = {2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}


def _broken(why: str) -> ProviderError:
    return ProviderError(SERVER, 502, f"the provider's event stream is broken: {why}")


def read_headers(data: bytes) -> dict[str, object]:
    headers: dict[str, object] = {}
    at, end = 0, len(data)
    while at < end:
        size = data[at]
        name = data[at + 1:at + 1 + size].decode("utf-8", "replace")
        at += 1 + size
        if at >= end:
            raise _broken("a header without a value")
        kind = data[at]
        at += 1
        if kind in (0, 1):
            value: object = kind == 0
        elif kind in _FIXED:
            width = _FIXED[kind]
            raw = data[at:at + width]
            value = raw if kind == 9 else int.from_bytes(raw, "big", signed=True)
            at += width
        elif kind in (6, 7):
            length = int.from_bytes(data[at:at + 2], "big")
            raw = data[at + 2:at + 2 + length]
            value = raw.decode("utf-8", "replace") if kind == 7 else raw
            at += 2 + length
        else:
            raise _broken(f"a header of unknown type {kind}")
        if at > end:
            raise _broken("a header longer than its message")
        headers[name] = value
    return headers


class EventStreamDecoder:
    __slots__ = ("_buffer", "_limit")

    def __init__(self, message_bytes_max: int = MESSAGE_BYTES_MAX) -> None:
        self._buffer = bytearray()
        self._limit = message_bytes_max

    def feed(self, data: bytes) -> "list[tuple[dict[str, object], bytes]]":
        buffer = self._buffer
        buffer += data
        messages = []
        while len(buffer) >= 12:
            total, headers_length, prelude_crc = _PRELUDE.unpack_from(buffer)
            if zlib.crc32(buffer[:8]) != prelude_crc:
                raise _broken("a prelude's CRC does not match")
            if total > self._limit or total < 16 or headers_length > total - 16:
                raise _broken(f"a message of {total} bytes (at most {self._limit})")
            if len(buffer) < total:
                break
            message = bytes(buffer[:total])
            del buffer[:total]
            if zlib.crc32(message[:-4]) != int.from_bytes(message[-4:], "big"):
                raise _broken("a message's CRC does not match")
            headers = read_headers(message[12:12 + headers_length])
            messages.append((headers, message[12 + headers_length:-4]))
        return messages

    @property
    def pending(self) -> int:
        """Bytes of a message not complete yet (a stream that ends with some is cut off)."""
        return len(self._buffer)

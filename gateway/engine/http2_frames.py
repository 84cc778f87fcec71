"""HTTP/2 frames as a gRPC client uses them (RFC 9113): encoding, parsing, header blocks.

Why not ``h2``: a general HTTP/2 stack pays for generality on every frame. Under a
16-token stream its receive path (a frame object per frame, a state machine per
stream, an event object per change, and a repr() of every received frame formatted
for a debug log) was ~45% of the gateway's CPU per call (cProfile of
``tests/bench/bridge_bench.py``). A gRPC client needs nine frame types and a few
rules; here a frame is a struct unpack and a tuple.

HPACK is not ours to write: header blocks are decoded by ``hpack`` (the library h2
uses), except blocks made only of one-byte indexed fields, which are looked up in
its table directly (that is what a gRPC server sends once its dynamic table holds
its usual headers, so most answers take this path; such blocks never change the
table) and blocks seen before that did not change the table either (see
``HeaderBlockDecoder``). Request headers are encoded as literals that the server does not index
(RFC 7541 6.2.2), so we keep no encoder state the server could disagree with.

Errors the peer causes raise ``ConnectionFailure`` with the HTTP/2 error code to
send in GOAWAY; the connection (``h2grpc.py``) then fails its calls.
"""

from __future__ import annotations

import struct

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Settings (RFC 9113 6.5.2).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    range(1, 7))
# Error codes (RFC 9113 7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM, INADEQUATE_SECURITY = 6, 7, 8, 9, 11, 12
ERROR_NAMES = ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
               "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR",
               "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED")

DEFAULT_WINDOW_BYTES = 65_535
DEFAULT_FRAME_BYTES = 16_384
FRAME_BYTES_LIMIT = 16_777_215
WINDOW_BYTES_LIMIT = 2**31 - 1
STREAM_ID_LIMIT = 2**31 - 1

# 24-bit length as 8 + 16 bits, type, flags, reserved bit + 31-bit stream id.
_FRAME_HEADER = struct.Struct(">BHBBL")
_SETTING = struct.Struct(">HL")
_U32 = struct.Struct(">L")
_GOAWAY = struct.Struct(">LL")


class ConnectionFailure(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY(code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def error_name(code: int) -> str:
    return ERROR_NAMES[code] if 0 <= code < len(ERROR_NAMES) else f"error 0x{code:x}"


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _FRAME_HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def settings_frame(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in values.items()))


def window_update_frame(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream_frame(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway_frame(last_stream_id: int, code: int, message: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + message)


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """The (setting, value) pairs of a SETTINGS frame, checked as RFC 9113 6.5.2 asks."""
    if len(payload) % 6:
        raise ConnectionFailure(FRAME_SIZE_ERROR, "a SETTINGS frame whose length is not a multiple of 6")
    pairs = [_SETTING.unpack_from(payload, at) for at in range(0, len(payload), 6)]
    for key, value in pairs:
        if key == INITIAL_WINDOW_SIZE and value > WINDOW_BYTES_LIMIT:
            raise ConnectionFailure(FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value} exceeds 2^31-1")
        if key == MAX_FRAME_SIZE and not DEFAULT_FRAME_BYTES <= value <= FRAME_BYTES_LIMIT:
            raise ConnectionFailure(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
        if key == ENABLE_PUSH and value > 1:
            raise ConnectionFailure(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
    return pairs


def parse_u32(payload: bytes, what: str) -> int:
    """The 4-byte payload of RST_STREAM or WINDOW_UPDATE (reserved bit dropped for the latter)."""
    if len(payload) != 4:
        raise ConnectionFailure(FRAME_SIZE_ERROR, f"a {what} frame of {len(payload)} bytes, not 4")
    return _U32.unpack(payload)[0]


def parse_goaway(payload: bytes) -> tuple[int, int, bytes]:
    """(last stream id, error code, debug data) of a GOAWAY frame."""
    if len(payload) < 8:
        raise ConnectionFailure(FRAME_SIZE_ERROR, "a GOAWAY frame shorter than 8 bytes")
    last_stream_id, code = _GOAWAY.unpack_from(payload)
    return last_stream_id & STREAM_ID_LIMIT, code, payload[8:]


_PADDED_OR_PRIORITY = PADDED | PRIORITY_FLAG


def unpad(flags: int, payload: bytes) -> bytes:
    """The content of a DATA or HEADERS frame without its padding (and a HEADERS frame's priority)."""
    if not flags & _PADDED_OR_PRIORITY:
        return payload  # most frames: no slicing to do
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            raise ConnectionFailure(FRAME_SIZE_ERROR, "a padded frame without its pad length")
        start, end = 1, end - payload[0]
    if flags & PRIORITY_FLAG:
        start += 5
    if end < start:
        raise ConnectionFailure(PROTOCOL_ERROR, "padding longer than the frame")
    return payload if (start, end) == (0, len(payload)) else payload[start:end]


class FrameReader:
    """Cuts received bytes into frames: ``feed(data)`` gives the complete ones as tuples.

    A frame longer than we advertised (SETTINGS_MAX_FRAME_SIZE) is a connection error; the
    first frame must be the server's SETTINGS (anything else is not an HTTP/2 server, an
    HTTP/1.1 error page say, and is named as such).
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._first = True

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        buffer = self._buffer
        if buffer:
            buffer += data
            source: "bytes | bytearray" = buffer
        else:  # the usual read: whole frames, cut straight from what was read (one copy each, not three)
            source = data
        frames = []
        at, size = 0, len(source)
        while size - at >= 9:
            length_high, length_low, kind, flags, stream_id = _FRAME_HEADER.unpack_from(source, at)
            if self._first:
                if kind != SETTINGS or flags & ACK or stream_id:
                    raise ConnectionFailure(PROTOCOL_ERROR, "the peer does not speak HTTP/2 (no SETTINGS first): "
                                            f"{bytes(source[:32])!r}")
                self._first = False
            length = length_high << 16 | length_low
            if length > self.max_frame_bytes:
                raise ConnectionFailure(FRAME_SIZE_ERROR, f"a frame of {length} bytes exceeds the "
                                        f"{self.max_frame_bytes} advertised")
            end = at + 9 + length
            if end > size:
                break
            frames.append((kind, flags, stream_id & STREAM_ID_LIMIT, bytes(source[at + 9:end])))
            at = end
        if source is buffer:
            if at:
                del buffer[:at]
        elif at < size:
            buffer += memoryview(data)[at:]  # the start of a frame still coming
        return frames


def _integer(value: int, prefix_bits: int, first_byte: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with an N-bit prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first_byte | value,))
    out = bytearray((first_byte | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal_field(name: bytes, value: bytes) -> bytes:
    """A header field the server does not add to its table (literal without indexing, new name)."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


def indexed_field(index: int) -> bytes:
    """A header field of the static table, name and value (RFC 7541 Appendix A)."""
    return _integer(index, 7, 0x80)


METHOD_POST = indexed_field(3)
SCHEME_HTTP = indexed_field(6)


class HeaderBlockDecoder:
    """Header blocks to lists of (name, value) bytes; one per connection (HPACK state is per connection).

    A block that leaves the dynamic table as it was decodes to the same fields for as long as the
    table stays so: such blocks are remembered by their bytes until the next block changes the table.
    A gRPC server's answers are two such blocks again and again once its headers are indexed (grpcio
    sends the trailers' empty ``grpc-message`` as a literal it never indexes, which ``hpack`` would
    parse anew, debug logs and all, on every call). Callers must not change the lists returned.
    """

    # Few and small: the blocks a server repeats. A peer sending ever-new ones only churns this.
    STABLE_BLOCKS_MAX = 32
    STABLE_BLOCK_BYTES_MAX = 256

    def __init__(self, max_header_list_bytes: int) -> None:
        self.max_header_list_bytes = max_header_list_bytes
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_bytes)
        self._table = self._decoder.header_table
        self._table_changes = 0
        add = self._table.add

        def counted_add(name: bytes, value: bytes) -> None:  # the only way an entry enters the table
            self._table_changes += 1
            add(name, value)

        self._table.add = counted_add
        self._stable_blocks: dict[bytes, list[tuple[bytes, bytes]]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        fields = self._stable_blocks.get(block)
        if fields is not None:
            return fields
        try:
            if block and min(block) >= 0x81 and 0xFF not in block:
                # Only one-byte indexed fields (1iiiiiii, index 1-126): table lookups, no table change.
                fields = [self._table.get_by_index(byte & 0x7F) for byte in block]
                if sum(len(name) + len(value) + 32 for name, value in fields) > self.max_header_list_bytes:
                    raise hpack.OversizedHeaderListError("the header list exceeds its limit")
                return fields
            before = (self._table_changes, self._table.maxsize)
            fields = [(bytes(name), bytes(value)) for name, value in self._decoder.decode(block, raw=True)]
            if (self._table_changes, self._table.maxsize) != before:
                self._stable_blocks.clear()  # decoded against the old table
            elif len(block) <= self.STABLE_BLOCK_BYTES_MAX:
                if len(self._stable_blocks) >= self.STABLE_BLOCKS_MAX:
                    self._stable_blocks.clear()
                self._stable_blocks[block] = fields
            return fields
        except hpack.HPACKError as e:
            raise ConnectionFailure(COMPRESSION_ERROR, f"cannot decode a header block: {e}") from None

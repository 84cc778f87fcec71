"""Our HTTP/2 frame layer against independent implementations: hyperframe (frames) and hpack (headers)."""

from __future__ import annotations

import random

import hpack
import hyperframe.frame as hf
import pytest

from gateway.engine import http2_frames as h2f


def _server_frames() -> list[hf.Frame]:
    settings = hf.SettingsFrame(0, settings={hf.SettingsFrame.MAX_CONCURRENT_STREAMS: 7,
                                             hf.SettingsFrame.INITIAL_WINDOW_SIZE: 1000})
    data = hf.DataFrame(1, b"x" * 3000, flags=["END_STREAM", "PADDED"])
    data.pad_length = 17
    ping = hf.PingFrame(0, b"12345678")
    update = hf.WindowUpdateFrame(3, window_increment=2**31 - 1)
    reset = hf.RstStreamFrame(5, error_code=8)
    goaway = hf.GoAwayFrame(0, last_stream_id=9, error_code=2, additional_data=b"bye")
    return [settings, data, ping, update, reset, goaway]


def test_frames_are_cut_wherever_the_bytes_split():
    wire = b"".join(f.serialize() for f in _server_frames())
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    reader = h2f.FrameReader(h2f.DEFAULT_FRAME_BYTES)
    got = []
    at = 0
    while at < len(wire):
        step = rng.randint(1, 40)
        got += reader.feed(wire[at:at + step])
        at += step
    assert [(kind, stream_id) for kind, _, stream_id, _ in got] == [
        (h2f.SETTINGS, 0), (h2f.DATA, 1), (h2f.PING, 0), (h2f.WINDOW_UPDATE, 3), (h2f.RST_STREAM, 5),
        (h2f.GOAWAY, 0)], f"seed {seed}"
    settings, data, ping, update, reset, goaway = got
    assert h2f.parse_settings(settings[3]) == [(h2f.MAX_CONCURRENT_STREAMS, 7), (h2f.INITIAL_WINDOW_SIZE, 1000)]
    assert data[1] & h2f.END_STREAM and h2f.unpad(data[1], data[3]) == b"x" * 3000 and len(data[3]) == 3018
    assert ping[3] == b"12345678"
    assert h2f.parse_u32(update[3], "WINDOW_UPDATE") == 2**31 - 1
    assert h2f.parse_u32(reset[3], "RST_STREAM") == h2f.CANCEL
    assert h2f.parse_goaway(goaway[3]) == (9, h2f.INTERNAL_ERROR, b"bye")


@pytest.mark.parametrize("cut", ["whole", "by frame", "frame and a half", "byte by byte"])
def test_frames_are_the_same_however_reads_fall_on_their_bounds(cut):
    """A read holding whole frames is cut straight from it, one that ends mid-frame keeps the rest: both give
    the frames a single read of everything gives."""
    frames = [f.serialize() for f in _server_frames()]
    wire = b"".join(frames)
    if cut == "whole":
        reads = [wire]
    elif cut == "by frame":
        reads = frames
    elif cut == "frame and a half":  # each read ends halfway into the next frame, then a whole-frame read
        reads, at = [], 0
        for frame in frames:
            reads += [wire[at:at + len(frame) // 2], wire[at + len(frame) // 2:at + len(frame)]]
            at += len(frame)
        reads = [reads[0] + reads[1] + reads[2], *reads[3:]]
    else:
        reads = [wire[i:i + 1] for i in range(len(wire))]
    reader = h2f.FrameReader(h2f.DEFAULT_FRAME_BYTES)
    got = [frame for data in reads for frame in reader.feed(data)]
    assert got == h2f.FrameReader(h2f.DEFAULT_FRAME_BYTES).feed(wire)
    assert [(kind, stream_id) for kind, _, stream_id, _ in got] == [
        (h2f.SETTINGS, 0), (h2f.DATA, 1), (h2f.PING, 0), (h2f.WINDOW_UPDATE, 3), (h2f.RST_STREAM, 5),
        (h2f.GOAWAY, 0)]
    assert all(type(payload) is bytes for *_, payload in got)
    assert h2f.unpad(0, b"abc") == b"abc" and h2f.unpad(h2f.PADDED, b"\x02abcXX") == b"abc"


def test_our_frames_parse_with_hyperframe():
    for ours, kind in [(h2f.settings_frame({h2f.ENABLE_PUSH: 0, h2f.MAX_FRAME_SIZE: 1 << 20}), hf.SettingsFrame),
                       (h2f.window_update_frame(0, 12345), hf.WindowUpdateFrame),
                       (h2f.rst_stream_frame(7, h2f.CANCEL), hf.RstStreamFrame),
                       (h2f.goaway_frame(0, h2f.PROTOCOL_ERROR, b"why"), hf.GoAwayFrame),
                       (h2f.frame(h2f.DATA, h2f.END_STREAM, 3, b"x" * 70_000), hf.DataFrame)]:
        parsed, length = hf.Frame.parse_frame_header(memoryview(ours[:9]))
        parsed.parse_body(memoryview(ours[9:]))
        assert isinstance(parsed, kind) and length == len(ours) - 9
    assert parsed.stream_id == 3 and "END_STREAM" in parsed.flags and parsed.data == b"x" * 70_000


@pytest.mark.parametrize("wire, code", [
    (b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n", h2f.PROTOCOL_ERROR),  # not an HTTP/2 server
    (hf.DataFrame(1, b"x").serialize(), h2f.PROTOCOL_ERROR),  # SETTINGS must come first
    (hf.SettingsFrame(0).serialize() + h2f.frame(h2f.DATA, 0, 1, b"x" * 20_000), h2f.FRAME_SIZE_ERROR),
])
def test_what_is_not_http2_or_too_large_is_refused(wire, code):
    reader = h2f.FrameReader(h2f.DEFAULT_FRAME_BYTES)
    with pytest.raises(h2f.ConnectionFailure) as failure:
        reader.feed(wire)
    assert failure.value.code == code


@pytest.mark.parametrize("payload, code", [
    (b"\x00\x04\x80\x00\x00\x00", h2f.FLOW_CONTROL_ERROR),  # initial window 2^31
    (b"\x00\x05\x00\x00\x10\x00", h2f.PROTOCOL_ERROR),  # max frame size under 16,384
    (b"\x00\x02\x00\x00\x00\x02", h2f.PROTOCOL_ERROR),  # enable push neither 0 nor 1
    (b"\x00\x04\x00\x00", h2f.FRAME_SIZE_ERROR),
])
def test_bad_settings_are_connection_errors(payload, code):
    with pytest.raises(h2f.ConnectionFailure) as failure:
        h2f.parse_settings(payload)
    assert failure.value.code == code


def test_padding_longer_than_the_frame_is_an_error():
    with pytest.raises(h2f.ConnectionFailure):
        h2f.unpad(h2f.PADDED, b"\x09abc")
    assert h2f.unpad(h2f.PADDED | h2f.PRIORITY_FLAG, b"\x02" + b"\x00" * 5 + b"hi" + b"\x00\x00") == b"hi"


def test_request_fields_decode_with_hpack_and_leave_its_table_empty():
    long_value = b"v" * 300  # lengths over 127 take HPACK's multi-byte integers
    block = b"".join([h2f.METHOD_POST, h2f.SCHEME_HTTP, h2f.literal_field(b":path", b"/a.B/C"),
                      h2f.literal_field(b"x-long", long_value)])
    decoder = hpack.Decoder()
    assert decoder.decode(block, raw=True) == [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a.B/C"),
                                               (b"x-long", long_value)]
    assert len(decoder.header_table.dynamic_entries) == 0  # nothing for the server to keep in step with


def test_header_blocks_decode_as_hpack_does_through_either_path():
    """A server's encoder fills its dynamic table; later blocks are all-indexed and take the fast path."""
    encoder = hpack.Encoder()
    ours = h2f.HeaderBlockDecoder(64 * 1024)
    reference = hpack.Decoder()
    answers = [[(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-accept-encoding",
                                                                                b"identity,deflate,gzip")],
               [(b"grpc-status", b"0")], [(b"grpc-status", b"5"), (b"grpc-message", b"no such thing")]]
    fast_blocks = 0
    for round_ in range(4):
        for fields in answers:
            block = encoder.encode(fields)
            fast_blocks += min(block) >= 0x81 and 0xFF not in block
            assert ours.decode(block) == [tuple(field) for field in reference.decode(block, raw=True)] == fields
    assert fast_blocks >= 6  # the rounds after the first are table lookups


def test_header_lists_beyond_the_limit_are_refused_on_both_paths():
    encoder = hpack.Encoder()
    ours = h2f.HeaderBlockDecoder(1000)
    big = [(b"x-big", b"y" * 900)]
    ours.decode(encoder.encode(big))  # indexed by the encoder now
    with pytest.raises(h2f.ConnectionFailure) as failure:
        ours.decode(encoder.encode(big * 2))  # two one-byte references to a 900-byte field
    assert failure.value.code == h2f.COMPRESSION_ERROR
    with pytest.raises(h2f.ConnectionFailure):
        h2f.HeaderBlockDecoder(1000).decode(hpack.Encoder().encode([(b"x-big", b"y" * 2000)]))


def _counting_hpack_calls(decoder: h2f.HeaderBlockDecoder) -> list[int]:
    calls = [0]
    decode = decoder._decoder.decode

    def counted(block, raw=False):
        calls[0] += 1
        return decode(block, raw=raw)

    decoder._decoder.decode = counted
    return calls


def test_a_remembered_block_is_forgotten_when_the_table_changes():
    """The same bytes mean other fields once the table has moved: the remembered answer must go."""
    ours = h2f.HeaderBlockDecoder(64 * 1024)
    reference = hpack.Decoder()
    calls = _counting_hpack_calls(ours)
    index_x = b"\x40\x01x\x01a"  # literal with incremental indexing: x: a enters the table at index 62
    repeat = b"\xbe\x00\x01m\x00"  # index 62 (whatever it holds now), then m: "" not indexed
    index_y = b"\x40\x01y\x01b"  # y: b enters at 62, x: a moves to 63
    blocks = [index_x, repeat, repeat, repeat, index_y, repeat, repeat]
    answers = [ours.decode(block) for block in blocks]
    assert answers == [[tuple(f) for f in reference.decode(block, raw=True)] for block in blocks]
    assert answers[1] == [(b"x", b"a"), (b"m", b"")] and answers[5] == [(b"y", b"b"), (b"m", b"")]
    assert calls[0] == 4  # index_x, repeat once, index_y, repeat once: the others were remembered


def test_header_blocks_decode_as_hpack_does_under_a_changing_table(seed=None):
    """Random answers from a small pool, indexed, never indexed, resized tables, evictions: same fields."""
    seed = seed if seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    encoder = hpack.Encoder()
    encoder.header_table_size = 256  # evictions come soon
    ours = h2f.HeaderBlockDecoder(64 * 1024)
    reference = hpack.Decoder()
    calls = _counting_hpack_calls(ours)
    pool = [(b"grpc-status", b"0"), (b"grpc-status", b"13"), (b"content-type", b"application/grpc"),
            (b"x-load", b"7"), (b"x-load", b"8"), (b"x-server", b"engine-" + b"a" * 40)]
    blocks = 0
    for step in range(400):
        if rng.random() < 0.03:
            encoder.header_table_size = rng.choice([0, 64, 128, 256, 4096])  # a size update leads the next block
        fields = [hpack.NeverIndexedHeaderTuple(*f) if rng.random() < 0.3 else f
                  for f in rng.sample(pool, rng.randint(1, 3))]
        block = encoder.encode(fields)
        blocks += 1
        expected = [tuple(f) for f in reference.decode(block, raw=True)]
        assert ours.decode(block) == expected, f"seed {seed}, step {step}"
    assert calls[0] < blocks, f"seed {seed}: no block was remembered"

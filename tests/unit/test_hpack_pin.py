"""What gateway/engine/http2_frames.py relies on in ``hpack`` beyond its documented API, pinned.

``HeaderBlockDecoder`` counts table changes by wrapping ``Decoder.header_table.add`` and reads
the static and dynamic tables with ``get_by_index`` for blocks made only of indexed fields. These
are ``hpack`` internals: pyproject.toml pins ``hpack>=4,<5``, and this test fails if a release
moves them, before a node decodes a header wrongly.
"""

from __future__ import annotations

import hpack

from gateway.engine import http2_frames as h2f


def test_the_version_is_the_pinned_major():
    assert hpack.__version__.split(".")[0] == "4"


def test_the_decoder_exposes_the_table_we_read():
    decoder = hpack.Decoder(max_header_list_size=4096)
    table = decoder.header_table
    assert callable(table.add) and isinstance(table.maxsize, int)
    assert table.get_by_index(8) == (b":status", b"200")  # RFC 7541 Appendix A
    assert table.get_by_index(3) == (b":method", b"POST")


def test_every_table_insertion_goes_through_add():
    decoder = h2f.HeaderBlockDecoder(64 * 1024)
    encoder = hpack.Encoder()
    block = encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])  # indexed: added
    assert decoder.decode(block) == [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert decoder._table_changes == 1  # the literal was added to the dynamic table, through add()
    again = encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])  # now indexed only
    assert min(again) >= 0x81  # one-byte indexed fields: the lookup path
    assert decoder.decode(again) == [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert decoder._table_changes == 1


def test_raw_decoding_gives_bytes():
    fields = hpack.Decoder().decode(hpack.Encoder().encode([(b"grpc-status", b"0")]), raw=True)
    assert [(bytes(n), bytes(v)) for n, v in fields] == [(b"grpc-status", b"0")]
    assert all(isinstance(n, (bytes, memoryview)) for n, _ in fields)

"""Images in the gateway, without sockets: data: URIs, how a prompt's placeholders are expanded, and the KV routing key: two prompts that differ only in an image share
no block hash from that image on, the same image gives the same key."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from gateway.media.fetch import FetchRefused, data_uri_bytes
from gateway.media.processors import ProcessedImage, QwenVisionProcessor
from gateway.media.service import MediaError, MediaInputs, _ByteLru
from gateway.routing.kv_index import prompt_block_hashes

PAD = 151655


def test_data_uris_are_base64_and_bounded_before_they_are_decoded():
    assert data_uri_bytes("data:image/png;base64," + base64.b64encode(b"\x89PNG").decode(), 100) == b"\x89PNG"
    for bad in ("data:image/png,raw", "data:image/png;base64,***", "data:;base64"):
        with pytest.raises(FetchRefused):
            data_uri_bytes(bad, 100)
    with pytest.raises(FetchRefused, match="larger"):
        data_uri_bytes("data:image/png;base64," + "A" * 4000, 100)


def media(*token_counts: int, hashes: "tuple[str, ...] | None" = None) -> MediaInputs:
    processor = QwenVisionProcessor(placeholder_id=PAD)
    images = [ProcessedImage(np.zeros((n * 4, 1176), np.uint8), {"image_grid_thw": np.array([1, 2, 2 * n])}, n)
              for n in token_counts]
    return MediaInputs(processor, images, list(hashes or (f"{i:064x}" for i in range(1, len(images) + 1))))


def test_placeholders_expand_in_order_and_the_ranges_say_where():
    inputs = media(3, 2)
    expanded, routing = inputs.expand([1, 2, PAD, 7, PAD, 9])
    assert expanded == [1, 2, PAD, PAD, PAD, 7, PAD, PAD, 9]
    assert inputs.ranges == [(2, 3), (6, 2)]
    assert len(routing) == len(expanded) and routing[:2] == [1, 2] and routing[5] == 7 and routing[-1] == 9
    assert all(r >= 1 << 62 for r in routing[2:5] + routing[6:8])  # no vocabulary id stands for an image
    for ids in ([1, PAD], [PAD, PAD, PAD], [1, 2, 3]):  # a template that placed fewer or more than the images
        with pytest.raises(MediaError):
            media(3, 2).expand(ids)


def test_prompts_that_differ_only_in_their_image_share_no_prefix_past_it():
    prompt = list(range(100, 140)) + [PAD] + list(range(200, 240))
    same_a = media(40, hashes=("a" * 64,)).expand(prompt)[1]
    same_b = media(40, hashes=("a" * 64,)).expand(prompt)[1]
    other = media(40, hashes=("b" * 64,)).expand(prompt)[1]
    a, b, c = (prompt_block_hashes(ids, 16) for ids in (same_a, same_b, other))
    assert a == b  # the same image: the same key, a cache hit for the whole prompt
    assert a[:2] == c[:2] and not set(a[2:]) & set(c[2:])  # the text before it is shared; from its block on, nothing


def test_the_cache_keeps_within_its_bytes_and_lets_entries_expire():
    cache = _ByteLru(100)
    cache.put("a", 1, 20)
    cache.put("b", 2, 20, expires_at=5.0)
    cache.put("huge", 3, 60)  # more than a quarter of the budget: never kept
    assert cache.get("huge", 0.0) is None and cache.get("a", 0.0) == 1 and cache.get("b", 1.0) == 2
    assert cache.get("b", 6.0) is None and cache.bytes == 20  # expired: dropped
    for i in range(10):
        cache.put(i, i, 20)
    assert cache.bytes <= 100 and cache.get("a", 0.0) is None and cache.get(9, 0.0) == 9


def test_what_a_vision_engine_says_it_takes():
    from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg, vllm_engine_pb2 as vl

    from gateway.engine.media_facts import MediaFacts
    from gateway.engine.runtimes import ENGINE_RUNTIMES
    said = vl.GetServerInfoResponse(mm_device_do_normalize=True, mm_item_limits="image=4,video=2", mm_encoder_budget=16384)
    assert ENGINE_RUNTIMES["vllm"].media_facts(said) == MediaFacts(True, 4, 2, 16384)
    assert ENGINE_RUNTIMES["vllm"].media_facts(vl.GetServerInfoResponse()) == MediaFacts(False, None, None, None)
    garbled = vl.GetServerInfoResponse(mm_item_limits="image=,=3,image=x,video=1")
    assert ENGINE_RUNTIMES["vllm"].media_facts(garbled) == MediaFacts(False, None, 1, None)
    image_only = vl.GetServerInfoResponse(mm_item_limits="image=3,video=0")  # an image-only deployment's
    assert ENGINE_RUNTIMES["vllm"].media_facts(image_only) == MediaFacts(False, 3, 0, None)
    assert ENGINE_RUNTIMES["sglang"].media_facts(sg.GetServerInfoResponse()) == MediaFacts()


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height and whose pixels are not there."""
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("family", ["qwen2_vl", "llava"])
def test_a_size_the_processor_refuses_is_refused_from_the_header_before_decoding(family):
    # A 1 x 39,000,000 PNG was decoded (3.5 s, +770 MiB) before its aspect ratio was refused (issue 59). Its
    # pixels are not even there: refused for its ratio, not as a truncated file.
    from gateway.media.decode import ImageRefused, decode_image
    from gateway.media.processors import ClipStyleProcessor
    processor = QwenVisionProcessor(placeholder_id=1) if family == "qwen2_vl" else ClipStyleProcessor(placeholder_id=1, tokens_per_image=576)
    with pytest.raises(ImageRefused, match="aspect ratio is over 200:1"):
        decode_image(_png_header(1, 39_000_000), 40_000_000, processor.size_problem)
    with pytest.raises(ImageRefused, match="cannot be decoded"):  # a fine ratio: decoded, found truncated
        decode_image(_png_header(300, 200), 40_000_000, processor.size_problem)

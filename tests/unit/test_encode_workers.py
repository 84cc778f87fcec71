"""TokenSpeed's encode workers (EPD, gateway/engine/encode_workers.py): the requests as the contract has them (each
image's Encode with its pixels and room; the Generate's items without pixels, each with its worker's bootstrap
address and room), workers taken in turn, rooms of 63 random bits, and the flags."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gateway.engine.encode_workers import DEFAULT_BOOTSTRAP_PORT, EncodeConfig, EncodePool
from gateway.workers.subsystem import encode_pool
from gateway.engine.messages import SamplingOptions
from gateway.engine.runtimes import ENGINE_RUNTIMES
from gateway.media.processors import ProcessedImage, QwenVisionProcessor
from gateway.media.service import MediaInputs
from gateway.node.config import ConfigError, validate
from tests.support.config import parse

IMAGE_PAD = 151655
TOKENSPEED = ENGINE_RUNTIMES["tokenspeed"]


def _images(count: int) -> MediaInputs:
    processor = QwenVisionProcessor(placeholder_id=IMAGE_PAD)
    items = [ProcessedImage(np.full((4, 1176), k, np.uint8), {"image_grid_thw": np.array([1, 2, 2])}, 1)
             for k in range(count)]
    media = MediaInputs(processor, items, [f"{k:064x}" for k in range(count)])
    media.expand([7, *([IMAGE_PAD] * count), 8])
    return media


def _pool(*workers: "tuple[str, int | None]", seed: int = 1) -> EncodePool:
    pool = encode_pool(None, EncodeConfig(workers=workers))
    pool._rng = random.Random(seed)
    return pool


def test_the_generate_carries_each_item_without_pixels_and_with_its_workers_room():
    media = _images(3)
    pool = _pool(("grpc://10.0.0.5:7001", 9100), ("grpc://enc.b:7002", None))
    assignments = pool.assign(3)
    assert [(a.worker.host, a.worker.bootstrap_port) for a in assignments] == [
        ("10.0.0.5", 9100), ("enc.b", DEFAULT_BOOTSTRAP_PORT), ("10.0.0.5", 9100)]  # in turn
    assert all(0 <= a.room < 1 << 63 for a in assignments) and len({a.room for a in assignments}) == 3
    request = TOKENSPEED.generate_request("r", [7, IMAGE_PAD, IMAGE_PAD, IMAGE_PAD, 8], SamplingOptions(4), False,
                                          media=(media,), encode=assignments)
    items = request.mm_inputs.items
    assert len(items) == 3 and not any(item.HasField("encoder_input") for item in items)
    assert [(p.offset, p.length) for item in items for p in item.placeholders] == [(1, 1), (2, 1), (3, 1)]
    assert [(i.item_index, i.bootstrap_host, i.bootstrap_port, i.bootstrap_room)
            for i in request.encode_bootstrap_info.items] == [
        (k, a.worker.host, a.worker.bootstrap_port, a.room) for k, a in enumerate(assignments)]
    # Without encode workers, as before: every item with its pixels, no bootstrap info.
    plain = TOKENSPEED.generate_request("r", [7, IMAGE_PAD, IMAGE_PAD, IMAGE_PAD, 8], SamplingOptions(4), False,
                                        media=(media,))
    assert all(item.HasField("encoder_input") for item in plain.mm_inputs.items)
    assert not plain.HasField("encode_bootstrap_info")


def test_each_images_encode_carries_that_item_with_its_pixels_and_its_room():
    media = _images(2)
    encode = TOKENSPEED.encode_request("r", media, 1, 12345)
    (item,) = encode.mm_inputs.items
    assert item.content_hash == bytes.fromhex(media.hashes[1]) and item.HasField("encoder_input")
    assert [(p.offset, p.length) for p in item.placeholders] == [media.ranges[1]]
    assert [a.bootstrap_room for a in encode.items] == [12345]
    assert encode.request_id == "r-image-1"


def test_no_encode_workers_is_no_pool_and_only_tokenspeed_takes_them():
    assert encode_pool(None, EncodeConfig()) is None
    assert [name for name in ENGINE_RUNTIMES.names() if ENGINE_RUNTIMES[name].encode_workers] == ["tokenspeed"]


@pytest.mark.parametrize("flags, says", [
    (["--encode", "http://e:1"], "grpc://host:port"),
    (["--encode", "grpc://e"], "grpc://host:port"),
    (["--encode", "grpc://e:1", "x"], "cannot use"),
    (["--encode-timeout-secs", "0"], "must be positive"),
])
def test_the_flags_refuse_what_they_cannot_use(flags, says):
    with pytest.raises(ConfigError) as refused:
        validate(parse(["--worker-urls", "grpc://127.0.0.1:1", *flags]))
    assert says in str(refused.value)


def test_the_flags_give_the_workers_and_their_ports():
    config = parse(["--encode", "grpc://a:1", "9000", "--encode", "grpc://b:2"])
    validate(config)
    assert config.encode.workers == (("grpc://a:1", 9000), ("grpc://b:2", None))

"""The peer protocol: generated code in step with the .proto, per-item errors, batching per owner."""

from __future__ import annotations

import pathlib

import pytest
import trio

from gateway.ratelimit import Algorithm, LimitSet, Mode, Rate, RateLimitConfig, RateLimiter
from gateway.ratelimit.peer import (METHOD_DECIDE, Batcher, PeerUnreachable, PendingItem, decision_from_pb,
                                    rate_to_pb)
from proto import ratelimit_pb2 as pb
from proto.generate import PROTO_DIR, generate

RATE = Rate(Algorithm.TOKEN_BUCKET, 10, 1.0, 10)


def test_committed_generated_code_matches_the_proto(tmp_path: pathlib.Path):
    for fresh in generate(tmp_path):
        committed = PROTO_DIR / fresh.name
        assert committed.read_bytes() == fresh.read_bytes(), f"run `python -m proto.generate`: {fresh.name} is stale"


async def test_an_owner_reports_errors_per_item_and_decides_the_rest(autojump_clock):
    owner = RateLimiter(RateLimitConfig(), LimitSet(), node_name="owner", clock=trio.current_time)
    good = pb.DecideItem(key="k:*", spec=rate_to_pb(RATE), hits=1)
    request = pb.DecideRequest(sender="peer", items=[
        good, pb.DecideItem(key="", spec=rate_to_pb(RATE), hits=1),
        pb.DecideItem(key="k:*", spec=pb.LimitSpec(limit=-1, window_s=1, burst=1), hits=1),
        pb.DecideItem(key="k:*", spec=rate_to_pb(RATE), hits=float("nan")),
        pb.DecideItem(key="k:*", spec=rate_to_pb(RATE), hits=1, mode=42), good])
    answer = pb.DecideResponse.FromString(await owner.on_peer_request(METHOD_DECIDE + request.SerializeToString()))
    outcomes = [r.outcome for r in answer.results]
    assert outcomes == [pb.OUTCOME_ALLOWED] + [pb.OUTCOME_ERROR] * 4 + [pb.OUTCOME_ALLOWED]
    assert [r.error for r in answer.results[1:5]] == [
        "the key must be 1 to 512 characters", "limit must be a positive number, not -1.0",
        "hits must be a number from 0 to 1e+12, not nan", "unknown mode 42"]
    assert decision_from_pb(answer.results[5]).remaining == 8
    # A malformed frame gets an empty answer (the sender treats it as unreachable), not an exception.
    assert await owner.on_peer_request(METHOD_DECIDE + b"\xff\xff\xff") == b""
    assert await owner.on_peer_request(b"Z") == b""


async def test_concurrent_decisions_for_one_owner_share_a_batch(autojump_clock):
    sent: list[int] = []

    async def send(owner: str, request: pb.DecideRequest) -> pb.DecideResponse:
        sent.append(len(request.items))
        await trio.sleep(0.001)
        return pb.DecideResponse(results=[pb.DecideResult(outcome=pb.OUTCOME_ALLOWED, limit=10, remaining=i)
                                          for i in range(len(request.items))])

    batcher = Batcher("me", send, batch_wait_s=0.0005, batch_items_max=4, in_flight_max=1)
    results = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)

        async def one(i: int) -> None:
            results[i] = await batcher.decide("owner", PendingItem(f"k{i}", RATE, 1, Mode.DECIDE))

        async with trio.open_nursery() as callers:
            for i in range(6):
                callers.start_soon(one, i)
        nursery.cancel_scope.cancel()
    assert sent == [4, 2]  # full at 4: sent at once; the rest when it returned (one in flight)
    assert sorted(r.remaining for r in results.values()) == [0, 0, 1, 1, 2, 3]


async def test_an_undeliverable_batch_fails_every_item(autojump_clock):
    async def send(owner: str, request: pb.DecideRequest) -> pb.DecideResponse:
        raise PeerUnreachable("refused")

    batcher = Batcher("me", send, batch_wait_s=0, batch_items_max=100)
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        with pytest.raises(PeerUnreachable):
            await batcher.decide("owner", PendingItem("k", RATE, 1, Mode.DECIDE))
        nursery.cancel_scope.cancel()
    assert batcher.stats.failed_batches == 1

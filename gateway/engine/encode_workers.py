"""TokenSpeed's encode workers (EPD: ``tokenspeed.grpc.encoder.TokenSpeedEncoder``): a request's images encoded on
vision-tower-only engines while the prefill computes the prompt, as smg drives them.

    EncodeConfig    --encode URL [BOOTSTRAP_PORT] (repeat the flag), the Encode call's bound
    EncodePool      the encode workers, taken in turn; ``assign`` mints one room per image, ``encode`` sends them

How a request runs on them (an engine kind whose runtime has ``encode_workers``, on a node given ``--encode``): each
image goes to the next encode worker in turn, in an Encode call of its own carrying that one item (its pixels,
grid, placeholder and hash) and a room drawn at random from 63 bits; the prefill's Generate carries the same items
without their pixels and, for each item, its worker's host and bootstrap port and the room (``encode_bootstrap_info``):
the prefill fetches each embedding from there. Every Encode is answered (accepted: queued) before the Generate goes,
so a failed or refused Encode fails the attempt before a prefill could wait for a room that never fills; the attempt
is then retried as any other (another prefill, fresh rooms, the next encode workers). The embeddings never pass
through the node.

Rooms are not checked against others in flight: 63 random bits make two equal rooms among a cluster's concurrent
images improbable beyond concern (the contract widened them from 32 bits for that reason). What a prefill does with
a room whose embedding never comes is the engine's (it fails the request after its own timeout).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any

import trio
from smg_grpc_proto.generated import tokenspeed_encoder_pb2 as te

from ..base.options import Option
from .errors import EngineCallError

DEFAULT_BOOTSTRAP_PORT = 8998  # TokenSpeed's (and SGLang's) default bootstrap port, as smg assumes it
ROOM_BITS = 63  # the contract's room is an int64; the non-negative half
ENCODE_METHOD = "/tokenspeed.grpc.encoder.TokenSpeedEncoder/Encode"


@dataclasses.dataclass(frozen=True)
class EncodeConfig:
    # --encode URL [BOOTSTRAP_PORT]: TokenSpeed's encode workers (grpc://host:port), each with the port its
    # bootstrap server listens on (DEFAULT_BOOTSTRAP_PORT when not given); none: prefills encode their images.
    workers: "tuple[tuple[str, int | None], ...]" = ()
    # An Encode is answered once the worker queued the item (the encoding happens after): seconds at most.
    timeout_s: float = 30.0


@dataclasses.dataclass(frozen=True)
class EncodeWorker:
    target: str  # host:port of its gRPC service
    host: str  # where prefills reach its bootstrap server
    bootstrap_port: int


@dataclasses.dataclass(frozen=True)
class EncodeAssignment:
    """One image's Encode: the worker, and the room its prefill fetches the embedding from."""

    worker: EncodeWorker
    room: int


class EncodePool:
    def __init__(self, bridge: Any, workers: "list[EncodeWorker]", timeout_s: float, counted: Any = None,
                 rng: random.Random | None = None) -> None:
        self._bridge = bridge
        self.workers = workers
        self.timeout_s = timeout_s
        self._counted = counted  # smg_epd_images_encoded_total by outcome (GatewayMetrics.epd_images_encoded)
        self._turn = itertools.count()
        self._rng = rng or random.SystemRandom()

    def assign(self, count: int) -> "list[EncodeAssignment]":
        """A worker (in turn) and a fresh room for each of ``count`` images."""
        return [EncodeAssignment(self.workers[next(self._turn) % len(self.workers)], self._rng.getrandbits(ROOM_BITS))
                for _ in range(count)]

    async def encode(self, requests: "list[tuple[EncodeAssignment, Any]]") -> None:
        """Send each (assignment, EncodeRequest) at once; EngineCallError (UNAVAILABLE: the attempt is retried) when
        any fails or is not accepted, not the prefill's fault (its circuit is not charged with an encode worker's
        failure)."""
        failures: list[EngineCallError] = []

        async def one(assignment: EncodeAssignment, request: Any) -> None:
            try:
                answer = await self._bridge.unary(assignment.worker.target, ENCODE_METHOD, request,
                                                  te.EncodeResponse, self.timeout_s)
            except EngineCallError as e:
                failures.append(e)
                self._count("failed")
                return
            if not answer.accepted:
                failures.append(EngineCallError("UNAVAILABLE", f"the encode worker {assignment.worker.target} "
                                                               "did not accept an image"))
                self._count("failed")
                return
            self._count("accepted")

        async with trio.open_nursery() as nursery:
            for assignment, request in requests:
                nursery.start_soon(one, assignment, request)
        if failures:
            raise EngineCallError("UNAVAILABLE", f"an image could not be encoded: {failures[0]}", engine_fault=False)


    def _count(self, outcome: str) -> None:
        if self._counted is not None:
            self._counted.labels(outcome).inc()


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--encode", "encode.workers", "prefill", "a TokenSpeed encode worker (EPD): URL [BOOTSTRAP_PORT] (repeat "
           "the flag for more; the bootstrap port defaults to 8998): TokenSpeed prefills then fetch their images' "
           "embeddings from these", "disaggregation"),
    Option("--encode-timeout-secs", "encode.timeout_s", float, "longest wait for an encode worker to accept an "
           "image", "disaggregation"),
)

"""TokenSpeed's encode/prefill disaggregation (EPD, tokenspeed_encoder.proto), with the simulated engine at both ends.

The gateway sends each image of a request to an encode worker (``TokenSpeedEncoder.Encode``: that one item with its
pixels, and the room it is assigned), and the prefill's Generate carries the items without their pixels and, for
each item, its encode worker's bootstrap address and room (``encode_bootstrap_info``). Here an encode engine
(``--role encode --services tokenspeed-encoder``) checks the item, "encodes" it (a digest of its pixels and grid
stands for the embedding) and offers it under the room on its bootstrap server (handover.py), freed if no prefill
takes it in time; the scheduler fetches each item's embedding from there, naming the item by its content hash,
before it computes the prompt. A gateway that sends the pixels to the wrong place, pairs items and rooms wrongly or
skips an Encode fails as against real engines: the prefill waits for a room that never fills, then fails (ABORTED).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from smg_grpc_proto.generated import tokenspeed_encoder_pb2 as te
from smg_grpc_proto.generated import tokenspeed_encoder_pb2_grpc as te_grpc

from . import vision
from .handover import HandoverFailed, fetch_offer


def room_key(room: int) -> str:
    return f"encode-{room}"


def item_identity(content_hash: bytes) -> "list[int]":
    """What an encoded item is offered and fetched by: its content hash (another item's embedding is refused)."""
    return list(content_hash)


class TokenSpeedEncoderService(te_grpc.TokenSpeedEncoderServicer):
    def __init__(self, shared: Any) -> None:
        self.s = shared

    async def Encode(self, request: te.EncodeRequest, context) -> te.EncodeResponse:
        pd = self.s.pd
        if pd.role != "encode" or pd.board is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this engine is not an encode worker (--role "
                                "encode)")
        items = request.mm_inputs.items
        if len(items) != 1 or len(request.items) != 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"an Encode carries one item and one room, not "
                                f"{len(items)} and {len(request.items)}")
        item = items[0]
        try:
            digest = vision.encoded_item_digest(item)
        except vision.ImagesRefused as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"images: {e}")
        key = room_key(request.items[0].bootstrap_room)
        try:
            pd.board.offer(key, item_identity(item.content_hash), payload=digest)
        except HandoverFailed as e:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(e))
        pd.board.expire_later(key)  # the embedding is freed if no prefill takes it in time
        self.s.images_seen += 1
        return te.EncodeResponse(accepted=True)


async def receive_encoded(shared: Any, request: Any, input_ids: "list[int]", context) -> vision.CheckedImages:
    """The prefill's side: each item's embedding from its encode worker, then the items held to the prompt."""
    items = list(request.mm_inputs.items)
    infos = {info.item_index: info for info in request.encode_bootstrap_info.items}
    if not items or sorted(infos) != list(range(len(items))) or len(request.encode_bootstrap_info.items) != len(
            items):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"encode_bootstrap_info names items "
                            f"{[i.item_index for i in request.encode_bootstrap_info.items]} for {len(items)} item(s)")
    if any(item.HasField("encoder_input") for item in items):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "images: an item encoded by an encode worker carries no "
                            "pixels to the prefill")
    timeout_s = shared.pd.timeout_s
    try:
        answers = await asyncio.gather(*(
            fetch_offer(infos[index].bootstrap_host, infos[index].bootstrap_port,
                        room_key(infos[index].bootstrap_room), item_identity(item.content_hash), timeout_s)
            for index, item in enumerate(items)))
    except HandoverFailed as e:
        await context.abort(grpc.StatusCode.ABORTED, f"an image's embedding did not arrive: {e}")
    try:
        return vision.check_tokenspeed_encoded(request.mm_inputs, input_ids,
                                               [int(answer.get("payload", 0)) for answer in answers])
    except vision.ImagesRefused as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"images: {e}")

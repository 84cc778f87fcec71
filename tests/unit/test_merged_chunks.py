"""A generation's chunks that arrive together are parsed as one message (gateway/engine/h2grpc.py
``_parse_batch``): the events made of them carry the same tokens, in order, and the same end, for both
runtimes' messages."""

from __future__ import annotations

import random

import pytest

from smg_grpc_proto.generated import sglang_scheduler_pb2 as sg
from smg_grpc_proto.generated import vllm_engine_pb2 as vl

from gateway.engine.runtimes import ENGINE_RUNTIMES

_events = ENGINE_RUNTIMES["sglang"].events  # both kinds read Generate answers alike (runtimes/base.py)
from gateway.engine.h2grpc import _parse_batch


def _chunk(pb, token_ids, prompt_tokens, completion_tokens, cached_tokens):
    message = pb.GenerateResponse()
    message.chunk.token_ids.extend(token_ids)
    message.chunk.prompt_tokens, message.chunk.completion_tokens = prompt_tokens, completion_tokens
    message.chunk.cached_tokens = cached_tokens
    return message.SerializeToString()


def _complete(pb, output_ids, prompt_tokens, completion_tokens, cached_tokens):
    message = pb.GenerateResponse()
    message.complete.output_ids.extend(output_ids)
    message.complete.prompt_tokens, message.complete.completion_tokens = prompt_tokens, completion_tokens
    message.complete.cached_tokens, message.complete.finish_reason = cached_tokens, "length"
    return message.SerializeToString()


@pytest.mark.parametrize("pb", [sg, vl], ids=["sglang", "vllm"])
@pytest.mark.parametrize("ends", [True, False])
def test_chunks_parsed_as_one_make_the_same_tokens_and_end(pb, ends):
    seed = random.randrange(2 ** 32)
    rng = random.Random(seed)
    tokens = [rng.randrange(0, 151_000) for _ in range(rng.randint(3, 40))]
    raw, at = [], 0
    while at < len(tokens):  # one to three tokens a chunk, the counts cumulative as engines send them
        step = rng.randint(1, 3)
        raw.append(_chunk(pb, tokens[at:at + step], 18, min(at + step, len(tokens)), 5))
        at += step
    if ends:
        raw.append(_complete(pb, tokens[-1:], 18, len(tokens), 5))
    one_by_one = _events(_parse_batch(pb.GenerateResponse, raw, False), stream=True)
    merged = _events(_parse_batch(pb.GenerateResponse, raw, True), stream=True)
    assert len(merged) == min(2, len(raw)), f"seed {seed}"
    ids = lambda events: [t for event in events for t in event.token_ids]  # noqa: E731
    assert ids(merged) == ids(one_by_one) == tokens, f"seed {seed}"  # (a stream's complete repeats no ids)
    assert merged[-1] == one_by_one[-1], f"seed {seed}"  # the last message is parsed alone: the end as it was
    assert merged[0].prompt_tokens == 18 and merged[0].cached_tokens == 5


def test_two_or_fewer_messages_are_parsed_one_by_one():
    raw = [_chunk(sg, [1], 3, 1, 0), _complete(sg, [2], 3, 2, 0)]
    assert [m.SerializeToString() for m in _parse_batch(sg.GenerateResponse, raw, True)] == raw

"""Completion tokens with stop strings: counted up to and including the token that completed the stop, however the
engine batched them (issue 34: 2, 3 or 22 tokens counted for one greedy answer against vLLM, which says 2)."""

from __future__ import annotations

import random

import pytest

from gateway.engine.grpc_engine import GenerateEvent, SamplingOptions
from gateway.serving.generation import GenerationPlan, _Progress
from gateway.routing.policies import RoutingRequest
from gateway.tokenizer.bundled import default_tokenizer_dir
from gateway.tokenizer.service import TokenizerService


@pytest.fixture(scope="module")
def tokenizer():
    return TokenizerService.from_directory(default_tokenizer_dir())


def _plan(stop: tuple[str, ...]) -> GenerationPlan:
    return GenerationPlan(request_id="r", model="m", input_ids=[1, 2, 3], sampling=SamplingOptions(max_new_tokens=64),
                          stop=stop, include_stop_str=False, skip_special_tokens=True, stream=False,
                          routing=RoutingRequest(input_ids=[1, 2, 3]), timeout_s=None)


def _run(tokenizer, ids: list[int], batch_sizes: list[int], stop: tuple[str, ...]):
    plan = _plan(stop)
    progress = _Progress(plan, tokenizer, "w", None)
    at = 0
    for size in batch_sizes:
        chunk = ids[at:at + size]
        at += size
        last = at >= len(ids)
        progress.step([GenerateEvent(tuple(chunk), 3, at, 0, "length" if last else None)])
        if progress.result is not None:
            break
    return progress.result, plan.usage


@pytest.mark.parametrize("seed", range(8))
async def test_the_count_ends_at_the_token_that_completed_the_stop_whatever_the_batches(tokenizer, seed):
    text = "The answer is forty two. Then more words follow the stop here and keep on going for a while."
    ids = tokenizer.encode_uncached(text)
    stop = ("two.",)
    # The token that completes "two." when decoded one at a time.
    pieces = [tokenizer.decode(ids[:n]) for n in range(1, len(ids) + 1)]
    completing = next(n for n, piece in enumerate(pieces, start=1) if "two." in piece)
    rng = random.Random(seed)
    batches = []
    while sum(batches) < len(ids):
        batches.append(rng.choice((1, 2, 3, 5, 8, len(ids))))
    result, usage = _run(tokenizer, ids, batches, stop)
    assert result.finish_reason == "stop" and result.text == "The answer is forty "
    assert result.completion_tokens == completing == usage.completion_tokens, f"seed={seed} batches={batches}"


async def test_without_a_stop_every_token_counts(tokenizer):
    ids = tokenizer.encode_uncached("no stop string in this one at all")
    result, usage = _run(tokenizer, ids, [len(ids)], ())
    assert result.completion_tokens == len(ids) == usage.completion_tokens and result.finish_reason == "length"

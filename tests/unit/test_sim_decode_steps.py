"""The simulated engine's decode steps (``--decode-steps``): the tokens of requests that started at
different times come out at the same instants, the ends of the engine's shared steps, as a real engine's
batched decode hands them over; without it each request keeps its own clock."""

from __future__ import annotations

import asyncio

from chaos.sim_engine.config import SimEngineConfig
from chaos.sim_engine.core import GenerateParams, SimEngine

STEP_S = 0.05
TOKENS = 4


def engine(decode_steps: bool) -> SimEngine:
    config = SimEngineConfig(prefix_caching=False, prefill_s_per_token=0.0, itl_base_s=STEP_S, itl_per_running_s=0.0,
                             decode_steps=decode_steps)
    return SimEngine(config, (1, 2, 3), 0, None, lambda: None)


async def token_times(sim: SimEngine, request_id: str, delay_s: float) -> "list[float]":
    await asyncio.sleep(delay_s)
    loop = asyncio.get_running_loop()
    params = GenerateParams(request_id, [5, 6, 7], TOKENS, frozenset(), True, None)
    return [loop.time() async for step in sim.generate(params) if step.token_ids]


async def two_requests(decode_steps: bool) -> "tuple[list[float], list[float]]":
    sim = engine(decode_steps)
    first, second = await asyncio.gather(token_times(sim, "a", 0.0), token_times(sim, "b", STEP_S * 0.5))
    return first, second


def test_tokens_of_requests_started_apart_come_out_together_at_step_ends():
    first, second = asyncio.run(two_requests(True))
    assert len(first) == len(second) == TOKENS
    # The second request started half a step later; its tokens come at the first's instants (it joins the step
    # under way), not half a step after them. Both wait for the same instant, so a late timer (a busy machine)
    # wakes them in the same turn of the loop: a millisecond is a wide bound. (Its last token may come a step
    # after the first's last, by where the first began within a step.)
    shared = [min(abs(t - u) for u in first) for t in second[:-1]]
    assert max(shared) < 0.001, shared


def test_without_decode_steps_each_request_keeps_its_own_clock():
    first, second = asyncio.run(two_requests(False))
    gaps = [min(abs(t - u) for u in first) for t in second]
    assert min(gaps) > STEP_S * 0.15, gaps  # half a step apart, as they started

"""The simulated engine's scheduler: admission, timing model, generation, abort.

asyncio, because grpc.aio's server is asyncio; this process is a separate
program (the gateway never imports it), so the trio rule does not apply here.
The gRPC services in ``services.py`` are thin translations onto this core.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from .config import SimEngineConfig
from .constrained import UnsupportedConstraint, constrained_text
from .kv_cache import CacheHit, PrefixCache
from .output import derive_seed, output_token_ids
from .script import Script

log = logging.getLogger("chaos.sim_engine")

THROUGHPUT_WINDOW_S = 5.0  # GetLoads' gen_throughput: tokens per second over this window
NO_CACHE_HIT = CacheHit(cached_tokens=0, block_hashes=())  # every request's hit with prefix caching off


class EngineOverloaded(Exception):
    """The queue is full: a real scheduler rejects admission the same way."""


class InvalidRequest(Exception):
    """The request cannot be served as asked (e.g. longer than the context)."""


@dataclasses.dataclass(frozen=True)
class GenerateParams:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int | None
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    seed: int | None
    # (kind, spec) of the request's constrained decoding (constrained.py), or None
    constraint: "tuple[str, Any] | None" = None
    logprobs: int | None = None  # report each output token's logprob with this many alternatives
    prompt_logprobs: bool = False  # and the prompt's
    # The prompt's KV came from a prefill engine (a decode engine of a disaggregated pair): no prefill cost.
    prefilled: bool = False
    # Images (vision.py): their digest, folded into the answer, and the ids the prefix cache keys by (each image's
    # tokens replaced by its hash's, as a real engine's block hashes carry the image).
    media_digest: int = 0
    cache_ids: "list[int] | None" = None


@dataclasses.dataclass
class Step:
    """One event of a generation: new tokens, and at the end a finish reason."""

    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None = None
    matched_token_id: int | None = None


class SimEngine:
    def __init__(self, config: SimEngineConfig, words: tuple[int, ...], eos_token_id: int,
                 script: Script | None = None, load_tokenizer: "Callable[[], Any] | None" = None) -> None:
        self.config = config
        self.words = words
        self.eos_token_id = eos_token_id
        self.script = script
        self._load_tokenizer = load_tokenizer
        self.cache = PrefixCache(config.block_size, config.kv_capacity_blocks, config.kv_replay_batches_max)
        self.running = 0
        self.waiting = 0
        self._slots = asyncio.Semaphore(config.batch_size_max)
        self._aborts: dict[str, asyncio.Event] = {}
        self.started_at = time.time()
        self.last_receive_timestamp = 0.0
        self.generated_tokens_total = 0
        self.aborted_total = 0
        # Token timestamps of the last THROUGHPUT_WINDOW_S seconds, trimmed as tokens are added.
        self._token_times: collections.deque[float] = collections.deque()

    @functools.cached_property
    def tokenizer(self) -> Any:
        """A tokenizers.Tokenizer (prompts decoded, scripted and constrained outputs encoded), loaded when
        first needed: an engine that only says its words never pays for it."""
        if self._load_tokenizer is None:
            raise InvalidRequest("this engine has no tokenizer to write text with")
        return self._load_tokenizer()

    def abort(self, request_ids: "list[str]") -> None:
        """Abort these requests, and every answer of those with n > 1 (generated as ``<id>/<index>``)."""
        for rid in request_ids:
            for key, event in self._aborts.items():
                if key == rid or key.startswith(rid + "/"):
                    event.set()

    def check_admission(self) -> None:
        """EngineOverloaded when the queue is full (a decode engine asks before it takes a prefill's KV, as a real
        one reserves room for it first)."""
        if self.waiting >= self.config.queue_size_max:
            raise EngineOverloaded(f"queue full ({self.config.queue_size_max} waiting)")

    @property
    def active_requests(self) -> int:
        return self.running + self.waiting

    def _count_token(self) -> None:
        now = time.monotonic()
        self._token_times.append(now)
        while self._token_times and now - self._token_times[0] > THROUGHPUT_WINDOW_S:
            self._token_times.popleft()

    def gen_throughput(self) -> float:
        now = time.monotonic()
        while self._token_times and now - self._token_times[0] > THROUGHPUT_WINDOW_S:
            self._token_times.popleft()
        return len(self._token_times) / THROUGHPUT_WINDOW_S

    async def generate(self, params: GenerateParams) -> AsyncIterator[Step]:
        cfg = self.config
        self.last_receive_timestamp = time.time()
        if len(params.prompt_ids) >= cfg.max_context_tokens:
            raise InvalidRequest(
                f"prompt has {len(params.prompt_ids)} tokens; the context is {cfg.max_context_tokens}")
        self.check_admission()
        room = cfg.max_context_tokens - len(params.prompt_ids)
        max_tokens = min(params.max_tokens if params.max_tokens is not None else cfg.default_max_tokens, room)
        aborted = asyncio.Event()
        if params.request_id in self._aborts:
            raise InvalidRequest(f"duplicate request id {params.request_id!r}")
        self._aborts[params.request_id] = aborted
        self.waiting += 1
        try:
            await self._slots.acquire()
        except BaseException:
            self.waiting -= 1
            self._aborts.pop(params.request_id, None)
            raise
        self.waiting -= 1
        self.running += 1
        hit = self.cache.acquire(params.cache_ids or params.prompt_ids, time.time()) if cfg.prefix_caching \
            else NO_CACHE_HIT
        try:
            if params.constraint is not None:  # a constrained engine answers within the constraint, script or not
                planned = self._constrained(params, max_tokens)
            else:
                planned = self._scripted(params, max_tokens) if self.script is not None else None
            if planned is None:
                seed = derive_seed(params.prompt_ids, params.seed) ^ params.media_digest
                planned = output_token_ids(self.words, seed, max_tokens)
                if cfg.eos_after_tokens is not None and not params.ignore_eos and cfg.eos_after_tokens < max_tokens:
                    planned = planned[:cfg.eos_after_tokens] + [self.eos_token_id]
            uncached = len(params.prompt_ids) - hit.cached_tokens
            if cfg.prefill_s_per_token and not params.prefilled:
                await self._sleep_or_abort(uncached * cfg.prefill_s_per_token, aborted)
            produced = 0
            if not planned:
                yield Step([], len(params.prompt_ids), 0, hit.cached_tokens, "length")
                return
            for token in planned:
                if aborted.is_set():
                    self.aborted_total += 1
                    yield Step([], len(params.prompt_ids), produced, hit.cached_tokens, "abort")
                    return
                if not cfg.zero_cost_mode:
                    step_s = cfg.itl_base_s + cfg.itl_per_running_s * self.running
                    if cfg.decode_steps and step_s > 0:  # to the end of the engine's current step, shared by all
                        step_s -= asyncio.get_running_loop().time() % step_s
                    await self._sleep_or_abort(step_s, aborted)
                    if aborted.is_set():
                        continue
                produced += 1
                self.generated_tokens_total += 1
                self._count_token()
                stop_hit = token in params.stop_token_ids or (token == self.eos_token_id and not params.ignore_eos)
                if stop_hit:
                    yield Step([token], len(params.prompt_ids), produced, hit.cached_tokens, "stop",
                               matched_token_id=token)
                    return
                last = produced == len(planned)
                yield Step([token], len(params.prompt_ids), produced, hit.cached_tokens,
                           "length" if last else None)
            if aborted.is_set():  # the abort arrived while the last token was being "computed"
                self.aborted_total += 1
                yield Step([], len(params.prompt_ids), produced, hit.cached_tokens, "abort")
        finally:
            self.running -= 1
            self._slots.release()
            self._aborts.pop(params.request_id, None)
            self.cache.release(hit, time.time())  # NO_CACHE_HIT pins nothing: releasing it changes nothing

    def _scripted(self, params: GenerateParams, max_tokens: int) -> list[int] | None:
        """The script's answer for this prompt as token ids (EOS last unless it ends by length), or None."""
        rule = self.script.rule_for(self.tokenizer.decode(params.prompt_ids, skip_special_tokens=False))
        if rule is None:
            return None
        ids = self.tokenizer.encode(rule.output, add_special_tokens=False).ids
        if rule.finish == "stop" and not params.ignore_eos:
            ids.append(self.eos_token_id)
        return ids[:max_tokens]

    def _constrained(self, params: GenerateParams, max_tokens: int) -> list[int]:
        """A valid answer for the request's constraint as token ids, EOS last; max_tokens may cut it short,
        as it cuts a real engine's constrained answer."""
        kind, spec = params.constraint
        try:
            text = constrained_text(kind, spec, derive_seed(params.prompt_ids, params.seed) ^ params.media_digest)
        except UnsupportedConstraint as e:
            raise InvalidRequest(str(e)) from None
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids + [self.eos_token_id]
        return ids[:max_tokens]

    @staticmethod
    async def _sleep_or_abort(delay_s: float, aborted: asyncio.Event) -> None:
        if delay_s <= 0:
            return
        try:
            await asyncio.wait_for(aborted.wait(), timeout=delay_s)
        except asyncio.TimeoutError:
            pass

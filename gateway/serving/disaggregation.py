"""Prefill/decode disaggregation (PD): one request on a pair of engines, the KV cache handed between them.

    PdConfig     the subsystem's settings (--pd-disaggregation, --prefill, --decode, the policies, the bound)
    PairRouter   a (prefill, decode) pair for one attempt: each role's policy, the pairing rules
                 (workers/pairing.py), both circuits
    RoomDraw     SGLang bootstrap rooms: random, unique among this node's requests in flight
    PdLegs       the legs around the decode's generation, per runtime; the bound on the hand-over; aborts;
                 the smg_pd_* metrics

How a request runs on a pair (the decode's generation is the ordinary one of ``generation.py``,
given the hand-over; its text streams to the client as any other):

* SGLang: the prefill and the decode get the same request at once, with the same
  ``disaggregated_params`` (the prefill's host and bootstrap port, a fresh room). The decode fetches
  the room's KV from the prefill, then produces tokens; the prefill's answer is read and dropped.
* vLLM (as its own PD proxy drives it): the prefill runs first, unstreamed and for one token, with
  ``kv_transfer_params`` asking for a remote decode; the decode then gets the parameters the prefill
  answered with (``kv_transfer_params_json``) and pulls the KV before its first token.

Failures: a prefill that fails before the hand-over fails the attempt (the decode is cancelled and
aborted) and the attempt is retried on another pair; a decode that fails aborts its prefill (which
frees the KV it holds). Nothing waits forever: from dispatch, the decode's first token must come
within ``bootstrap_timeout_s`` (SGLang), or the prefill's answer and then the decode's first token
each within it (vLLM); past it the attempt fails as DEADLINE_EXCEEDED, counted in
``smg_pd_bootstrap_failures_total{reason="timeout"}``, and the side that did not answer has a failure
on its circuit.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from ..engine.errors import EngineCallError
from ..engine.grpc_engine import Handover
from ..engine.runtimes import KV_TRANSFER_PARAMS
from ..base.errors import NoCapacity
from ..observe.metrics import GatewayMetrics
from ..base.options import Option
from ..routing.policies import POLICIES, Policy, RoutingRequest
from ..workers import AttemptFailed, Worker, WorkerAttempt, WorkerRegistry, abort_quietly
from ..workers.origin import parse_worker_origin
from ..workers.pairing import DECODE, DEFAULT_BOOTSTRAP_PORT, PREFILL, pair_refusal

log = logging.getLogger("gateway.disaggregation")

T = TypeVar("T")
ABORT_TIMEOUT_S = 5.0
# SGLang's DisaggregatedParams.bootstrap_room is an int32 in the contract (smg-grpc-proto): rooms are drawn from
# its non-negative range, and kept unique among this node's requests in flight.
ROOM_MAX = 2 ** 31 - 1
# What a vLLM prefill is sent: produce the KV for a remote decode (vLLM's KV connectors read these keys).
VLLM_PREFILL_PARAMS = ('{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null, '
                       '"remote_block_ids": null, "remote_host": null, "remote_port": null}')


@dataclasses.dataclass(frozen=True)
class PdConfig:
    # --pd-disaggregation: the node serves prefill/decode pairs; --prefill URL [BOOTSTRAP_PORT] and --decode URL
    # are registered in those roles at start (workers may also be registered in a role at run time: POST /workers
    # with worker_type, on any node; the cluster's worker document carries the roles to every node).
    enabled: bool = False
    prefill: "tuple[tuple[str, int | None], ...]" = ()
    decode: tuple[str, ...] = ()
    # Each role's routing policy; None: --policy. cache_aware on prefill reads the shared KV index (prefill
    # engines' KV events), which is where a prompt's prefix is cached.
    prefill_policy: str | None = None
    decode_policy: str | None = None
    # The bound on a hand-over (see the module's docstring). A long prompt's prefill is seconds on a GPU;
    # SGLang's own bound on a decode waiting for its KV is minutes. One minute fails a pair that lost a room
    # long before a client gives up, and never a healthy prefill.
    bootstrap_timeout_s: float = 60.0


class RoomDraw:
    """Bootstrap rooms for SGLang pairs: random (so rooms of different nodes rarely meet on one prefill), never
    one already in flight on this node."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.SystemRandom()
        self.in_flight: set[int] = set()

    def draw(self) -> int:
        while True:
            room = self._rng.randint(0, ROOM_MAX)
            if room not in self.in_flight:
                self.in_flight.add(room)
                return room

    def release(self, room: int) -> None:
        self.in_flight.discard(room)


@dataclasses.dataclass(slots=True)
class Pair:
    prefill: Worker
    decode: Worker


class PairRouter:
    """Chooses the pair of one attempt. The same registrations (the cluster's worker document) and the same
    rules give every node the same candidates; each role's policy chooses among them."""

    def __init__(self, registry: WorkerRegistry, prefill_policy: Policy, decode_policy: Policy) -> None:
        self.registry = registry
        self.prefill_policy = prefill_policy
        self.decode_policy = decode_policy
        registry.on_removed.append(prefill_policy.forget)
        registry.on_removed.append(decode_policy.forget)

    def serves(self, model: str) -> bool:
        """The model is served by pairs: it has prefill or decode workers (then only pairs serve it)."""
        return self.registry.disaggregated(model) is not None

    def select(self, model: str, request: RoutingRequest, exclude: "set[str]" = frozenset()) -> Pair:
        """A pair whose circuits both admitted this attempt; NoCapacity naming what is missing otherwise."""
        now = trio.current_time()
        registry = self.registry
        prefills = _prefer_untried(registry.candidates(model, now, "grpc", PREFILL), exclude)
        decodes = _prefer_untried(registry.candidates(model, now, "grpc", DECODE), exclude)
        if not prefills or not decodes:
            raise _missing(model, registry.disaggregated(model), prefills, decodes)
        refusals: list[str] = []
        while prefills:
            prefill = self.prefill_policy.choose(prefills, request)
            prefills = [w for w in prefills if w is not prefill]
            compatible = []
            for decode in decodes:
                refusal = pair_refusal(prefill, decode)
                if refusal is None:
                    compatible.append(decode)
                elif len(refusals) < 3:
                    refusals.append(f"{prefill.id}/{decode.id}: {refusal}")
            if not compatible or not prefill.breaker.acquire(now):
                continue
            while compatible:
                decode = self.decode_policy.choose(compatible, request)
                if decode.breaker.acquire(now):
                    return Pair(prefill, decode)
                compatible = [w for w in compatible if w is not decode]
            prefill.breaker.release_probe()
        if refusals:
            raise NoCapacity(f"no prefill and decode worker of model {model!r} can pair ({'; '.join(refusals)})",
                             code="no_compatible_pd_pair", retry_after_s=1)
        raise NoCapacity(f"no prefill/decode pair of model {model!r} can take a request right now (circuits open)",
                         code="no_healthy_worker", retry_after_s=1)


def _prefer_untried(workers: "list[Worker]", exclude: "set[str]") -> "list[Worker]":
    """A retry prefers workers not tried yet, but falls back to those tried when no other is left."""
    if exclude and len(workers) > 1:
        others = [w for w in workers if w.id not in exclude]
        return others or workers
    return workers


def _missing(model: str, registered: "tuple[list[Worker], list[Worker]] | None", prefills: list,
             decodes: list) -> NoCapacity:
    prefill_count, decode_count = (len(registered[0]), len(registered[1])) if registered else (0, 0)
    for role, available, count in ((PREFILL, prefills, prefill_count), (DECODE, decodes, decode_count)):
        if available:
            continue
        if count == 0:
            return NoCapacity(f"model {model!r} has no {role} worker: a disaggregated model needs prefill and decode "
                              f"workers ({prefill_count} prefill and {decode_count} decode registered)",
                              code=f"no_{role}_worker", retry_after_s=1)
        return NoCapacity(f"none of the {count} {role} workers of model {model!r} is healthy right now",
                          code=f"no_{role}_worker", retry_after_s=1)
    raise AssertionError("unreachable: called with a side missing")


def _connector_mode(kv_connector: str) -> str:
    name = kv_connector.lower()
    return "nixl" if "nixl" in name else "mooncake" if "mooncake" in name else "passthrough"


class _Legs:
    """One SGLang attempt's shared state between its prefill task and the decode."""

    __slots__ = ("handed_over", "prefill_done", "prefill_error", "decode_scope")

    def __init__(self, decode_scope: trio.CancelScope) -> None:
        self.handed_over = False  # the decode produced its first token: the KV arrived
        self.prefill_done = False
        self.prefill_error: EngineCallError | None = None
        self.decode_scope = decode_scope


# decode(worker, handover, on_first_token) -> the decode leg's result (Generator._attempt with a hand-over)
DecodeLeg = Callable[[Worker, Handover, Callable[[], None]], Awaitable[T]]


class PdLegs:
    def __init__(self, config: PdConfig, pairs: PairRouter, metrics: GatewayMetrics, nursery: trio.Nursery,
                 tracing: Any = None, rooms: RoomDraw | None = None) -> None:
        self.config = config
        self.pairs = pairs
        self.metrics = metrics
        self._nursery = nursery  # long-lived: an SGLang prefill's answer may come after the decode's end
        self.rooms = rooms or RoomDraw()
        self.tracing = tracing  # gateway.tracing's Tracing when --enable-trace: a span per prefill leg

    async def run(self, pair: Pair, plan: Any, metadata: "tuple[tuple[bytes, bytes], ...]",
                  decode: "DecodeLeg[T]") -> T:
        """One attempt on ``pair``: ``plan`` is the request's GenerationPlan; AttemptFailed when it may be retried."""
        self.metrics.child(self.metrics.pd_pair_selections, plan.model).inc()
        if pair.decode.handover == KV_TRANSFER_PARAMS:
            return await self._sequential(pair, plan, metadata, decode)
        return await self._simultaneous(pair, plan, metadata, decode)

    # -- SGLang: both at once ------------------------------------------------------------------------------

    async def _simultaneous(self, pair: Pair, plan: Any, metadata: Any, decode: "DecodeLeg[T]") -> T:
        prefill = pair.prefill
        room = self.rooms.draw()
        handover = Handover(bootstrap_host=parse_worker_origin(prefill.url).host,
                            bootstrap_port=prefill.bootstrap_port or DEFAULT_BOOTSTRAP_PORT, bootstrap_room=room)
        started_at = trio.current_time()
        legs = _Legs(trio.CancelScope(deadline=started_at + self.config.bootstrap_timeout_s))
        prefill_scope = trio.CancelScope()
        self._nursery.start_soon(self._prefill_leg, prefill, plan, handover, metadata, legs, prefill_scope, room,
                                 started_at)

        def handed_over() -> None:
            legs.handed_over = True
            legs.decode_scope.deadline = math.inf
            self._observe_ttft(plan.model, prefill.runtime, started_at)

        try:
            with legs.decode_scope:
                return await decode(pair.decode, handover, handed_over)
            # Cancelled before the hand-over: by the prefill's failure, or by the bound.
            if legs.prefill_error is not None:
                self.metrics.pd_bootstrap_failures.labels("prefill_failed").inc()
                raise AttemptFailed(legs.prefill_error)
            raise self._timed_out(pair, legs.prefill_done)
        finally:
            if not legs.prefill_done:
                prefill_scope.cancel()  # the decode failed or the bound passed: the prefill is aborted

    async def _prefill_leg(self, worker: Worker, plan: Any, handover: Handover, metadata: Any, legs: _Legs,
                           scope: trio.CancelScope, room: int, started_at: float) -> None:
        try:
            with scope:
                # Bounded on its own too: an SGLang prefill answers once the decode took the KV.
                scope.deadline = started_at + self.config.bootstrap_timeout_s
                await self._prefill_call(worker, plan, plan.sampling, handover, metadata, started_at)
                legs.prefill_done = True
        except AttemptFailed as failed:
            if not legs.handed_over:
                legs.prefill_error = failed.error
                legs.decode_scope.cancel()
            else:  # the decode has its KV: the prefill's answer no longer matters
                log.info("request %s: the prefill on %s failed after the hand-over: %s", plan.request_id,
                         worker.id, failed.error)
        finally:
            self.rooms.release(room)

    # -- vLLM: prefill, then decode ------------------------------------------------------------------------

    async def _sequential(self, pair: Pair, plan: Any, metadata: Any, decode: "DecodeLeg[T]") -> T:
        prefill = pair.prefill
        started_at = trio.current_time()
        sampling = dataclasses.replace(plan.sampling, max_new_tokens=1, min_new_tokens=0, n=1, logprobs=None,
                                       prompt_logprobs=False)
        self.metrics.pd_kv_connector_mode.labels(_connector_mode(prefill.pairing.kv_connector)).inc()
        answer = None
        with trio.move_on_after(self.config.bootstrap_timeout_s):
            answer = await self._prefill_call(prefill, plan, sampling, Handover(kv_transfer_params_json=
                                                                                 VLLM_PREFILL_PARAMS),
                                              metadata, started_at)
        if answer is None:
            raise self._timed_out(pair, prefill_done=False)
        prefilled_at = trio.current_time()
        params = answer.kv_transfer_params_json
        if not params:
            # An engine without a KV connector (or an older servicer) answered nothing to hand over: the decode
            # computes the prompt again, as smg lets it.
            self.metrics.pd_kv_transfer_failures.labels("no_params").inc()
            log.warning("request %s: the prefill on %s returned no kv_transfer_params; the decode recomputes the "
                        "prompt", plan.request_id, prefill.id)
        decode_scope = trio.CancelScope(deadline=prefilled_at + self.config.bootstrap_timeout_s)

        def handed_over() -> None:
            decode_scope.deadline = math.inf
            runtime = prefill.runtime
            self.metrics.child(self.metrics.pd_kv_transfer_duration, plan.model, runtime).observe(
                trio.current_time() - prefilled_at)
            self._observe_ttft(plan.model, runtime, started_at)

        finished = False
        try:
            with decode_scope:
                result = await decode(pair.decode, Handover(kv_transfer_params_json=params or None), handed_over)
                finished = True
                return result
            raise self._timed_out(pair, prefill_done=True)
        finally:
            if not finished:  # the prefill holds the KV for a decode that will not come: let it go
                self._nursery.start_soon(self._abort, prefill, plan.request_id)

    # -- shared ----------------------------------------------------------------------------------------------

    async def _prefill_call(self, worker: Worker, plan: Any, sampling: Any, handover: Handover, metadata: Any,
                            started_at: float) -> Any:
        """The prefill leg on ``worker``: its circuit judged, aborted if it does not finish; AttemptFailed on the
        engine's error."""
        finished = False
        with WorkerAttempt(worker) as attempt:
            try:
                if self.tracing is not None and self.tracing.active():
                    with self.tracing.client_span("engine.prefill", {"smg.worker.id": worker.id,
                                                                     "smg.worker.url": worker.url,
                                                                     "smg.pd.room": handover.bootstrap_room or 0}):
                        answer = await worker.client.prefill(plan.request_id, plan.input_ids, sampling, handover,
                                                             plan.timeout_s, metadata, plan.media)
                else:
                    answer = await worker.client.prefill(plan.request_id, plan.input_ids, sampling, handover,
                                                         plan.timeout_s, metadata, plan.media)
                finished = True
            except EngineCallError as e:
                self.metrics.engine_errors.labels(worker.id, e.code).inc()
                attempt.failed(e)
                raise AttemptFailed(e) from None
            finally:
                if not finished:
                    self.metrics.aborts.labels("cancelled_or_failed").inc()
                    self._nursery.start_soon(self._abort, worker, plan.request_id)
        self.metrics.child(self.metrics.pd_prefill_duration, plan.model, worker.runtime).observe(
            trio.current_time() - started_at)
        return answer

    def _timed_out(self, pair: Pair, prefill_done: bool) -> AttemptFailed:
        """The bound passed before the hand-over: the side that did not answer has a failure on its circuit."""
        self.metrics.pd_bootstrap_failures.labels("timeout").inc()
        silent = pair.decode if prefill_done else pair.prefill
        silent.breaker.record_failure(trio.current_time())
        return AttemptFailed(EngineCallError(
            "DEADLINE_EXCEEDED", f"no KV hand-over from prefill {pair.prefill.id} to decode {pair.decode.id} within "
                                 f"{self.config.bootstrap_timeout_s:g} s ({silent.id} did not answer)"))

    def _observe_ttft(self, model: str, runtime: str, started_at: float) -> None:
        self.metrics.child(self.metrics.pd_ttft, model, runtime).observe(trio.current_time() - started_at)

    async def _abort(self, worker: Worker, request_id: str) -> None:
        await abort_quietly(worker, request_id, ABORT_TIMEOUT_S)


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--pd-disaggregation", "pd.enabled", "bool", "serve models on prefill/decode pairs of engines (SGLang: "
           "both at once with one bootstrap room; vLLM: prefill, then decode with its kv_transfer_params)",
           "disaggregation"),
    Option("--prefill", "pd.prefill", "prefill", "a prefill engine: URL [BOOTSTRAP_PORT] (repeat the flag for more; "
           "the bootstrap port defaults to 8998)", "disaggregation"),
    Option("--decode", "pd.decode", "append", "a decode engine: URL (repeat the flag for more)", "disaggregation"),
    Option("--prefill-policy", "pd.prefill_policy", str, "routing policy among prefill workers (default: --policy; "
           "cache_aware reads the KV index of the prefill engines)", "disaggregation", choices=POLICIES),
    Option("--decode-policy", "pd.decode_policy", str, "routing policy among decode workers (default: --policy)",
           "disaggregation", choices=POLICIES),
    Option("--pd-bootstrap-timeout-secs", "pd.bootstrap_timeout_s", float, "longest wait for a KV hand-over: from "
           "dispatch to the decode's first token, past which the attempt fails and is retried on another pair",
           "disaggregation"),
)

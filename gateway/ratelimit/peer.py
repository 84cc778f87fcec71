"""The peer protocol of proto/ratelimit.proto: framing, conversions, and batching per owner.

A frame over the mesh's sealed stream transport is ``b"R"`` (a rate-limit
request, so the cluster's request hook can route it), one byte for the method,
then the protobuf request; the answer is the protobuf response.

``Batcher`` coalesces the decisions a node needs from one owner (see its
docstring: gubernator's BatchWait and BatchLimit, plus a limit on batches in
flight so that batches grow with the load). Each caller waits for its own
item's result. A batch that cannot be delivered fails every item in it with
``PeerUnreachable``.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import math
from collections.abc import Awaitable, Callable

import trio

from mesh import PeerUnreachable  # the owner did not answer (refused, timed out, unreadable answer)
from proto import ratelimit_pb2 as pb

from .algorithms import Algorithm, Decision, KeyState, Mode, Rate

RATE_LIMIT_MARK = b"R"
METHOD_DECIDE = b"D"
METHOD_REPLICATE = b"P"

ITEMS_PER_REQUEST_MAX = 10_000  # a peer's batch beyond this is refused whole
KEY_CHARS_MAX = 512
HITS_MAX = 1e12
# A replicated state's times (wall-clock seconds) and window index: a bucket's theoretical arrival time is
# now plus the debt FORCE hits may build (HITS_MAX units at the slowest rate is far beyond), so anything
# past 2^40 s (the year 36812) or before 1970 is not a state a member computed.
STATE_TIME_MAX_S = float(2 ** 40)
WINDOW_INDEX_MAX = 2 ** 53  # window indices are floor(now / window_s): exact as floats up to here
COUNT_MAX = 1e18
_ALGORITHM_TO_PB = {Algorithm.TOKEN_BUCKET: pb.ALGORITHM_TOKEN_BUCKET,
                    Algorithm.SLIDING_WINDOW: pb.ALGORITHM_SLIDING_WINDOW,
                    Algorithm.FIXED_PERIOD: pb.ALGORITHM_FIXED_PERIOD}
_ALGORITHM_FROM_PB = {v: k for k, v in _ALGORITHM_TO_PB.items()}


class ItemError(Exception):
    """The owner refused one item of a batch; the message says why."""


class BadRequest(Exception):
    """A peer's whole request is malformed (not one bad item: the frame itself)."""


def rate_to_pb(rate: Rate) -> pb.LimitSpec:
    return pb.LimitSpec(algorithm=_ALGORITHM_TO_PB[rate.algorithm], limit=rate.limit, window_s=rate.window_s,
                        burst=rate.burst)


# The few distinct specs a cluster uses, parsed and checked once: a batch repeats them per item.
_RATES_CACHED_MAX = 4096
_rates: dict[tuple[int, float, float, float], Rate] = {}
_MODES = {int(m): m for m in Mode}


def rate_from_pb(spec: pb.LimitSpec) -> Rate:
    fields = (spec.algorithm, spec.limit, spec.window_s, spec.burst)
    rate = _rates.get(fields)
    if rate is not None:
        return rate
    algorithm = _ALGORITHM_FROM_PB.get(spec.algorithm)
    if algorithm is None:
        raise ItemError(f"unknown algorithm {spec.algorithm}")
    rate = Rate(algorithm, spec.limit, spec.window_s, spec.burst)
    problem = rate.problem()
    if problem is not None:
        raise ItemError(problem)
    if len(_rates) >= _RATES_CACHED_MAX:
        _rates.clear()
    _rates[fields] = rate
    return rate


def check_item(key: str, hits: float, mode: int) -> Mode:
    if not key or len(key) > KEY_CHARS_MAX:
        raise ItemError(f"the key must be 1 to {KEY_CHARS_MAX} characters")
    if not 0 <= hits <= HITS_MAX:  # also false for NaN
        raise ItemError(f"hits must be a number from 0 to {HITS_MAX:g}, not {hits!r}")
    known = _MODES.get(mode)
    if known is None:
        raise ItemError(f"unknown mode {mode}")
    return known


def add_decision(response: pb.DecideResponse, decision: Decision) -> None:
    retry = decision.retry_after_s
    response.results.add(outcome=pb.OUTCOME_ALLOWED if decision.allowed else pb.OUTCOME_DENIED,
                         limit=decision.limit, remaining=decision.remaining, reset_after_s=decision.reset_after_s,
                         retry_after_s=retry if retry != math.inf else -1.0)


def decision_from_pb(result: pb.DecideResult) -> Decision:
    if result.outcome == pb.OUTCOME_ERROR:
        raise ItemError(result.error[:200] or "the owner refused the item")
    if result.outcome not in (pb.OUTCOME_ALLOWED, pb.OUTCOME_DENIED):
        raise ItemError(f"unknown outcome {result.outcome}")
    # The owner's numbers go into response headers (int(remaining)...): NaN or infinity would fail there.
    values = (result.limit, result.remaining, result.reset_after_s, result.retry_after_s)
    if not all(math.isfinite(v) and -1.0 <= v <= COUNT_MAX for v in values):
        raise ItemError("the owner's decision holds a number out of range")
    retry = result.retry_after_s
    return Decision(result.outcome == pb.OUTCOME_ALLOWED, result.limit, result.remaining, result.reset_after_s,
                    retry if retry >= 0 else math.inf)


def state_to_pb(key: str, rate: Rate, state: KeyState) -> pb.KeyState:
    return pb.KeyState(key=key, spec=rate_to_pb(rate), tat_s=state.tat_s, window_index=state.window_index,
                       current_count=state.current, previous_count=state.previous)


def state_from_pb(message: pb.KeyState) -> tuple[str, Rate, KeyState]:
    key = message.key
    if not key or len(key) > KEY_CHARS_MAX:
        raise ItemError("bad key")
    if not (math.isfinite(message.tat_s) and 0.0 <= message.tat_s <= STATE_TIME_MAX_S
            and 0 <= message.window_index <= WINDOW_INDEX_MAX
            and all(math.isfinite(v) and 0.0 <= v <= COUNT_MAX
                    for v in (message.current_count, message.previous_count))):
        raise ItemError("bad state values")
    return key, rate_from_pb(message.spec), KeyState(message.tat_s, message.window_index, message.current_count,
                                                     message.previous_count)


def parse_request(payload: bytes) -> tuple[bytes, pb.DecideRequest | pb.ReplicateRequest]:
    """(method, request) from a frame after the ``R`` mark; BadRequest when it is not one of ours."""
    method, body = payload[:1], payload[1:]
    kind = {METHOD_DECIDE: pb.DecideRequest, METHOD_REPLICATE: pb.ReplicateRequest}.get(method)
    if kind is None:
        raise BadRequest(f"unknown method {method!r}")
    message = kind()
    try:
        message.ParseFromString(body)
    except Exception as e:  # protobuf's DecodeError and friends
        raise BadRequest(f"unreadable {kind.__name__}: {e}") from None
    items = message.items if method == METHOD_DECIDE else message.states
    if len(items) > ITEMS_PER_REQUEST_MAX:
        raise BadRequest(f"{len(items)} items in one request; at most {ITEMS_PER_REQUEST_MAX}")
    return method, message


@dataclasses.dataclass(frozen=True)
class PendingItem:
    key: str
    rate: Rate
    hits: float
    mode: Mode


class _Batch:
    def __init__(self) -> None:
        self.items: list[PendingItem] = []
        self.results: list[Decision | Exception] = []
        self.done = trio.Event()
        # The context of the request that opened the batch: the batch is sent in it, so a traced request's
        # decision asked of another node is in its trace (and a batch is never sent in the context of a
        # request that opened an earlier one).
        self.context = contextvars.copy_context()


class _Lane:
    """The batches of one owner: the one filling up, those waiting to go, how many are out."""

    def __init__(self) -> None:
        self.filling: _Batch | None = None
        self.waiting: collections.deque[_Batch] = collections.deque()
        self.in_flight = 0
        self.timer_set = False


# send(owner, request) -> response; raises PeerUnreachable.
SendFn = Callable[[str, pb.DecideRequest], Awaitable[pb.DecideResponse]]


@dataclasses.dataclass
class BatcherStats:
    batches: int = 0
    items: int = 0
    failed_batches: int = 0


class Batcher:
    """Coalesces decide items per owner; ``await decide(owner, item)`` returns its Decision.

    A batch goes out ``batch_wait_s`` after its first item (0: at the next scheduler tick, so
    callers of the same tick share it), or at once when it holds ``batch_items_max`` items,
    but never more than ``in_flight_max`` to one owner at a time: under load, items gather
    while the previous batch travels and leave together the moment it returns. Low load
    pays one round trip; high load pays one round trip per batch instead of per item.
    """

    def __init__(self, sender: str, send: SendFn, batch_wait_s: float, batch_items_max: int,
                 on_batch: Callable[[int], None] | None = None, in_flight_max: int = 2) -> None:
        self.sender = sender
        self._send = send
        self.batch_wait_s = batch_wait_s
        self.batch_items_max = batch_items_max
        self.in_flight_max = in_flight_max
        self._lanes: dict[str, _Lane] = {}
        self._nursery: trio.Nursery | None = None
        self._on_batch = on_batch
        self.stats = BatcherStats()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def submit(self, owner: str, item: PendingItem) -> tuple[_Batch, int]:
        """Queue ``item`` for ``owner``; the caller waits on ``batch.done`` then reads ``results[index]``."""
        assert self._nursery is not None, "Batcher.run must be started first"
        lane = self._lanes.get(owner)
        if lane is None:
            lane = self._lanes[owner] = _Lane()
        batch = lane.filling
        if batch is None:
            batch = lane.filling = _Batch()
        batch.items.append(item)
        index = len(batch.items) - 1
        if len(batch.items) >= self.batch_items_max:
            self._close(owner, lane)
        elif not lane.timer_set and lane.in_flight < self.in_flight_max:
            lane.timer_set = True
            self._nursery.start_soon(self._flush_after_wait, owner, lane)
        return batch, index

    async def decide(self, owner: str, item: PendingItem) -> Decision:
        batch, index = self.submit(owner, item)
        await batch.done.wait()
        result = batch.results[index]
        if isinstance(result, Exception):
            raise result
        return result

    def _close(self, owner: str, lane: _Lane) -> None:
        if lane.filling is not None:
            lane.waiting.append(lane.filling)
            lane.filling = None
        while lane.waiting and lane.in_flight < self.in_flight_max:
            lane.in_flight += 1
            assert self._nursery is not None
            batch = lane.waiting.popleft()
            batch.context.run(self._nursery.start_soon, self._deliver, owner, lane, batch)

    async def _flush_after_wait(self, owner: str, lane: _Lane) -> None:
        if self.batch_wait_s > 0:
            await trio.sleep(self.batch_wait_s)
        else:
            await trio.lowlevel.checkpoint()  # still lets callers in the same tick join
        lane.timer_set = False
        self._close(owner, lane)

    async def _deliver(self, owner: str, lane: _Lane, batch: _Batch) -> None:
        try:
            await self._deliver_one(owner, batch)
        finally:
            lane.in_flight -= 1
            if not lane.timer_set:
                self._close(owner, lane)  # what gathered meanwhile leaves now
            if lane.filling is None and not lane.waiting and not lane.in_flight and not lane.timer_set:
                self._lanes.pop(owner, None)

    async def _deliver_one(self, owner: str, batch: _Batch) -> None:
        request = pb.DecideRequest(sender=self.sender)
        specs: dict[Rate, pb.LimitSpec] = {}
        for i in batch.items:
            spec = specs.get(i.rate)
            if spec is None:
                spec = specs[i.rate] = rate_to_pb(i.rate)
            request.items.add(key=i.key, spec=spec, hits=i.hits, mode=i.mode)
        self.stats.batches += 1
        self.stats.items += len(batch.items)
        if self._on_batch is not None:
            self._on_batch(len(batch.items))
        try:
            response = await self._send(owner, request)
            if len(response.results) != len(batch.items):
                raise PeerUnreachable(f"{owner} answered {len(response.results)} results for "
                                      f"{len(batch.items)} items")
            results: list[Decision | Exception] = []
            for result in response.results:
                try:
                    results.append(decision_from_pb(result))
                except ItemError as e:
                    results.append(e)
            batch.results = results
        except PeerUnreachable as e:
            self.stats.failed_batches += 1
            batch.results = [e] * len(batch.items)
        finally:
            if not batch.results:  # cancelled: nobody must wait forever
                batch.results = [PeerUnreachable("cancelled")] * len(batch.items)
            batch.done.set()

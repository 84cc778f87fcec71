"""Rate-limit algorithms: pure functions of (rate, state, now, hits). No clock, no I/O.

Token bucket, as GCRA (the generic cell rate algorithm): the state is one
number, the theoretical arrival time ``tat_s``. Each unit moves it forward by
``interval = window_s / limit``; a request is admitted while ``tat_s - now``
stays within ``burst * interval``. It is a token bucket holding ``burst``
units and refilling ``limit`` per ``window_s``, continuously, without a timer.

Sliding window, as the weighted counter (two fixed windows): the count over
the last ``window_s`` is estimated as ``previous * (1 - elapsed fraction) +
current``. No burst beyond the limit, at the price of an estimate that assumes
the previous window's requests were spread evenly.

Fixed period, for budgets (gateway/spend/budgets.py): a plain count that never decays. The period (a
calendar day, week or month) is part of the counter's key, so the next period is another key that starts
at zero; ``window_s`` is the longest the period can last, and the state's ``tat_s`` when the owner first
counted it: a key is idle (may be forgotten) once that long has passed, or while it counts nothing.

Times are wall-clock seconds (``time.time()`` in a node): states travel between
nodes as absolute times, so nodes must share NTP time. A skew of d seconds
makes a peer's bucket look d * limit / window_s units fuller or emptier.

Modes (the same as the peer protocol's): ``DECIDE`` admits or denies;
``FORCE`` counts hits admitted elsewhere whatever the state (the bucket may go
into debt: later requests wait it out); ``REFUND`` gives back what a
reservation over-estimated; ``PEEK`` only reports.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import NamedTuple

EPSILON = 1e-9
# No limit, burst or window (seconds: 31 million years) is larger: the bound keeps every quantity derived
# from a rate (intervals, window indices, times) finite and exact enough, whoever sent the rate.
RATE_VALUE_MAX = 1e15


class Algorithm(enum.Enum):
    TOKEN_BUCKET = "token_bucket"
    SLIDING_WINDOW = "sliding_window"
    FIXED_PERIOD = "fixed_period"


class Mode(enum.IntEnum):
    # The peer protocol's Mode values: append-only.
    DECIDE = 0
    FORCE = 1
    REFUND = 2
    PEEK = 3


@dataclasses.dataclass(frozen=True)
class Rate:
    """``limit`` units per ``window_s``; a token bucket holds up to ``burst`` units."""

    algorithm: Algorithm
    limit: float
    window_s: float
    burst: float

    def problem(self) -> str | None:
        """Why this rate cannot be used, or None."""
        for name in ("limit", "window_s", "burst"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                return f"{name} must be a positive number, not {value!r}"
            if value > RATE_VALUE_MAX:
                return f"{name} must be at most {RATE_VALUE_MAX:g}, not {value!r}"
        return None

    @property
    def interval_s(self) -> float:
        return self.window_s / self.limit

    @property
    def capacity(self) -> float:
        """The most a single request may ask for."""
        return self.burst if self.algorithm is Algorithm.TOKEN_BUCKET else self.limit


@dataclasses.dataclass
class KeyState:
    tat_s: float = 0.0  # token bucket
    window_index: int = 0  # sliding window
    current: float = 0.0
    previous: float = 0.0

    def copy(self) -> "KeyState":
        return dataclasses.replace(self)


class Decision(NamedTuple):
    allowed: bool
    limit: float
    remaining: float  # units left after this decision
    reset_after_s: float  # until the full allowance is back
    retry_after_s: float  # when denied: until the same hits would pass (inf: never, they exceed the capacity)


def decide(rate: Rate, state: KeyState, now: float, hits: float, mode: Mode = Mode.DECIDE) -> Decision:
    """Apply ``hits`` in ``mode`` to ``state`` (changed in place) and report the outcome."""
    if rate.algorithm is Algorithm.TOKEN_BUCKET:
        return _token_bucket(rate, state, now, hits, mode)
    if rate.algorithm is Algorithm.FIXED_PERIOD:
        return _fixed_period(rate, state, now, hits, mode)
    return _sliding_window(rate, state, now, hits, mode)


def _token_bucket(rate: Rate, state: KeyState, now: float, hits: float, mode: Mode) -> Decision:
    interval = rate.interval_s
    tolerance = rate.burst * interval
    base = max(state.tat_s, now)
    allowed = True
    retry_after = 0.0
    if mode is Mode.DECIDE:
        new_tat = base + hits * interval
        if new_tat - now <= tolerance + EPSILON:
            state.tat_s = new_tat
        else:
            allowed = False
            retry_after = math.inf if hits > rate.burst + EPSILON else new_tat - now - tolerance
    elif mode is Mode.FORCE:
        state.tat_s = base + hits * interval
    elif mode is Mode.REFUND:
        state.tat_s = max(now, state.tat_s - hits * interval)
    used_s = max(0.0, state.tat_s - now)
    remaining = max(0.0, math.floor((tolerance - used_s) / interval + EPSILON))
    return Decision(allowed, rate.limit, remaining, used_s, retry_after)


def _fixed_period(rate: Rate, state: KeyState, now: float, hits: float, mode: Mode) -> Decision:
    allowed = True
    retry_after = 0.0
    reset_after = max(0.0, state.tat_s + rate.window_s - now)  # at the latest: the caller knows the calendar
    if mode is Mode.DECIDE:
        if state.current + hits <= rate.limit + EPSILON:
            state.current += hits
        else:
            allowed = False
            retry_after = math.inf if hits > rate.limit + EPSILON else reset_after
    elif mode is Mode.FORCE:
        state.current += hits
    elif mode is Mode.REFUND:
        state.current = max(0.0, state.current - hits)
    return Decision(allowed, rate.limit, max(0.0, rate.limit - state.current), reset_after, retry_after)


def _roll(rate: Rate, state: KeyState, now: float) -> int:
    index = math.floor(now / rate.window_s)
    if index == state.window_index + 1:
        state.previous, state.current = state.current, 0.0
    elif index != state.window_index:
        state.previous = state.current = 0.0
    state.window_index = index
    return index


def _sliding_window(rate: Rate, state: KeyState, now: float, hits: float, mode: Mode) -> Decision:
    window = rate.window_s
    index = _roll(rate, state, now)
    start = index * window
    weight = 1.0 - (now - start) / window
    used = state.previous * weight + state.current
    allowed = True
    retry_after = 0.0
    if mode is Mode.DECIDE:
        if used + hits <= rate.limit + EPSILON:
            state.current += hits
            used += hits
        else:
            allowed = False
            retry_after = _window_retry_after(rate, state, now, hits, start)
    elif mode is Mode.FORCE:
        state.current += hits
        used += hits
    elif mode is Mode.REFUND:
        refunded = min(hits, state.current)
        state.current -= refunded
        used -= refunded
    if state.current > 0:
        reset_after = start + 2 * window - now
    elif state.previous > 0:
        reset_after = start + window - now
    else:
        reset_after = 0.0
    return Decision(allowed, rate.limit, max(0.0, math.floor(rate.limit - used + EPSILON)), reset_after, retry_after)


def _window_retry_after(rate: Rate, state: KeyState, now: float, hits: float, start: float) -> float:
    """When ``hits`` would fit, assuming nothing else arrives."""
    window, limit = rate.window_s, rate.limit
    if hits > limit + EPSILON:
        return math.inf
    if state.current + hits <= limit + EPSILON and state.previous > 0:
        # Later in this window, as the previous window's weight fades.
        fraction = 1.0 - (limit - state.current - hits) / state.previous
        return max(0.0, start + fraction * window - now)
    # In the next window the current count becomes the fading one.
    fraction = 1.0 - (limit - hits) / state.current if state.current > 0 else 0.0
    return max(0.0, start + window + fraction * window - now)


def is_idle(rate: Rate, state: KeyState, now: float) -> bool:
    """True when the key is back to its full allowance: forgetting it loses nothing."""
    if rate.algorithm is Algorithm.TOKEN_BUCKET:
        return state.tat_s <= now
    if rate.algorithm is Algorithm.FIXED_PERIOD:
        return state.current <= 0 or now >= state.tat_s + rate.window_s
    _roll(rate, state, now)
    return state.current <= 0 and state.previous <= 0


def merge_max(rate: Rate, ours: KeyState, theirs: KeyState, now: float) -> None:
    """Fold ``theirs`` into ``ours`` keeping the more consumed of the two (never under-counts).

    Used when two nodes both hold a key's state and neither is known to be the
    newer (a handoff after the ring changed): the merge is a max, so it is
    idempotent and the order of deliveries does not matter.
    """
    if rate.algorithm is Algorithm.TOKEN_BUCKET:
        ours.tat_s = max(ours.tat_s, theirs.tat_s)
        return
    if rate.algorithm is Algorithm.FIXED_PERIOD:
        ours.current = max(ours.current, theirs.current)
        ours.tat_s = min(ours.tat_s, theirs.tat_s)  # the first count of the period: it is idle no sooner
        return
    theirs = theirs.copy()
    _roll(rate, ours, now)
    _roll(rate, theirs, now)
    ours.current = max(ours.current, theirs.current)
    ours.previous = max(ours.previous, theirs.previous)

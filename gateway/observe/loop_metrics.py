"""Prometheus counters and histograms for metrics only the serving loop's thread updates.

prometheus_client guards every value with a lock, since any thread may update it: a labelled
child's ``inc`` takes ~0.35 us and a histogram's ``observe`` ~0.7 us (the observability check,
a lock for the sum, a Python loop over the buckets, a lock for the bucket). A request makes
four to six of them (its count and duration, its tokens, a stream's time to first token and
per output token). Here the values are plain floats, the bucket found by ``bisect``: ~0.1 and
~0.2 us. Safe where one thread writes them and scrapes run on that thread too (``/metrics``
is served by the loop): a gateway process runs its requests on one trio loop. Metrics that
other threads update (the collector's pause times: ``gc.callbacks`` run on whichever thread
collects) keep prometheus_client's classes.

What is exported is prometheus_client's own: these subclasses change where a child keeps its
numbers, not the samples made of them (tests/unit/test_loop_metrics.py compares the text
exposition with the stock classes'). They rely on its internals (``_metric_init``, ``_value``,
``_sum``, ``_buckets``, ``_upper_bounds``): where a release moves them, ``_metric_init`` finds
no lock-guarded values to replace and the stock paths run (the test fails so we notice).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from prometheus_client import Counter, Histogram, values


class _LoopValue:
    """prometheus_client's ``MutexValue`` without its mutex (the same methods)."""

    __slots__ = ("_value", "_exemplar")

    def __init__(self) -> None:
        self._value = 0.0
        self._exemplar: Any = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: Any = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: Any) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> Any:
        return self._exemplar


def _lock_guarded(value: Any) -> bool:
    """A value this module may replace: the in-process kind (not the multiprocess mode's mmapped files)."""
    return type(value) is values.MutexValue


class LoopCounter(Counter):
    _loop = False  # True for a child whose value is a _LoopValue (set in _metric_init)

    def _metric_init(self) -> None:
        super()._metric_init()
        if _lock_guarded(getattr(self, "_value", None)):
            self._value = _LoopValue()
            self._loop = True

    def inc(self, amount: float = 1, exemplar: "dict[str, str] | None" = None) -> None:
        if self._loop and exemplar is None and amount >= 0:
            self._value._value += amount
            return
        super().inc(amount, exemplar)  # a parent with labels, a negative amount, an exemplar: its checks


class LoopHistogram(Histogram):
    _loop = False

    def _metric_init(self) -> None:
        super()._metric_init()
        buckets = getattr(self, "_buckets", None)
        if _lock_guarded(getattr(self, "_sum", None)) and buckets and all(map(_lock_guarded, buckets)) \
                and len(buckets) == len(getattr(self, "_upper_bounds", ())):
            self._sum = _LoopValue()
            self._buckets = [_LoopValue() for _ in buckets]
            self._loop = True

    def observe(self, amount: float, exemplar: "dict[str, str] | None" = None) -> None:
        # NaN falls in no bucket in prometheus_client's loop (every comparison is false) but in the first
        # by bisect: left to it. The last bound is +Inf, so every other amount has a bucket.
        if self._loop and exemplar is None and amount == amount:
            self._sum._value += amount
            self._buckets[bisect_left(self._upper_bounds, amount)]._value += 1
            return
        super().observe(amount, exemplar)

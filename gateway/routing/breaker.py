"""Circuit breaker per engine. Sans-I/O: every method takes ``now`` (seconds).

Rules:
* closed: requests flow. ``failure_threshold`` consecutive failures, each
  within ``window_s`` of the previous one, open the circuit.
* open: no requests, until ``open_duration_s`` has passed, or the engine's health
  check passes again after failing (``health_recovered``); then half-open.
* half-open: at most ``half_open_probes_max`` requests at a time probe the
  engine. ``success_threshold`` successes close the circuit; any failure
  opens it again for another ``open_duration_s``.
"""

from __future__ import annotations

import dataclasses
import enum
from ..base.options import Option


class CircuitState(enum.Enum):
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


@dataclasses.dataclass(frozen=True)
class BreakerConfig:
    enabled: bool = True
    # smg's defaults: 10 failures to trip, 3 successes to close, 60 s open, 120 s window.
    failure_threshold: int = 10
    success_threshold: int = 3
    open_duration_s: float = 60.0
    window_s: float = 120.0
    half_open_probes_max: int = 1


class CircuitBreaker:
    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self.state = CircuitState.CLOSED
        self.consecutive_failures = 0
        self.consecutive_successes = 0
        self._last_failure_at: float | None = None
        self._opened_at = 0.0
        self._probes_in_flight = 0
        self.transitions = 0

    def _move(self, state: CircuitState, now: float) -> None:
        if state is self.state:
            return
        self.state = state
        self.transitions += 1
        self.consecutive_successes = 0
        if state is CircuitState.OPEN:
            self._opened_at = now
        if state is CircuitState.CLOSED:
            self.consecutive_failures = 0
        self._probes_in_flight = 0

    def current_state(self, now: float) -> CircuitState:
        if self.state is CircuitState.OPEN and now - self._opened_at >= self.config.open_duration_s:
            self._move(CircuitState.HALF_OPEN, now)
        return self.state

    def allows(self, now: float) -> bool:
        """May a request be sent now? (Does not reserve a probe slot; see acquire.)"""
        if not self.config.enabled:
            return True
        state = self.current_state(now)
        if state is CircuitState.CLOSED:
            return True
        if state is CircuitState.HALF_OPEN:
            return self._probes_in_flight < self.config.half_open_probes_max
        return False

    def acquire(self, now: float) -> bool:
        """Reserve the right to send one request; False if the circuit forbids it."""
        if not self.allows(now):
            return False
        if self.config.enabled and self.state is CircuitState.HALF_OPEN:
            self._probes_in_flight += 1
        return True

    def record_success(self, now: float) -> None:
        if not self.config.enabled:
            return
        state = self.current_state(now)
        self.consecutive_failures = 0
        if state is CircuitState.HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)
            self.consecutive_successes += 1
            if self.consecutive_successes >= self.config.success_threshold:
                self._move(CircuitState.CLOSED, now)

    def record_failure(self, now: float) -> None:
        if not self.config.enabled:
            return
        state = self.current_state(now)
        if state is CircuitState.HALF_OPEN:
            self._move(CircuitState.OPEN, now)
            return
        if state is CircuitState.OPEN:
            return  # a request admitted before the circuit opened; it changes nothing
        if self._last_failure_at is not None and now - self._last_failure_at > self.config.window_s:
            self.consecutive_failures = 0  # the earlier failures are too old to count with this one
        self._last_failure_at = now
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.config.failure_threshold:
            self._move(CircuitState.OPEN, now)

    def health_recovered(self, now: float) -> None:
        """The engine's health check passes again after it failed: an open circuit probes it now (half-open)
        instead of after the rest of ``open_duration_s``. Requests still decide: a failed probe opens it
        again. Without this a model whose engines died and came back stayed down for up to a minute more:
        the failures of its outage had opened every node's circuit."""
        if self.config.enabled and self.state is CircuitState.OPEN:
            self._move(CircuitState.HALF_OPEN, now)

    def release_probe(self) -> None:
        """A half-open probe ended without a verdict (the client went away)."""
        if self.state is CircuitState.HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--cb-failure-threshold", "breaker.failure_threshold", int, "failures that open a circuit", "routing"),
    Option("--cb-success-threshold", "breaker.success_threshold", int, "half-open successes that close it", "routing"),
    Option("--cb-timeout-duration-secs", "breaker.open_duration_s", float, "open time before half-open", "routing"),
    Option("--cb-window-duration-secs", "breaker.window_s", float, "window in which failures count", "routing"),
    Option("--disable-circuit-breaker", "breaker.enabled", "disable", "no circuit breaking", "routing"),
)

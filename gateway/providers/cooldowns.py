"""Which targets are cooling down, and the one request that probes a target when its cooldown ends. No I/O: time
is given, and what one node decides reaches the others through ``shared.py``.

A target cools down:

* at once when it answers 429 (or 529, Anthropic's overloaded) with a retry-after: for the time it asked, at most
  ``cooldown_max_s``;
* after ``failures_to_cool`` failures of a kind that say it is unwell (connect, timeout, server, overloaded,
  rate_limited) within ``failure_window_s``: for ``cooldown_s``, doubled each time its probe fails, up to
  ``cooldown_max_s``.

While cooling it is skipped (the route's next target answers). When the time is up, the next request that reaches
it is its probe ("half-open", as a circuit breaker's): the only request sent to it until the probe answers; the
others still skip it. A probe that succeeds ends the cooldown; one that fails starts the next, longer one.
"""

from __future__ import annotations

import dataclasses

from .base import CONNECT, OVERLOADED, RATE_LIMITED, SERVER, TIMEOUT

UNWELL = frozenset({CONNECT, TIMEOUT, SERVER, OVERLOADED, RATE_LIMITED})


@dataclasses.dataclass(frozen=True)
class CooldownConfig:
    # Failures (without a retry-after) within the window before a target cools: one 5xx is a blip a provider's
    # own retries would hide; three in a minute are an outage worth routing around (LiteLLM's default allows 3).
    failures_to_cool: int = 3
    failure_window_s: float = 60.0
    # A first cooldown without a retry-after: long enough to shed the load an unwell provider sees, short enough
    # that a blip costs little. Doubled per failed probe, up to the longest (also the cap of a retry-after: a
    # provider asking for an hour gets five minutes, then a probe).
    cooldown_s: float = 10.0
    cooldown_max_s: float = 300.0


@dataclasses.dataclass
class _Target:
    until_s: float = 0.0  # cooling until then
    length_s: float = 0.0  # the last cooldown's length (doubled by a failed probe)
    failures: list[float] = dataclasses.field(default_factory=list)  # recent failures' times
    probing: bool = False  # a probe is in flight (on this node)


class Cooldowns:
    def __init__(self, config: CooldownConfig = CooldownConfig()) -> None:
        self.config = config
        self._targets: dict[str, _Target] = {}
        self.started = 0  # cooldowns begun here, for metrics

    def available(self, name: str, now: float) -> bool:
        """Whether a request may go to ``name`` now: not cooling, or its cooldown over and no probe in flight
        (then this request is the probe: ``probe`` marks it)."""
        target = self._targets.get(name)
        if target is None or target.until_s == 0.0:
            return True
        return now >= target.until_s and not target.probing

    def probe(self, name: str, now: float) -> bool:
        """Called for a request about to go to ``name``: True when it is the probe of an ended cooldown."""
        target = self._targets.get(name)
        if target is None or target.until_s == 0.0 or now < target.until_s:
            return False
        target.probing = True
        return True

    def release(self, name: str) -> None:
        """A probe that said nothing of the target (the request was refused for its own reasons): the cooldown
        stays over, and the next request that reaches the target probes it."""
        target = self._targets.get(name)
        if target is not None:
            target.probing = False

    def cooling(self, name: str, now: float) -> float:
        """Seconds left of ``name``'s cooldown (0: none)."""
        target = self._targets.get(name)
        return max(0.0, target.until_s - now) if target is not None else 0.0

    def succeeded(self, name: str) -> None:
        target = self._targets.get(name)
        if target is not None:
            target.until_s = target.length_s = 0.0
            target.failures.clear()
            target.probing = False

    def failed(self, name: str, kind: str, retry_after_s: float | None, now: float) -> float | None:
        """A failure of ``kind``: the cooldown's end when it starts one (for the other nodes), else None."""
        if kind not in UNWELL:
            return None
        config = self.config
        target = self._targets.setdefault(name, _Target())
        if target.probing:  # the probe failed: the next cooldown, longer
            target.probing = False
            length = retry_after_s if retry_after_s is not None else min(config.cooldown_max_s,
                                                                         max(target.length_s, config.cooldown_s) * 2)
            return self._cool(target, min(length, config.cooldown_max_s), now)
        if retry_after_s is not None and kind in (RATE_LIMITED, OVERLOADED):
            return self._cool(target, min(max(retry_after_s, 0.0), config.cooldown_max_s), now)
        target.failures = [t for t in target.failures if now - t < config.failure_window_s] + [now]
        if len(target.failures) >= config.failures_to_cool:
            return self._cool(target, config.cooldown_s, now)
        return None

    def _cool(self, target: _Target, length_s: float, now: float) -> float:
        target.length_s = length_s
        target.until_s = now + length_s
        target.failures.clear()
        self.started += 1
        return target.until_s

    def told(self, name: str, until_s: float, now: float) -> None:
        """Another node started a cooldown of ``name`` until ``until_s`` (its clock's time, in ours: nodes' clocks
        agree within what the mesh allows): kept when it ends later than ours."""
        if until_s <= now:
            return
        target = self._targets.setdefault(name, _Target())
        if until_s > target.until_s:
            target.length_s = max(target.length_s, until_s - now)
            target.until_s = until_s
            target.probing = False

    def cooling_targets(self, now: float) -> dict[str, float]:
        """Targets cooling now, with the seconds left."""
        return {name: t.until_s - now for name, t in self._targets.items() if t.until_s > now}

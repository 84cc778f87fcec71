"""Errors of talking to engines. Mapped to HTTP status codes in gateway/api/errors.py only.

    EngineCallError(code)          a gRPC (or HTTP worker) call failed; ``code`` is the
                                   gRPC status name ("UNAVAILABLE", "RESOURCE_EXHAUSTED", ...)
      .retryable                   True when another attempt (maybe on another engine)
                                   can succeed and nothing reached the client yet
"""

from __future__ import annotations

# Failures that say nothing about the request itself: the engine is down, busy,
# or slow. A retry elsewhere may succeed.
RETRYABLE_CODES = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "ABORTED", "UNKNOWN",
                             "INTERNAL"})
# Failures that count against an engine's circuit breaker (the client's own
# mistakes, such as INVALID_ARGUMENT, do not).
ENGINE_FAULT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN", "DATA_LOSS"})


class EngineCallError(Exception):
    __slots__ = ("code", "details", "_engine_fault")

    def __init__(self, code: str, details: str = "", engine_fault: bool | None = None) -> None:
        super().__init__(f"{code}: {details}" if details else code)
        self.code = code
        self.details = details
        # None: by the code. False for a failure of a call the engine depends on rather than of its own (an encode
        # worker's, encode_workers.py): its circuit is not charged with it.
        self._engine_fault = engine_fault

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES

    @property
    def engine_fault(self) -> bool:
        return self.code in ENGINE_FAULT_CODES if self._engine_fault is None else self._engine_fault

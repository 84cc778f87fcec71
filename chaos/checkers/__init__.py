"""Checkers: each looks at one property of a finished run and says whether it held.

Each module has ``check(run) -> CheckResult``; ``run`` is a ``chaos.run.RunData``.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class CheckResult:
    name: str
    passed: bool
    summary: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


def all_checkers():
    from . import (crash_detection, false_dead, kv_index, lost_requests, membership, models_apart, rate_limits,
                   replicated_state, stored_responses)
    return [lost_requests, models_apart, membership, false_dead, crash_detection, replicated_state, kv_index,
            rate_limits, stored_responses]

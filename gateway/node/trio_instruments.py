"""trio's instrument checks at a dict's speed, for the loop of a serving node.

trio keeps a run's instruments (``trio.abc.Instrument``) in ``Instruments``, a
``collections.UserDict`` keyed by hook name, and its loop asks whether a hook has any,
``"before_task_step" in runner.instruments``, around every task step, every reschedule and
every wait for I/O: a Python-level ``UserDict.__contains__`` call each time, ~74 ns against
~17 ns for a dict's own ``in`` on this machine. A paced stream asks ~9 times per token
(cProfile of a node streaming tokens 20 ms apart: 148 calls per 16-token request).

``use_dict_instruments`` hands the running loop a dict subclass holding the same hooks,
with ``Instruments``' own methods (they keep the hooks in ``self.data``, which is the dict
itself here), so every check is the dict's and instruments added later
(``trio.lowlevel.add_instrument``: ``SMG_NODE_SLOW_STEP_MS``'s log, tests) work as before.
These are trio's internals: ``tests/unit/test_trio_instruments.py`` fails if a release moves
them, and where they are not what this expects the swap is skipped and the loop runs as it
would have.
"""

from __future__ import annotations

from typing import Any

try:
    from trio._core._instrumentation import Instruments
    from trio._core._run import GLOBAL_RUN_CONTEXT
except ImportError:  # a trio whose internals moved: nothing to swap
    Instruments = GLOBAL_RUN_CONTEXT = None  # type: ignore[assignment,misc]


class DictInstruments(dict):
    """trio's ``Instruments`` as a dict: hook name -> {instrument: None}, plus ``"_all"``."""

    __slots__ = ()

    @property
    def data(self) -> "DictInstruments":
        return self

    if Instruments is not None:
        add_instrument = Instruments.add_instrument
        remove_instrument = Instruments.remove_instrument
        call = Instruments.call


def use_dict_instruments() -> bool:
    """Swaps the running trio loop's instruments for a ``DictInstruments`` with the same hooks. False, and
    nothing changed, when trio's internals are not the ones this knows."""
    runner: Any = getattr(GLOBAL_RUN_CONTEXT, "runner", None) if GLOBAL_RUN_CONTEXT is not None else None
    current = getattr(runner, "instruments", None)
    if Instruments is None or type(current) is not Instruments or not isinstance(getattr(current, "data", None), dict):
        return False
    runner.instruments = DictInstruments(current.data)
    return True

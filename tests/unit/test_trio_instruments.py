"""gateway/node/trio_instruments.py: the running loop's instruments swapped for a dict with trio's own methods. Reads
trio's internals, so this fails if a trio release moves them (the swap would then be skipped, not break)."""

from __future__ import annotations

import trio
import trio.testing

from gateway.node.trio_instruments import DictInstruments, use_dict_instruments


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0
        self.scheduled = 0

    def before_task_step(self, task) -> None:
        self.steps += 1

    def task_scheduled(self, task) -> None:
        self.scheduled += 1


class _Broken(trio.abc.Instrument):
    def before_task_step(self, task) -> None:
        raise RuntimeError("an instrument that fails is removed, as trio does")


def test_the_loop_checks_hooks_in_a_dict_and_instruments_still_come_and_go():
    given = _Steps()

    async def main() -> None:
        runner = trio._core._run.GLOBAL_RUN_CONTEXT.runner
        assert type(runner.instruments).__name__ == "Instruments"  # trio's UserDict: what this module replaces
        assert use_dict_instruments()
        assert type(runner.instruments) is DictInstruments and isinstance(runner.instruments, dict)
        assert "before_task_step" in runner.instruments  # the instrument given to trio.run came along
        steps = given.steps
        await trio.sleep(0)
        assert given.steps > steps  # and is still called
        added = _Steps()
        trio.lowlevel.add_instrument(added)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)
        assert added.steps > 0 and added.scheduled > 0
        trio.lowlevel.remove_instrument(added)
        trio.lowlevel.remove_instrument(given)
        assert "before_task_step" not in runner.instruments and "task_scheduled" not in runner.instruments
        trio.lowlevel.add_instrument(_Broken())
        await trio.sleep(0)  # its exception is logged and it is dropped; the loop goes on
        assert "before_task_step" not in runner.instruments
        assert not use_dict_instruments()  # once swapped, nothing more to do

    trio.run(main, instruments=[given])


def test_without_a_running_loop_nothing_is_swapped():
    assert not use_dict_instruments()

"""SMG_NODE_SLOW_STEP_MS's instrument: a step over the threshold is logged with its CPU and collections."""

import gc
import logging
import time

import trio

from gateway.observe.loop_lag import SlowStepLog


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_slow_step_is_logged_with_its_cpu_its_collections_and_where_it_stopped():
    handler = _Lines()
    logger = logging.getLogger("test.slow_step")
    logger.addHandler(handler)
    instrument = SlowStepLog(0.005, logger)

    async def busy_then_wait() -> None:
        await trio.lowlevel.checkpoint()
        gc.collect()
        deadline = time.thread_time() + 0.01
        while time.thread_time() < deadline:  # 10 ms on the CPU in one step
            pass
        await trio.sleep(0)

    async def quick() -> None:
        await trio.lowlevel.checkpoint()

    try:
        trio.run(busy_then_wait, instruments=[instrument])
        trio.run(quick, instruments=[instrument])
    finally:
        gc.callbacks.remove(instrument._on_gc)
        logger.removeHandler(handler)
    slow = [line for line in handler.lines if "busy_then_wait" in line]
    assert len(slow) == 1, handler.lines
    assert "1 garbage collections" in slow[0] and "busy_then_wait:" in slow[0]
    cpu_ms = float(slow[0].split(" ms of it on the CPU")[0].rsplit(", ", 1)[1])
    assert cpu_ms >= 10
    assert not [line for line in handler.lines if "quick" in line]

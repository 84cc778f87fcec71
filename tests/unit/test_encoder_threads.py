"""EncoderThreads: each encoder stays with one thread; results, errors and cancellation reach the caller."""

from __future__ import annotations

import threading

import pytest
import trio

from gateway.tokenizer.encoder_threads import EncoderThreads


class Encoder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.threads: set[int] = set()

    def use(self) -> str:
        self.threads.add(threading.get_ident())
        return self.name


async def test_results_and_errors_come_back():
    pool = EncoderThreads([Encoder("a")])
    assert await pool.run(lambda enc: enc.use() + "!") == "a!"
    with pytest.raises(ZeroDivisionError):
        await pool.run(lambda enc: 1 / 0)
    assert await pool.run(lambda enc: enc.use()) == "a"  # the thread survives a failed job
    pool.close()


async def test_every_encoder_is_used_by_one_thread_only_and_all_work_at_once():
    encoders = [Encoder("a"), Encoder("b")]
    pool = EncoderThreads(encoders)
    both_busy = threading.Barrier(2, timeout=10)  # passes only with two jobs running together

    def job(enc: Encoder) -> str:
        both_busy.wait()
        return enc.use()

    for _ in range(20):
        names: list[str] = []

        async def one() -> None:
            names.append(await pool.run(job))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
        assert sorted(names) == ["a", "b"]
    threads = [enc.threads for enc in encoders]
    assert all(len(t) == 1 for t in threads) and threads[0] != threads[1]
    assert threading.get_ident() not in threads[0] | threads[1]
    pool.close()


async def test_a_cancelled_caller_waits_for_its_job_then_is_cancelled():
    pool = EncoderThreads([Encoder("a")])
    release = threading.Event()
    finished = threading.Event()

    def job(enc: Encoder) -> str:
        release.wait(10)
        finished.set()
        return enc.use()

    with trio.CancelScope() as scope:
        async def cancel_then_release() -> None:
            await trio.lowlevel.checkpoint()  # the other task is waiting for its job by now
            scope.cancel()
            release.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_then_release)
            await pool.run(job)
            raise AssertionError("not cancelled")
    assert scope.cancelled_caught
    assert finished.is_set()  # the job ran to its end before the caller saw the cancellation
    pool.close()


async def test_close_stops_the_threads():
    pool = EncoderThreads([Encoder("a"), Encoder("b")], name="closing-test")
    await pool.run(lambda enc: enc.use())
    threads = [t for t in threading.enumerate() if t.name.startswith("closing-test-")]
    assert len(threads) == 2
    pool.close()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()

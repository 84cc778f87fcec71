"""EncoderThreads: each encoder is made by and stays with one thread, only when work comes; results, errors
and cancellation reach the caller."""

from __future__ import annotations

import itertools
import threading

import pytest
import trio

from gateway.tokenizer.encoder_threads import EncoderThreads


class Encoder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.made_in = threading.get_ident()
        self.threads: set[int] = set()

    def use(self) -> str:
        self.threads.add(threading.get_ident())
        return self.name


def factory(*names: str):
    """A make_encoder giving encoders named in turn, and the list of those it made."""
    made: list[Encoder] = []
    counter = itertools.count()
    lock = threading.Lock()  # the threads make theirs at once

    def make() -> Encoder:
        with lock:
            encoder = Encoder(names[next(counter)])
            made.append(encoder)
        return encoder
    return make, made


async def test_results_and_errors_come_back():
    make, _ = factory("a")
    pool = EncoderThreads(make, 1)
    assert await pool.run(lambda enc: enc.use() + "!") == "a!"
    with pytest.raises(ZeroDivisionError):
        await pool.run(lambda enc: 1 / 0)
    assert await pool.run(lambda enc: enc.use()) == "a"  # the thread survives a failed job
    pool.close()


async def test_nothing_is_made_until_the_first_job():
    make, made = factory("a", "b")
    pool = EncoderThreads(make, 2, name="lazy-test")
    assert made == [] and not [t for t in threading.enumerate() if t.name.startswith("lazy-test-")]
    await pool.run(lambda enc: enc.use())
    pool.close()


async def test_every_encoder_is_made_and_used_by_one_thread_only_and_all_work_at_once():
    make, encoders = factory("a", "b")
    pool = EncoderThreads(make, 2)
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
    assert [enc.made_in for enc in encoders] == [next(iter(t)) for t in threads]  # made where it is used
    assert threading.get_ident() not in threads[0] | threads[1]
    pool.close()


async def test_an_encoder_that_cannot_be_made_fails_each_job():
    def make() -> Encoder:
        raise MemoryError("no room for another encoder")

    pool = EncoderThreads(make, 1)
    for _ in range(2):  # the thread stays, and answers every job the same way
        with pytest.raises(MemoryError):
            await pool.run(lambda enc: enc.use())
    pool.close()


async def test_a_cancelled_caller_waits_for_its_job_then_is_cancelled():
    make, _ = factory("a")
    pool = EncoderThreads(make, 1)
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
    make, _ = factory("a", "b")
    pool = EncoderThreads(make, 2, name="closing-test")
    await pool.run(lambda enc: enc.use())
    threads = [t for t in threading.enumerate() if t.name.startswith("closing-test-")]
    assert len(threads) == 2
    pool.close()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()

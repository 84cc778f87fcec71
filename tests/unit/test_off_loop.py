"""The engine reader thread (gateway/engine/off_loop.py): callbacks only while the loop waits, in its run context."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
import trio

from gateway.engine.off_loop import OffLoopReader, supported


def _reader_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "smg-engine-reader"]


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


async def test_a_callback_wakes_a_task_of_a_loop_waiting_without_a_deadline(pair):
    assert supported()
    a, b = pair
    reader = OffLoopReader.acquire()
    arrived = trio.Event()
    seen = []

    def on_readable():
        seen.append((b.recv(100), threading.current_thread().name, trio.current_time()))
        arrived.set()  # trio's own Event, set from the reader thread: the loop's run context is there

    reader.register(b.fileno(), on_readable)
    a.send(b"token")
    started_at = trio.current_time()
    # The deadline only so that a missing wake-up fails rather than hangs: the event set but the loop left
    # asleep would see the task run at the deadline, not before.
    with trio.move_on_after(20):
        await arrived.wait()
    assert trio.current_time() - started_at < 10
    assert seen[0][:2] == (b"token", "smg-engine-reader") and seen[0][2] <= trio.current_time()
    reader.unregister(b.fileno())
    reader.release()
    assert not reader._thread.is_alive()


async def test_callbacks_run_only_while_the_loop_waits(pair):
    """A task that changes state in steps without awaiting (and lets the GIL go between them) is never
    seen half-way by a callback: the loop lock keeps the reader out until the loop waits for I/O."""
    a, b = pair
    reader = OffLoopReader.acquire()
    state = {"step": 0}
    seen: list[int] = []
    read = trio.Event()

    def on_readable():
        b.recv(100)
        seen.append(state["step"])
        read.set()

    reader.register(b.fileno(), on_readable)
    for _ in range(20):
        read = trio.Event()
        a.send(b"x")  # the reader thread wakes now and wants the lock
        for step in range(1, 201):
            state["step"] = step
            if step % 20 == 0:
                time.sleep(0.0002)  # the GIL goes to the reader thread: only the lock holds it back
        state["step"] = 0
        with trio.fail_after(30):
            await read.wait()
    assert len(seen) == 20 and set(seen) == {0}
    reader.unregister(b.fileno())
    reader.release()


async def test_a_failing_callback_is_logged_and_the_others_go_on(pair, caplog):
    a, b = pair
    c, d = socket.socketpair()
    reader = OffLoopReader.acquire()
    done = trio.Event()

    def broken():
        b.recv(100)
        raise RuntimeError("a bug in a callback")

    def working():
        d.recv(100)
        done.set()

    reader.register(b.fileno(), broken)
    reader.register(d.fileno(), working)
    with caplog.at_level(logging.ERROR, logger="gateway.engine"):
        a.send(b"x")
        with trio.fail_after(30):
            while not any("failed" in r.message for r in caplog.records):
                await trio.sleep(0.01)
        c.send(b"y")
        with trio.fail_after(30):
            await done.wait()
    assert reader._thread.is_alive()
    for fd in (b.fileno(), d.fileno()):
        reader.unregister(fd)
    reader.release()
    c.close()
    d.close()


async def test_one_reader_per_run_shared_until_its_last_user_releases_it():
    first = OffLoopReader.acquire()
    second = OffLoopReader.acquire()
    assert first is second
    manager_class = type(first._manager)
    first.release()
    assert first._thread.is_alive()
    second.release()
    assert not first._thread.is_alive() and type(first._manager) is first._manager_class is not manager_class
    third = OffLoopReader.acquire()  # a new one after the last release
    assert third is not first and third._thread.is_alive()
    third.release()


def test_a_run_that_ends_without_releasing_stops_its_reader():
    async def main():
        reader = OffLoopReader.acquire()
        a, b = socket.socketpair()
        reader.register(b.fileno(), lambda: b.recv(100))
        a.send(b"x")
        await trio.sleep(0.01)
        reader.unregister(b.fileno())
        a.close()
        b.close()
        return reader

    reader = trio.run(main)
    assert not reader._thread.is_alive() and not _reader_threads()

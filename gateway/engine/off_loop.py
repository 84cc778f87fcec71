"""Engine connections read off trio's scheduler: one thread per event loop, blocked on a plain epoll.

Why (issue 65): a message an engine sends on its own (a paced token) costs a wake-up of trio's loop for
the task that reads the connection: ~60 k instructions of scheduler and one-shot I/O registration,
where a Python thread blocked in ``select.epoll`` and calling the connection's callback needs ~5 k
(``tests/bench/wakeup_bench.py``). The callbacks are the ones the reading task ran (the HTTP/2 frames,
the listeners that write a token to its client), so moving them costs no new code on the token path.

How it stays as safe as the task it replaces: a callback runs only while the loop's thread is parked
in its wait for I/O. The loop's thread holds the *loop lock* at all times but inside
``io_manager.get_events`` (the epoll wait, where trio touches none of its state); the reader thread
takes the lock before it runs anything. So a callback runs as if trio ran it between two passes of
its scheduler: no task runs meanwhile, nothing is half-changed under it, no socket is closed (and its
number given to the next client) while it writes. Inside, trio's run context is the loop's (the
reader thread's copy of trio's thread-local names the loop's runner), so what a callback did in the
reading task works the same: ``trio.Event.set`` wakes a task, ``CancelScope.cancel`` cancels,
``trio.current_time`` reads the loop's clock; what needs an ``await`` cannot be done there, as before.
When callbacks made a task runnable, the loop is woken (it may be waiting with no deadline).

What it costs: a release and an acquire of an uncontended lock around each of the loop's waits; a
callback due while the loop's thread is busy waits for its next wait, as the reading task waited for
its turn in the run queue. The GIL is taken once per read, as the loop's thread takes it back after
each wait.

trio has no public hook for either part: the loop lock is put around the runner's ``get_events`` by
giving its I/O manager a subclass of its own class, and the run context is trio's thread-local;
``supported()`` says where both are as this module expects (trio's epoll backend), and the node reads
engines from a task where not.
"""

from __future__ import annotations

import contextvars
import logging
import os
import select
import sys
import threading
from collections.abc import Callable
from typing import Any

import trio

log = logging.getLogger("gateway.engine")


def _trio_internals() -> "tuple[Any, type] | None":
    """(trio's run context, its epoll I/O manager's class), or None where trio is not as expected."""
    try:
        from trio._core._io_epoll import EpollIOManager
        from trio._core._run_context import GLOBAL_RUN_CONTEXT
    except ImportError:
        return None
    if not all(callable(getattr(EpollIOManager, name, None)) for name in ("get_events", "force_wakeup")):
        return None
    return GLOBAL_RUN_CONTEXT, EpollIOManager


def supported() -> bool:
    """True inside a trio run whose I/O manager is trio's epoll backend (Linux)."""
    internals = _trio_internals()
    if internals is None:
        return False
    context, epoll_manager = internals
    runner = getattr(context, "runner", None)
    return runner is not None and isinstance(runner.io_manager, epoll_manager) and not runner.is_guest


class OffLoopReader:
    """The reader thread of one trio run, shared by the engine connections of that run (``acquire``)."""

    _by_runner: "dict[int, OffLoopReader]" = {}

    def __init__(self) -> None:
        context, epoll_manager = _trio_internals()
        self._runner = context.runner
        self._lock = threading.Lock()
        self._epoll = select.epoll()
        self._waker = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._waker, select.EPOLLIN)
        # fd -> (the context a reading task would have run it in, the callback); read only with the lock.
        self._handlers: dict[int, tuple[contextvars.Context, Callable[[], None]]] = {}
        self._stopping = False
        self._users = 0
        self.callbacks = 0  # callbacks run (tests and benchmarks read it)
        self._manager = manager = self._runner.io_manager
        self._manager_class = base = type(manager)
        lock = self._lock

        class LoopLockedIOManager(base):  # the same instance layout: only the class changes
            __slots__ = ()

            # KI-protected: a Ctrl-C here is delivered to trio's main task, never raised between the release
            # and the acquire (the loop's thread would run on without the lock).
            @trio.lowlevel.enable_ki_protection
            def get_events(self, timeout: float) -> Any:
                lock.release()
                try:
                    return base.get_events(self, timeout)
                finally:
                    lock.acquire()

        lock.acquire()  # the loop's thread holds it from here on, but in its waits
        manager.__class__ = LoopLockedIOManager
        # The loop's async-generator hooks (thread-local in CPython): a generator the collector finalizes
        # during a callback is handed to trio as it would be on the loop's thread.
        self._thread = threading.Thread(target=self._run, args=(context, sys.get_asyncgen_hooks()),
                                        name="smg-engine-reader", daemon=True)
        self._thread.start()
        # Stopped with the run at the latest (a client never closed): trio cancels its system tasks then.
        self._guard_scope = trio.CancelScope()
        trio.lowlevel.spawn_system_task(self._guard)

    async def _guard(self) -> None:
        with self._guard_scope:
            try:
                await trio.sleep_forever()
            finally:
                self._stop()

    @classmethod
    def acquire(cls) -> "OffLoopReader":
        """The current trio run's reader, started on first use; ``release`` once per ``acquire``."""
        runner = _trio_internals()[0].runner
        reader = cls._by_runner.get(id(runner))
        if reader is None or reader._stopping or reader._runner is not runner:
            reader = cls._by_runner[id(runner)] = cls()
        reader._users += 1
        return reader

    def release(self) -> None:
        self._users -= 1
        if self._users <= 0:
            self._stop()

    def register(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever ``fd`` is readable, in this task's context (as a task started here
        would run it), until ``unregister``. From the loop's thread."""
        self._handlers[fd] = (contextvars.copy_context(), callback)
        self._epoll.register(fd, select.EPOLLIN)

    def unregister(self, fd: int) -> None:
        """Before the socket is closed: its number may be given to another socket once it is."""
        if self._handlers.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):  # the socket closed already (dropped from the set), or the reader
                pass

    def _run(self, run_context: Any, asyncgen_hooks: Any) -> None:
        run_context.runner = self._runner  # this thread's copy of trio's thread-local: the loop's runner
        sys.set_asyncgen_hooks(*asyncgen_hooks)
        poll, lock, handlers, runq = self._epoll.poll, self._lock, self._handlers, self._runner.runq
        waker = self._waker
        # The I/O manager's own wake-up (a byte on a socket pair its wait drains, no task stepped), as trio's
        # guest mode uses it; run_sync_soon would step a task more (+2.5 % instructions on a short chat).
        wake_loop = self._manager.force_wakeup
        while True:
            try:
                events = poll()
            except OSError:  # the epoll closed by _stop
                return
            with lock:
                if self._stopping:
                    return
                runnable = len(runq)
                for fd, _ in events:
                    handler = handlers.get(fd)
                    if handler is None:
                        if fd == waker:
                            os.eventfd_read(waker)
                        continue  # unregistered since the poll returned
                    self.callbacks += 1
                    try:
                        handler[0].run(handler[1])
                    except Exception:  # a callback's own failure: the others and the thread go on
                        log.exception("an engine connection's reader failed")
                # A task made runnable while the loop waits (perhaps with no deadline) must not wait for it.
                if runq and not runnable:
                    wake_loop()

    def _stop(self) -> None:
        """End the thread and give the loop its own I/O manager back (from the loop's thread)."""
        if self._stopping:
            return
        self._stopping = True
        self._guard_scope.cancel()
        if OffLoopReader._by_runner.get(id(self._runner)) is self:
            del OffLoopReader._by_runner[id(self._runner)]
        os.eventfd_write(self._waker, 1)
        self._lock.release()  # the thread may be waiting for it: it sees _stopping and ends
        try:
            self._thread.join(5.0)
        finally:
            self._lock.acquire()
        self._manager.__class__ = self._manager_class
        self._lock.release()
        self._epoll.close()
        os.close(self._waker)

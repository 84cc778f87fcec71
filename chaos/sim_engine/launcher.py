"""Start simulated engines as child processes from trio code (demo mode, tests, benchmarks)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator

import trio

READY_TIMEOUT_S = 60.0


class SimEngineProcess:
    def __init__(self, process: trio.Process, port: int) -> None:
        self.process = process
        self.port = port

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()


async def start_sim_engine(nursery: trio.Nursery, args: "list[str] | tuple[str, ...]" = ()) -> SimEngineProcess:
    """Start one engine on a free port; returns once it listens (it prints READY <port>)."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "chaos.sim_engine", "--host", "127.0.0.1", "--port", "0", *args],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    buffer = b""
    with trio.fail_after(READY_TIMEOUT_S):
        while b"\n" not in buffer:
            chunk = await process.stdout.receive_some(4096)
            if not chunk:
                raise RuntimeError(f"simulated engine exited before it was ready (code {await process.wait()})")
            buffer += chunk
    line = buffer.split(b"\n", 1)[0].decode()
    if not line.startswith("READY "):
        process.kill()
        raise RuntimeError(f"simulated engine said {line!r} instead of READY <port>")
    nursery.start_soon(_drain, process)
    return SimEngineProcess(process, int(line.split()[1]))


async def _drain(process: trio.Process) -> None:
    # Keep reading stdout so the child never blocks on a full pipe.
    with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
        while await process.stdout.receive_some(4096):
            pass


@contextlib.asynccontextmanager
async def open_sim_engines(count: int, args: "list[str] | tuple[str, ...]" = ()) -> AsyncIterator[list[SimEngineProcess]]:
    """``count`` engines for the duration of the block; all stopped at the end."""
    async with trio.open_nursery() as nursery:
        engines: list[SimEngineProcess] = []
        try:
            for _ in range(count):
                engines.append(await start_sim_engine(nursery, args))
            yield engines
        finally:
            for engine in engines:
                engine.process.terminate()
            with trio.move_on_after(5) as scope:
                scope.shield = True
                for engine in engines:
                    await engine.process.wait()
            for engine in engines:
                engine.kill()
            nursery.cancel_scope.cancel()

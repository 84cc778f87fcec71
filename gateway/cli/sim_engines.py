"""Demo mode (``smg-node serve --sim-engines N``): simulated engines started before the node.

The CLI starts them and passes their URLs on as ``--worker-urls``; neither the
server nor the supervisor knows about them. They are a separate program, the
chaos harness's simulated engine (``python -m chaos.sim_engine``), run as a
child process: the gateway never imports it.

They end with the node however it ends. On SIGTERM or SIGINT the node returns
and ``SimEngines`` stops them; on a crash or SIGKILL it cannot, so each engine
is started with ``--stop-with-parent``: it holds a pipe from us on its stdin and
exits when that pipe reaches end-of-file, which the kernel guarantees once we
are gone.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0
# Demo engines end answers with EOS after 64 tokens (like a model that finishes its sentence), and answer the docs'
# examples (a weather tool call and its result: --demo-answers) unless --sim-engine-args says otherwise: later flags
# win.
DEMO_ARGS = ("--eos-after-tokens", "64", "--demo-answers")


class SimEngineError(Exception):
    """A simulated engine did not start."""


class SimEngines:
    """``with SimEngines(2, args) as urls:`` engines for the duration of the block, stopped at its end."""

    def __init__(self, count: int, args: "tuple[str, ...] | list[str]" = (), host: str = "127.0.0.1") -> None:
        self._argv = [sys.executable, "-m", "chaos.sim_engine", "--host", host, "--port", "0", "--stop-with-parent",
                      *DEMO_ARGS, *args]
        self._count = count
        self._host = host
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> list[str]:
        try:
            return [self._start() for _ in range(self._count)]
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _start(self) -> str:
        # A session of its own: a Ctrl-C in the node's terminal drains the node, whose engines must keep answering
        # until it is done (they stop when the node does: __exit__, or stdin's end if the node dies).
        process = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        self.processes.append(process)
        line = _first_line(process, READY_TIMEOUT_S)
        if not line.startswith("READY "):
            raise SimEngineError(f"simulated engine said {line!r} instead of READY <port>")
        # Keep reading its stdout so that it never blocks on a full pipe.
        threading.Thread(target=_drain, args=(process,), daemon=True).start()
        return f"grpc://{self._host}:{int(line.split()[1])}"

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdin is not None:
                process.stdin.close()
        self.processes = []


def _first_line(process: subprocess.Popen, timeout_s: float) -> str:
    """The child's first line of output, or SimEngineError if it exits or says nothing in time."""
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SimEngineError(f"simulated engine not ready within {timeout_s:.0f} s")
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise SimEngineError(f"simulated engine exited before it was ready (code {process.wait()})")
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace")


def _drain(process: subprocess.Popen) -> None:
    try:
        while os.read(process.stdout.fileno(), 65536):
            pass
    except OSError:
        pass  # closed: the engine is gone

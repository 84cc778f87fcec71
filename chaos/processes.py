"""Real ``smg-node`` and simulated-engine processes on 127.0.0.1, for tests and the harness.

Each process is started on port 0 and reports where it listens (each prints
``READY <port or url>`` on stdout), so nothing
races for ports and nothing polls. Output goes to a log file per process,
kept for post-mortems.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mesh.admin_token import FILE_ENV, TOKEN_ENV, read_token

START_TIMEOUT_S = 60.0
_NODE_READY = re.compile(r"^READY (https?://\S+)")


class ManagedProcess:
    def __init__(self, name: str, argv: "list[str]", log_dir: Path, ready_pattern: "re.Pattern[str]",
                 env: "dict[str, str] | None" = None, cwd: "Path | None" = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab", buffering=0)
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log,
                                        env={**os.environ, **(env or {})}, cwd=cwd)
        stream = self.process.stdout
        self.ready_match = self._wait_ready(stream, ready_pattern)
        threading.Thread(target=self._copy, args=(stream,), daemon=True).start()

    def _wait_ready(self, stream, pattern: "re.Pattern[str]") -> "re.Match[str]":
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = stream.readline()
            if not line:
                break
            self._log.write(line)
            match = pattern.search(line.decode("utf-8", "replace"))
            if match:
                return match
        self.kill()
        said = self.log_text()[-3000:]  # stdout and stderr: why it did not start is usually on stderr
        raise RuntimeError(f"{self.name} did not start (exit {self.process.returncode}); its log ends:\n{said}")

    def _copy(self, stream) -> None:
        for line in iter(stream.readline, b""):
            self._log.write(line)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive:
            self.process.send_signal(signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout_s: float = 10.0) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def children(self) -> list[int]:
        """The pids whose parent is this process (a supervisor's worker processes: in sessions of their own, so
        no signal to this one reaches them)."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[1]) == self.process.pid:
                found.append(int(stat.parent.name))
        return found

    def signal_machine(self, signum: int) -> None:
        """The signal to this process and its children at once, as to a machine (SIGSTOP, SIGCONT)."""
        for pid in self.children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        self.signal(signum)

    def kill_machine(self) -> None:
        """SIGKILL this process and its children at once: a machine that loses power, whose processes leave
        nothing behind (no mesh leave, no handover)."""
        self.signal_machine(signal.SIGKILL)
        self.process.wait(10)

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


class EngineProcess(ManagedProcess):
    def __init__(self, args: "list[str]", log_dir: Path, name: str = "engine") -> None:
        super().__init__(name, [sys.executable, "-m", "chaos.sim_engine", "--host", "127.0.0.1", "--port", "0", *args],
                         log_dir, re.compile(r"^READY (\d+)(?: bootstrap=(\d+))?"))
        self.port = int(self.ready_match.group(1))
        # A prefill engine's (--role prefill) bootstrap port, where decode engines fetch the KV it computed.
        self.bootstrap_port = int(self.ready_match.group(2)) if self.ready_match.group(2) else None
        self.url = f"grpc://127.0.0.1:{self.port}"
        self.target = f"127.0.0.1:{self.port}"


class NodeProcess(ManagedProcess):
    def __init__(self, args: "list[str]", log_dir: Path, name: str = "node",
                 env: "dict[str, str] | None" = None, cwd: "Path | None" = None, python: str = sys.executable,
                 data_dir: "Path | None" = None, keep_data: bool = True) -> None:
        # One gateway process per node unless the caller asks for more: tests and the chaos harness run
        # many nodes on two cores.
        workers = [] if "--workers" in args else ["--workers", "1"]
        # Each node keeps its state in a directory of its own beside its log, never the user's state directory: a
        # new one unless the caller passes the one a node had before (a restart, as of a machine, finds it).
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix=f"data-{name}-", dir=log_dir))
        if "--data-dir" not in args and keep_data:  # (keep_data=False: a version before --data-dir)
            workers += ["--data-dir", str(self.data_dir)]
        # Nodes started together share one admin token file (theirs, not the user's): the control plane
        # is never open, and whoever started them finds the token there.
        env = dict(env or {})
        token_file = env.get(FILE_ENV) or os.environ.get(FILE_ENV) or str(log_dir / "admin-token")
        env[FILE_ENV] = token_file
        super().__init__(name, [python, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                                *workers, *args], log_dir, _NODE_READY, env, cwd)
        self.url = self.ready_match.group(1)
        # The token the node took, by the node's own precedence: --admin-token, SMG_NODE_ADMIN_TOKEN (as docs/security.md
        # has a cluster's nodes take it), else the token file. Reading the file while the environment set the
        # token gave the harness a token the nodes refused (401, then a KeyError).
        self.admin_token = args[args.index("--admin-token") + 1] if "--admin-token" in args else \
            env.get(TOKEN_ENV) or os.environ.get(TOKEN_ENV) or read_token(Path(token_file))
        # For calls to the control plane (/workers, /admin/...) and the CLI (SMG_NODE_ADMIN_TOKEN).
        self.admin_headers = {"authorization": f"Bearer {self.admin_token}"}
        self.admin_env = {TOKEN_ENV: self.admin_token or ""}


def default_log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="smg-node-"))

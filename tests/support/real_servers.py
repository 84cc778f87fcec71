"""Real PostgreSQL and Redis servers (Debian's packages) started by the tests on loopback, in a temporary
directory, and stopped after. ``.ci/run`` installs the packages; where they cannot be found the test
is skipped with the reason (``pytest.skip``), never faked.

PostgreSQL refuses to run as root: as root, initdb and the server run as the ``postgres`` user the
package creates (``runuser``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import until_listening


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, timeout_s: float, what: str) -> None:
    until_listening(port, process, timeout_s, what)


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


@contextlib.contextmanager
def postgres_server(directory: Path) -> Iterator[str]:
    """A fresh PostgreSQL on a free loopback port; yields its URL (database ``postgres``, user ``postgres``)."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (.ci/run installs it: apt-get install postgresql)")
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: PostgreSQL cannot be started")
        as_user = ["runuser", "-u", "postgres", "--"]
    # pytest's temporary directories are private to root: the server's own lives where its user can reach.
    data = Path(tempfile.mkdtemp(prefix="smg-test-pgdata-"))
    if as_user:
        shutil.chown(data, "postgres")
    done = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                           "-E", "UTF8", "--no-sync"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed: {done.stderr}")
    port = free_port()
    log = open(directory / "postgres.log", "wb")
    process = subprocess.Popen([*as_user, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port),
                                "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={data}",
                                "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, process, 30, "postgres")
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        _stop(process)
        log.close()
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A fresh redis-server on a free loopback port, without persistence; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (.ci/run installs it: apt-get install redis-server)")
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    log = open(directory / "redis.log", "wb")
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(directory)], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, process, 15, "redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(process)
        log.close()

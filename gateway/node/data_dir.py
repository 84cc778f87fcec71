"""The node's data directory: where it keeps what it holds of the cluster's state across restarts (issue 62).

What is in it, each written as it is accepted and read back before the node serves:

    cluster-doc.log.G / .snap.G    the cluster's document: run-time API keys, settings, workers (gateway/cluster/
                                   doc_journal.py)
    history.log.G / .snap.G        the memory backend's stored responses and conversations (gateway/history/
                                   journal.py)
    spend.log.G / .snap.G          the spend ledger: every node's rows (gateway/spend/exchange.py; written each round,
                                   once a second: a SIGKILL may lose this node's last second no peer had yet)
    keyring                        the gossip keys, primary first (mesh/keyring_file.py)
    lock                           held (flock) while a process uses the directory: two nodes never share one

Where: ``--data-dir DIR``; by default ``$SMG_NODE_DATA_ROOT/NAME``, else ``$XDG_STATE_HOME/smg-node/nodes/NAME``
(``~/.local/state/smg-node/nodes/NAME``), NAME being the mesh member's name (a lone node: ``port-PORT``), so that
nodes on one machine each have their own (a lone node on ``--port 0`` has no default: it keeps nothing unless given
``--data-dir``). The processes of ``--workers N`` are members of their own: the first
uses the directory, process ``i`` its ``process-i`` under it. ``--data-dir none`` keeps nothing (a node that
forgets everything on restart, as before there was a data directory).

The directory is 0700 and its files 0600: they hold the keys' digests and the gossip keys, as secret as the
admin token.

Durability (``--data-fsync``): by default every record is handed to the kernel (one ``write``) before the change
is acknowledged, so a crashed or SIGKILLed process loses nothing acknowledged; a power cut or a kernel crash may
lose the last seconds of changes (what the kernel had not yet flushed). With ``--data-fsync`` each record is also
fsynced before the answer: nothing acknowledged is lost to a power cut either, at the cost of a disk flush per
change (a key, a worker, a stored response; not per token).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from mesh import default_node_name, user_state_dir

ROOT_ENV = "SMG_NODE_DATA_ROOT"
NONE = "none"
LOCK_FILE = "lock"


class DataDirError(Exception):
    """The data directory cannot be used (the message says why, in one line)."""


def default_root() -> Path:
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV])
    return user_state_dir() / "nodes"


def data_dir_of(config: Any) -> Path | None:
    """Where this process keeps its state (the module's docstring); None for ``--data-dir none``."""
    if config.data_dir == NONE:
        return None
    if config.data_dir:
        base = Path(config.data_dir).expanduser()
        return base / f"process-{config.worker_index}" if config.worker_index else base
    mesh = config.mesh
    if mesh.enabled:
        name = mesh.node_name or default_node_name(mesh.advertise or mesh.bind)
    elif config.port == 0:
        return None  # a port the kernel picks: no name that a restart would find again (pass --data-dir)
    else:
        name = f"port-{config.port}" + (f"-process-{config.worker_index}" if config.worker_index else "")
    return default_root() / name


class DataDir:
    """The directory, made 0700 if missing and locked for this process (DataDirError when another holds it)."""

    def __init__(self, path: Path, fsync_each: bool = False) -> None:
        self.path = path
        self.fsync_each = fsync_each
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(path, 0o700)
            self._lock = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise DataDirError(f"--data-dir {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise DataDirError(f"--data-dir {path} is in use by another smg-node process: each node needs its own "
                               "(--data-dir, or --node-name for the default one)") from None
        os.ftruncate(self._lock, 0)
        os.write(self._lock, f"{os.getpid()}\n".encode())

    def close(self) -> None:
        os.close(self._lock)  # the lock goes with it

"""The node's admin token when none is configured: made once, kept in a file only its user can read.

As Jupyter and Docker do, a node started without an admin credential
(``--admin-token``, ``--control-plane-api-keys``) is not left open: it takes
the token from ``--admin-token-file`` (default below), creating the file with
a new random token (32 bytes, URL-safe) if it does not exist. Every node and
process of the same user on the machine therefore shares one token, and the
``smg-node`` CLI reads the same file, so the quick start stays one command and
the commands need no flag.

The file is created with O_EXCL and mode 0600 in a directory of mode 0700; a
file others can read or write is refused rather than trusted (someone else may
have planted or read it).

Beside it, made just before it, the cluster's salt for a gossip key derived from
the token (``<file>.mesh-salt``, 32 random bytes): nodes sharing the token file
share the salt, and the key differs from every other cluster's even for the same
token. A token file older than its salt keeps the fixed salt (``cluster_salt``
says None), so an existing cluster's key does not change under it.
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
import time
from pathlib import Path

FILE_ENV = "SMG_NODE_ADMIN_TOKEN_FILE"
TOKEN_ENV = "SMG_NODE_ADMIN_TOKEN"
TOKEN_BYTES = 32
SALT_SUFFIX = ".mesh-salt"
SALT_BYTES = 32
# A process that lost the O_EXCL race reads what the winner writes: it waits at most this long.
WRITE_RACE_WAIT_S = 2.0


class AdminTokenError(Exception):
    """The token file cannot be used (unsafe permissions, unreadable, empty)."""


def user_state_dir() -> Path:
    """smg-node's folder in the user's state directory (``$XDG_STATE_HOME``, else ``~/.local/state``)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "smg-node"


def default_token_path() -> Path:
    if os.environ.get(FILE_ENV):
        return Path(os.environ[FILE_ENV])
    return user_state_dir() / "admin-token"


def read_token(path: Path) -> str | None:
    """The token in ``path``; None when there is no file. Raises AdminTokenError when it is unsafe."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise AdminTokenError(f"cannot read the admin token file {path}: {e}") from None
    try:
        info = os.fstat(fd)
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AdminTokenError(f"the admin token file {path} is open to other users "
                                  f"(mode {stat.S_IMODE(info.st_mode):o}); chmod 600 it or remove it")
        if info.st_uid != os.getuid():
            raise AdminTokenError(f"the admin token file {path} belongs to another user")
        token = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return token or None


def salt_path(token_path: Path) -> Path:
    return token_path.with_name(token_path.name + SALT_SUFFIX)


def cluster_salt(token_path: Path) -> bytes | None:
    """The salt beside the token file (see the module's docstring); None when there is none. AdminTokenError when
    it is unsafe (others may read or write it) or not one."""
    salt = read_token(salt_path(token_path))
    if salt is None:
        return None
    try:
        raw = bytes.fromhex(salt)
    except ValueError:
        raw = b""
    if len(raw) != SALT_BYTES:
        raise AdminTokenError(f"{salt_path(token_path)} is not a salt ({SALT_BYTES} bytes in hex)")
    return raw


def _create_salt(token_path: Path) -> None:
    """The salt file, made once (O_EXCL): before the token file, so that a node that reads a new token finds it."""
    try:
        fd = os.open(salt_path(token_path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    try:
        os.write(fd, secrets.token_bytes(SALT_BYTES).hex().encode() + b"\n")
    finally:
        os.close(fd)


def load_or_create_token(path: Path) -> tuple[str, bool]:
    """(token, created): the file's token, or a new one written to a new file (its salt first)."""
    token = read_token(path)
    if token is not None:
        return token, False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _create_salt(path)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another process of the node won the race: use its token
        deadline = time.monotonic() + WRITE_RACE_WAIT_S
        while time.monotonic() < deadline:
            token = read_token(path)
            if token is not None:
                return token, False
            time.sleep(0.01)
        raise AdminTokenError(f"the admin token file {path} stayed empty") from None
    try:
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)
    return token, True


def client_token(explicit: str | None = None) -> str | None:
    """What the CLI sends: a token given on its command line or in the environment, else the file's."""
    for candidate in (explicit, os.environ.get("SMG_NODE_RPC_TOKEN"), os.environ.get(TOKEN_ENV)):
        if candidate:
            return candidate
    try:
        return read_token(default_token_path())
    except AdminTokenError:
        return None


# Where each local node's admin endpoint listens, written by the node beside the token file so that
# `smg-node members|join|leave` find it with no flags (a node of --workers N without --mesh-bind runs its
# private mesh's endpoint on a port the kernel picks). One file per node, named by the node's HTTP port: two
# nodes of one user never overwrite each other's, and the CLI picks the only live one or asks which.
ENDPOINT_FILE_PREFIX = "admin-endpoint."


def endpoint_dir() -> Path:
    return default_token_path().parent


def endpoint_path(node: int | str) -> Path:
    return endpoint_dir() / f"{ENDPOINT_FILE_PREFIX}{node}"


def record_endpoint(addr: str, node: int | str) -> None:
    """Write ``addr`` (host:port) for the CLI, as the endpoint of the node serving HTTP on port ``node``; best
    effort (a node without a state directory still runs)."""
    path = endpoint_path(node)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, addr.encode() + b"\n")
        finally:
            os.close(fd)
        os.replace(temporary, path)  # whole or not at all, for a CLI reading it meanwhile
    except OSError:
        pass


def forget_endpoint(node: int | str, addr: str) -> None:
    """Remove the node's record when it stops (if it is still this node's: a successor may have written it)."""
    path = endpoint_path(node)
    try:
        if path.read_text().strip() == addr:
            path.unlink()
    except OSError:
        pass


def recorded_endpoints() -> dict[str, str]:
    """Every local node's recorded admin endpoint, by the node's HTTP port; stale ones included (see live_endpoints)."""
    found = {}
    try:
        entries = list(endpoint_dir().iterdir())
    except OSError:
        return {}
    for path in entries:
        if path.name.startswith(ENDPOINT_FILE_PREFIX):
            try:
                addr = path.read_text().strip()
            except OSError:
                continue
            if addr:
                found[path.name.removeprefix(ENDPOINT_FILE_PREFIX)] = addr
    return found


def live_endpoints(timeout_s: float = 0.2) -> dict[str, str]:
    """The recorded endpoints that accept a connection now (a node killed without a goodbye leaves its record)."""
    alive = {}
    for node, addr in recorded_endpoints().items():
        host, _, port = addr.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                alive[node] = addr
        except (OSError, ValueError):
            continue
    return alive

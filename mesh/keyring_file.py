"""The gossip keyring kept in the node's data directory, so that a node restarted after a rotation rejoins.

A rotation (``smg-node keyring rotate NEW``) leaves every member with the new key alone; a node restarted with
the flags it was started with (``--encrypt OLD``, or the key derived from the admin token) would seal with a key
nobody holds any more and never rejoin. So the node writes its keyring here at every change, before the change
is acknowledged, and at start the keyring on disk wins over the configured key, as Consul's and Serf's keyring
files do. The start-up log says so when the configured key is not in it (it was rotated out).

The file, ``keyring`` (JSON, mode 0600, replaced whole: temporary file, fsync, rename, directory fsync)::

    {"version": 1, "keys": ["<base64 key>", ...]}      primary first

A file this code cannot read (another version, not JSON, a key that is not one) is moved aside to
``keyring.unreadable`` and the configured key used: the node says so in one line and keeps the file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

from .crypto import KEYS_MAX, Keyring, KeyringError, decode_key, key_fingerprint

log = logging.getLogger("mesh")

FILE_NAME = "keyring"
# Version history (append-only): 1, 2026-11-29, the first.
VERSION = 1
FILE_BYTES_MAX = 64 * 1024


class KeyringFileError(Exception):
    """The file is there and cannot be used (the message says why)."""


def read_keys(directory: Path) -> "list[str] | None":
    """The keys kept, primary first; None when there is no file; KeyringFileError otherwise."""
    path = Path(directory) / FILE_NAME
    try:
        with open(path, "rb") as f:
            data = f.read(FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise KeyringFileError(f"{path}: {e.strerror or e}") from None
    try:
        document = orjson.loads(data) if len(data) <= FILE_BYTES_MAX else None
    except orjson.JSONDecodeError:
        document = None
    if not isinstance(document, dict):
        raise KeyringFileError(f"{path}: not a keyring file")
    if document.get("version") != VERSION:
        raise KeyringFileError(f"{path}: keyring format {document.get('version')!r}, and this node reads "
                               f"{VERSION}")
    keys = document.get("keys")
    if not isinstance(keys, list) or not 0 < len(keys) <= KEYS_MAX or not all(isinstance(k, str) for k in keys):
        raise KeyringFileError(f"{path}: 'keys' is not a list of 1 to {KEYS_MAX} keys")
    try:
        for key in keys:
            decode_key(key)
    except KeyringError as e:
        raise KeyringFileError(f"{path}: {e}") from None
    return keys


def write_keys(directory: Path, keyring: Keyring) -> None:
    """Replace the file with ``keyring``'s keys, durably; OSError when the disk refuses."""
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / FILE_NAME
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, orjson.dumps({"version": VERSION, "keys": keyring.texts()}))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def keyring_kept_in(directory: Path, configured: "list[str]") -> Keyring:
    """The node's keyring: the one kept in ``directory`` when there is one, else the configured keys; from now on
    kept there at every change. An insecure mesh (no key at all) keeps nothing."""
    keys = configured
    try:
        kept = read_keys(directory)
    except KeyringFileError as e:
        aside = Path(directory) / (FILE_NAME + ".unreadable")
        os.replace(Path(directory) / FILE_NAME, aside)
        log.warning("the keyring kept in the data directory cannot be read (%s): moved to %s; using the configured "
                    "key", e, aside)
        kept = None
    if kept is not None and configured:
        keys = kept
        if configured[0] not in kept:
            log.warning("gossip keyring from %s (primary %s): the configured key %s is not in it (a rotation "
                        "replaced it) and is not used; remove that file to start from the configured key",
                        Path(directory) / FILE_NAME, key_fingerprint(decode_key(kept[0])),
                        key_fingerprint(decode_key(configured[0])))
    keyring = Keyring(list(keys))
    if keyring.enabled:
        write_keys(directory, keyring)
        keyring.listeners.append(lambda changed: write_keys(directory, changed))
    return keyring

"""Gossip encryption: AES-256-GCM under a keyring. No I/O.

One primary key encrypts what we send; every installed key is tried to
decrypt what we receive, so keys rotate without downtime:
install the new key everywhere, make it primary everywhere, remove the old.

Sealed packet: ``SEAL_VERSION (1 byte) | nonce (12 bytes) | ciphertext+tag``.
The version byte and a label are bound in as associated data, so a packet
cannot be replayed into another protocol that shares the key. A packet that
fails to open with every key is dropped (and counted) by the caller; a node
without a key we hold therefore cannot join.
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12
TAG_BYTES = 16
SEAL_VERSION = 1
SEAL_OVERHEAD_BYTES = 1 + NONCE_BYTES + TAG_BYTES
KEYS_MAX = 16


class KeyringError(Exception):
    """A key is malformed, or the keyring change is not allowed."""


def generate_key() -> str:
    """A new key, base64 encoded as ``smg-node keygen`` prints it."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def decode_key(text: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (ValueError, TypeError):
        raise KeyringError("a key must be base64") from None
    if len(key) != KEY_BYTES:
        raise KeyringError(f"a key must be {KEY_BYTES} bytes (AES-256), got {len(key)}")
    return key


class Keyring:
    def __init__(self, keys: "list[str]", primary: str | None = None) -> None:
        self._keys: list[bytes] = []
        for text in keys:
            self.install(text)
        if primary is not None:
            self.use(primary)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def install(self, text: str) -> None:
        key = decode_key(text)
        if key in self._keys:
            return
        if len(self._keys) >= KEYS_MAX:
            raise KeyringError(f"at most {KEYS_MAX} keys")
        self._keys.append(key)  # the first key installed is primary until `use`

    def use(self, text: str) -> None:
        key = decode_key(text)
        if key not in self._keys:
            raise KeyringError("install a key before making it primary")
        self._keys.remove(key)
        self._keys.insert(0, key)

    def remove(self, text: str) -> None:
        key = decode_key(text)
        if self._keys and key == self._keys[0]:
            raise KeyringError("cannot remove the primary key; make another one primary first")
        if key in self._keys:
            self._keys.remove(key)

    def list(self) -> list[str]:
        return [base64.b64encode(k).decode() for k in self._keys]

    def primary(self) -> str | None:
        return base64.b64encode(self._keys[0]).decode() if self._keys else None

    def seal(self, plaintext: bytes, label: bytes) -> bytes:
        if not self._keys:
            return plaintext
        nonce = os.urandom(NONCE_BYTES)
        header = bytes([SEAL_VERSION])
        return header + nonce + AESGCM(self._keys[0]).encrypt(nonce, plaintext, header + label)

    def open(self, sealed: bytes, label: bytes) -> bytes | None:
        """The plaintext, or None if no installed key opens it (or it is malformed)."""
        if not self._keys:
            return sealed
        if len(sealed) < SEAL_OVERHEAD_BYTES or sealed[0] != SEAL_VERSION:
            return None
        header, nonce, body = sealed[:1], sealed[1:1 + NONCE_BYTES], sealed[1 + NONCE_BYTES:]
        for key in self._keys:
            try:
                return AESGCM(key).decrypt(nonce, body, header + label)
            except InvalidTag:
                continue
        return None

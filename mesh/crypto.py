"""Gossip encryption: AES-256-GCM under a keyring, with replay protection. No I/O, no clock.

One primary key encrypts what we send; every installed key is tried to
decrypt what we receive, so keys rotate without downtime:
install the new key everywhere, make it primary everywhere, remove the old.

``Keyring`` seals bytes; ``Sealer`` (what the agent uses) makes every frame
say who sent it and when, so that a recorded packet or stream frame cannot be
played again:

    sealed    = SEAL_VERSION (1) | nonce (12) | AES-GCM(plaintext) incl. tag (16)
    nonce     = sender (8 random bytes per process) | counter (4)
    plaintext = time_s (4, seconds since the epoch) | payload
    AAD       = SEAL_VERSION | label

The sender and counter are the nonce: they never repeat under one key (a
sender id is drawn again before its counter could wrap), which is all AES-GCM
asks of a nonce, and GCM authenticates the nonce, so a changed sender or
counter fails the tag like a changed payload. Carrying them as the nonce,
rather than a random nonce plus a header, keeps each packet 20 bytes smaller
(gossip is ~2 small packets a second per node).

A frame is accepted once (``ReplayGuard``): its time must be within
``replay_window_s`` of ours (so old captures are refused outright) and its
counter new for its sender and label (a sliding bitmap of the last
``REPLAY_COUNTERS_WINDOW`` counters, as IPsec's and WireGuard's receive
windows: packets may arrive out of order, never twice). A sender's state is
kept as long as any of its frames could still pass the time check, so
forgetting it never reopens the door. A restarted process draws a new sender
id, so its counter may start again at 0.

What encryption makes impossible, and why (the attacker sees and can send any
packet, but holds no key):
  * forging any message (membership, worker document, rate-limit counts,
    KV batches, settings): AES-GCM's tag fails without the key;
  * replaying a captured packet or frame, to the same or another node: its
    (sender, label, counter) was seen, or its time is outside the window;
  * moving a message between protocols (gossip into a stream, a request into
    an answer position of another protocol): the label is authenticated;
  * making a node read a large frame: stream connections must open with a
    sealed hello before any frame over ``mesh.transport.HELLO_BYTES_MAX``.
What it does not stop: dropping, delaying (up to the window) or reordering
packets, which SWIM tolerates by design; a holder of the key (a member) can
say anything a member can. Clocks of members must agree within the window
(NTP does far better than the default of 120 s).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12
TAG_BYTES = 16
# Version history: 1 had no sender, counter or time (replayable); 2 added them (24 bytes) after a
# random nonce; 3 makes sender and counter the nonce and the time 4 bytes. Nodes on different versions
# cannot read each other: upgrade a cluster with a new key (a rolling restart with --encrypt).
SEAL_VERSION = 3
# Version bytes below this are read as another smg-node's seal (named as such in the log); above, as garbage.
SEAL_VERSIONS_PLAUSIBLE_MAX = 15
SENDER_BYTES = 8
COUNTER_MAX = 2 ** 32 - 1  # the nonce's last 4 bytes; a sender id is drawn again before they wrap
TIME_BYTES = 4  # whole seconds: the replay window is minutes wide
AEAD_OVERHEAD_BYTES = 1 + NONCE_BYTES + TAG_BYTES
SEAL_OVERHEAD_BYTES = AEAD_OVERHEAD_BYTES + TIME_BYTES  # what Sealer adds to a payload
KEYS_MAX = 16
# Frames whose time is further than this from ours are refused: the longest a capture can be
# replayed if the counter check did not exist, and the clock skew members may have.
REPLAY_WINDOW_S = 120.0
# Counters remembered per sender below its highest one: reordering deeper than this (packets
# overtaken by 4,096 newer ones of the same sender and label) drops the late packet.
REPLAY_COUNTERS_WINDOW = 4096
# Senders remembered at most. Only key holders can create entries, and an entry lives
# 2 x REPLAY_WINDOW_S, so this bounds memory (~200 bytes each) against a buggy peer, not an attacker.
REPLAY_SENDERS_MAX = 65_536
_COUNTER = struct.Struct(">I")
_TIME = struct.Struct(">I")


class KeyringError(Exception):
    """A key is malformed, or the keyring change is not allowed."""


def generate_key() -> str:
    """A new key, base64 encoded as ``smg-node keygen`` prints it."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


# HKDF's salt and info for a gossip key derived from the admin token. The salt is random per cluster where the
# nodes share a place to keep it (the admin token file's folder: mesh/admin_token.py); else this fixed label, so
# that every node holding the same token derives the same key. Either way the key says nothing about the token.
_DERIVED_KEY_SALT = b"smg-node gossip key"
_DERIVED_KEY_INFO = b"v1"
# A secret a gossip key is derived from must resist guessing: whoever guesses it holds the cluster (any packet
# sealed with the key is a member's). 128 bits is out of reach offline, where a captured packet lets every guess
# be checked with one HKDF and one AES-GCM open; the node's own tokens carry 256 (secrets.token_urlsafe(32)).
DERIVED_KEY_SECRET_BITS_MIN = 128
_CHARACTER_CLASSES = ((str.islower, 26), (str.isupper, 26), (str.isdigit, 10))
_OTHER_PRINTABLE = 33


class WeakSecret(ValueError):
    """A secret too guessable to derive a gossip key from."""


def secret_strength_bits(secret: str) -> float:
    """An upper estimate of a secret's entropy, in bits: its length times the bits of a character, where a
    character carries no more than the alphabet of the classes it uses allows (lower case 26, upper case 26,
    digits 10, the rest 33) nor more than its distinct characters allow (``aaaa...`` carries nothing). It catches
    short and repetitive secrets, not phrases of dictionary words: generated tokens are what it is for."""
    if not secret:
        return 0.0
    alphabet = sum(size for test, size in _CHARACTER_CLASSES if any(test(c) for c in secret))
    if any(not (c.islower() or c.isupper() or c.isdigit()) for c in secret):
        alphabet += _OTHER_PRINTABLE
    distinct = len(set(secret))
    return len(secret) * min(math.log2(alphabet), math.log2(distinct)) if distinct > 1 else 0.0


def derive_key(secret: str, salt: bytes | None = None) -> str:
    """A gossip key (base64, as ``generate_key``) derived from a shared secret, the admin token: the nodes
    of one user on one machine share the token's file, so they share this key without a flag. HKDF-SHA256
    (RFC 5869): the token cannot be recovered from the key, and the key is as secret as the token. WeakSecret
    for a secret of less than DERIVED_KEY_SECRET_BITS_MIN (``secret_strength_bits``). ``salt``: the cluster's
    (None: the fixed one)."""
    bits = secret_strength_bits(secret)
    if bits < DERIVED_KEY_SECRET_BITS_MIN:
        raise WeakSecret(f"about {bits:.0f} bits, at least {DERIVED_KEY_SECRET_BITS_MIN} needed")
    key = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt or _DERIVED_KEY_SALT,
               info=_DERIVED_KEY_INFO).derive(secret.encode())
    return base64.b64encode(key).decode()


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
        # Called after every change (install, use, remove that changed something): the node keeps its keyring
        # on disk there (mesh/keyring_file.py) before the change is acknowledged.
        self.listeners: list = []
        for text in keys:
            self.install(text)
        if primary is not None:
            self.use(primary)

    def _changed(self) -> None:
        for listener in self.listeners:
            listener(self)

    def texts(self) -> list[str]:
        """Every key as ``--encrypt`` spells it, primary first (for the node's own file, never for display)."""
        return [base64.b64encode(k).decode("ascii") for k in self._keys]

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
        self._changed()

    def use(self, text: str) -> None:
        key = decode_key(text)
        if key not in self._keys:
            raise KeyringError("install a key before making it primary")
        if self._keys[0] == key:
            return
        self._keys.remove(key)
        self._keys.insert(0, key)
        self._changed()

    def remove(self, text: str) -> None:
        key = decode_key(text)
        if self._keys and key == self._keys[0]:
            raise KeyringError("cannot remove the primary key; make another one primary first")
        if key in self._keys:
            self._keys.remove(key)
            self._changed()

    def primary_text(self) -> str:
        """The primary key as ``--encrypt`` spells it (for a rotation to name it when it removes it)."""
        return base64.b64encode(self._keys[0]).decode("ascii")

    def fingerprints(self) -> list[str]:
        """What may be shown of the keys (primary first): never the keys themselves."""
        return [key_fingerprint(k) for k in self._keys]

    def seal(self, plaintext: bytes, label: bytes, nonce: bytes | None = None) -> bytes:
        """Sealed under the primary key. ``nonce`` (12 bytes) must never repeat under a key: the
        Sealer's sender and counter; without one, a random nonce (safe for up to 2^32 seals a key)."""
        if not self._keys:
            return plaintext
        if nonce is None:
            nonce = os.urandom(NONCE_BYTES)
        header = bytes([SEAL_VERSION])
        return header + nonce + AESGCM(self._keys[0]).encrypt(nonce, plaintext, header + label)

    def open(self, sealed: bytes, label: bytes) -> bytes | None:
        """The plaintext, or None if no installed key opens it (or it is malformed)."""
        if not self._keys:
            return sealed
        if len(sealed) < AEAD_OVERHEAD_BYTES or sealed[0] != SEAL_VERSION:
            return None
        header, nonce, body = sealed[:1], sealed[1:1 + NONCE_BYTES], sealed[1 + NONCE_BYTES:]
        for key in self._keys:
            try:
                return AESGCM(key).decrypt(nonce, body, header + label)
            except InvalidTag:
                continue
        return None


def key_fingerprint(key: bytes) -> str:
    """A short public name for a key: the first 16 hex digits of SHA-256 over a label and the key."""
    return hashlib.sha256(b"smg-node key fingerprint\0" + key).hexdigest()[:16]


def fingerprint_of(text: str) -> str:
    return key_fingerprint(decode_key(text))


@dataclasses.dataclass
class _SenderWindow:
    highest: int
    seen: int  # bit i set: counter (highest - i) was accepted
    last_time_s: float


class ReplayGuard:
    """Accepts each (sender, label, counter) once, and only with a time near ours. No clock inside."""

    def __init__(self, window_s: float = REPLAY_WINDOW_S, senders_max: int = REPLAY_SENDERS_MAX) -> None:
        self.window_s = window_s
        self.senders_max = senders_max
        self._senders: dict[tuple[bytes, bytes], _SenderWindow] = {}
        self._swept_at = 0.0

    def __len__(self) -> int:
        return len(self._senders)

    def check(self, sender: bytes, label: bytes, counter: int, sent_s: float, now_s: float) -> str | None:
        """None when the frame is new (and now remembered), else the reason to drop it."""
        if abs(now_s - sent_s) > self.window_s:
            return "stale"  # too old (or from too far in the future): no state could tell a replay
        if now_s - self._swept_at > self.window_s:
            self._sweep(now_s)
        key = (sender, label)
        window = self._senders.get(key)
        if window is None:
            if len(self._senders) >= self.senders_max:
                self._sweep(now_s)
                if len(self._senders) >= self.senders_max:
                    return "replay_table_full"
            self._senders[key] = _SenderWindow(counter, 1, now_s)
            return None
        if counter > window.highest:
            shift = counter - window.highest
            window.seen = ((window.seen << shift) | 1) & ((1 << REPLAY_COUNTERS_WINDOW) - 1) \
                if shift < REPLAY_COUNTERS_WINDOW else 1
            window.highest = counter
        else:
            age = window.highest - counter
            if age >= REPLAY_COUNTERS_WINDOW:
                return "replay_too_old"
            bit = 1 << age
            if window.seen & bit:
                return "replay"
            window.seen |= bit
        window.last_time_s = now_s
        return None

    def _sweep(self, now_s: float) -> None:
        """Forget senders silent for 2 windows: any frame of theirs would now fail the time check."""
        self._swept_at = now_s
        horizon = now_s - 2 * self.window_s
        for key in [k for k, w in self._senders.items() if w.last_time_s < horizon]:
            del self._senders[key]


class Sealer:
    """Seals and opens the mesh's packets and frames under a keyring, refusing replays.

    Without keys (a mesh run in the clear, on loopback or with --mesh-insecure) payloads pass
    as they are: nothing can be authenticated then, so nothing is checked.
    """

    def __init__(self, keyring: Keyring, guard: ReplayGuard | None = None) -> None:
        self.keyring = keyring
        self.guard = guard or ReplayGuard()
        self.sender = os.urandom(SENDER_BYTES)
        self._counter = 0

    def seal(self, payload: bytes, label: bytes, now_s: float) -> bytes:
        if not self.keyring.enabled:
            return payload
        if self._counter >= COUNTER_MAX:  # a new sender id, so that no nonce repeats (receivers see a restart)
            self.sender, self._counter = os.urandom(SENDER_BYTES), 0
        self._counter += 1
        nonce = self.sender + _COUNTER.pack(self._counter)
        return self.keyring.seal(_TIME.pack(max(0, int(now_s))) + payload, label, nonce)

    def open(self, sealed: bytes, label: bytes, now_s: float) -> tuple[bytes | None, str | None]:
        """(payload, None), or (None, reason): "decrypt", "seal_version" (sealed in a format this version does not
        read: another smg-node version, or a forger), "malformed", "stale", "replay", ..."""
        if not self.keyring.enabled:
            return sealed, None
        plain = self.keyring.open(sealed, label)
        if plain is None:
            # A small version byte other than ours: most likely a node of another version (it counts as a failed
            # authentication all the same). Anything else (a plain packet, garbage) is a failure to decrypt.
            other_version = bool(sealed) and sealed[0] != SEAL_VERSION and 0 < sealed[0] <= SEAL_VERSIONS_PLAUSIBLE_MAX
            return None, "seal_version" if other_version else "decrypt"
        if len(plain) < TIME_BYTES:
            return None, "malformed"
        sender = sealed[1:1 + SENDER_BYTES]  # authenticated: the nonce is part of what GCM checks
        (counter,) = _COUNTER.unpack_from(sealed, 1 + SENDER_BYTES)
        (sent_s,) = _TIME.unpack_from(plain)
        reason = self.guard.check(sender, label, counter, float(sent_s), now_s)
        if reason is not None:
            return None, reason
        return plain[TIME_BYTES:], None

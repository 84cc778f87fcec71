"""API keys made at run time: kept as hashes, replicated through the cluster, revocable. No I/O.

A key is created on any node (``POST /admin/api-keys``, ``smg-node keys create``)
and its secret shown once; every node keeps only its record:

    id, name, role, tenant, models (None: all), expires_at (None: never),
    sha256 (hex digest of the secret), created_at, revoked

Replication rides on the cluster's shared document (settings ``api_key:<id>``,
``gateway/cluster/state.py``): a record is written whole, and a revocation writes the
record again with ``revoked`` set, a tombstone that keeps the key dead on every
node whatever order the updates arrive in (ids are random: two nodes never write
the same record, so the document's last writer is the only writer).

The bound: a change is carried by gossip to every member within about a second
(memberlist's dissemination: retransmit_mult x log10(n+1) rounds of the gossip
interval, with every node that learns it passing it on), and in the worst case
(every gossip packet of it lost) by the next push-pull, ``push_pull_interval_s``
(30 s with the LAN preset, 10 s with ``local``). A revoked key is therefore
refused on every node within that bound; tests/integration/test_key_store.py
measures it on three nodes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import secrets
from typing import Any

from .principal import Principal, Role

SETTING_PREFIX = "api_key:"
KEYS_MAX = 10_000  # records kept (tombstones included); a create beyond it is refused
NAME_CHARS_MAX = 128
MODELS_MAX = 64
SECRET_PREFIX = "smg-"
TENANT_CHARS_MAX = 256
MODEL_CHARS_MAX = 256
TIME_MAX_S = float(2 ** 40)  # far beyond any expiry a client can ask for
_HEX_ID = re.compile(r"[0-9a-f]{1,64}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class KeyStoreError(ValueError):
    """A create or revoke that cannot be done (the message says why)."""


@dataclasses.dataclass(frozen=True)
class StoredKey:
    id: str
    name: str
    role: Role
    sha256: str
    created_at: float
    tenant: str | None = None
    models: tuple[str, ...] | None = None
    expires_at: float | None = None
    revoked: bool = False

    def to_record(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "role": self.role.value, "sha256": self.sha256,
                "created_at": self.created_at, "tenant": self.tenant,
                "models": list(self.models) if self.models is not None else None, "expires_at": self.expires_at,
                "revoked": self.revoked}

    def public(self, now: float) -> dict[str, Any]:
        """What may be shown: everything but the digest."""
        record = self.to_record()
        del record["sha256"]
        record["active"] = self.active(now)
        return record

    def active(self, now: float) -> bool:
        return not self.revoked and (self.expires_at is None or now < self.expires_at)

    def principal(self) -> Principal:
        return Principal(f"key:{self.id}", self.name, self.role, tenant=self.tenant,
                         models=frozenset(self.models) if self.models is not None else None)

    @classmethod
    def from_record(cls, record: Any) -> "StoredKey":
        """A peer's record, checked field by field (KeyStoreError when it is not one): nothing in it is cut,
        converted or trusted to be of the right kind."""
        if not isinstance(record, dict):
            raise KeyStoreError("not a key record: not an object")
        key_id, name, sha256, tenant = (record.get(k) for k in ("id", "name", "sha256", "tenant"))
        models, created_at, expires_at = record.get("models"), record.get("created_at"), record.get("expires_at")
        if not (isinstance(key_id, str) and _HEX_ID.fullmatch(key_id)):
            raise KeyStoreError("not a key record: its id is not 1 to 64 hex digits")
        if not (isinstance(sha256, str) and _SHA256_HEX.fullmatch(sha256)):
            raise KeyStoreError("not a key record: its digest is not 64 hex digits")
        if not (isinstance(name, str) and 0 < len(name) <= NAME_CHARS_MAX):
            raise KeyStoreError(f"not a key record: a name of 1 to {NAME_CHARS_MAX} characters")
        if tenant is not None and not (isinstance(tenant, str) and 0 < len(tenant) <= TENANT_CHARS_MAX):
            raise KeyStoreError(f"not a key record: a tenant of 1 to {TENANT_CHARS_MAX} characters")
        if models is not None and not (isinstance(models, list) and len(models) <= MODELS_MAX and all(
                isinstance(m, str) and 0 < len(m) <= MODEL_CHARS_MAX for m in models)):
            raise KeyStoreError(f"not a key record: models is a list of at most {MODELS_MAX} names")
        for stamp in (created_at, expires_at):
            if stamp is not None and not (isinstance(stamp, (int, float)) and not isinstance(stamp, bool)
                                          and math.isfinite(stamp) and 0 <= stamp <= TIME_MAX_S):
                raise KeyStoreError("not a key record: its times are not seconds since 1970")
        if created_at is None or not isinstance(record.get("revoked", False), bool):
            raise KeyStoreError("not a key record: no creation time, or revoked is not a boolean")
        try:
            role = Role(record.get("role"))
        except ValueError:
            raise KeyStoreError("not a key record: an unknown role") from None
        return cls(id=key_id, name=name, role=role, sha256=sha256, created_at=float(created_at), tenant=tenant,
                   models=tuple(models) if models is not None else None,
                   expires_at=float(expires_at) if expires_at is not None else None,
                   revoked=record.get("revoked", False))


def _counts(key: StoredKey) -> int:
    return 1 if key.role is Role.USER else 0


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


class KeyStore:
    def __init__(self) -> None:
        self._keys: dict[str, StoredKey] = {}  # id -> record
        self._by_digest: dict[bytes, StoredKey] = {}  # raw digest -> record (revoked ones too: refused)
        # Records with the role user, revoked ones included: once a key for inference exists, inference
        # needs a key; revoking keys never opens it again (a revoked key must not pass as no key).
        self.user_keys = 0

    def __len__(self) -> int:
        return len(self._keys)

    def create(self, name: str, role: Role, now: float, tenant: str | None = None,
               models: "list[str] | None" = None, expires_in_s: float | None = None) -> tuple[StoredKey, str]:
        """A new key: its record and its secret (shown once, never kept)."""
        if not name or len(name) > NAME_CHARS_MAX:
            raise KeyStoreError(f"a key needs a name of 1 to {NAME_CHARS_MAX} characters")
        if models is not None and (len(models) > MODELS_MAX or not all(isinstance(m, str) and m for m in models)):
            raise KeyStoreError(f"'models' is a list of at most {MODELS_MAX} model names")
        if expires_in_s is not None and not expires_in_s > 0:
            raise KeyStoreError("'expires_in_s' must be positive")
        if len(self._keys) >= KEYS_MAX:
            raise KeyStoreError(f"at most {KEYS_MAX} keys (revoked ones included)")
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        key = StoredKey(id=secrets.token_hex(8), name=name, role=role, sha256=digest_of(secret), created_at=now,
                        tenant=tenant, models=tuple(models) if models is not None else None,
                        expires_at=now + expires_in_s if expires_in_s is not None else None)
        self.apply(key)
        return key, secret

    def revoke(self, key_id: str) -> StoredKey:
        key = self._keys.get(key_id)
        if key is None:
            raise KeyError(key_id)
        revoked = dataclasses.replace(key, revoked=True)
        self.apply(revoked)
        return revoked

    def apply(self, key: StoredKey) -> None:
        """Take a record (ours or a peer's). A revoked record stays revoked: nothing revives it."""
        known = self._keys.get(key.id)
        if known is not None and known.revoked and not key.revoked:
            return
        if known is None and len(self._keys) >= KEYS_MAX:
            return
        self.user_keys += _counts(key) - (_counts(known) if known is not None else 0)
        self._keys[key.id] = key
        self._by_digest[bytes.fromhex(key.sha256)] = key

    def lookup(self, digest: bytes, now: float) -> Principal | None:
        """The principal of an active key with this SHA-256 digest; None for unknown, revoked or expired."""
        key = self._by_digest.get(digest)
        if key is None or not key.active(now):
            return None
        return key.principal()

    def get(self, key_id: str) -> StoredKey | None:
        return self._keys.get(key_id)

    def all(self) -> list[StoredKey]:
        return sorted(self._keys.values(), key=lambda k: k.created_at)

"""Credential in, ``Principal`` out. No I/O on the request path: keys are compared by their hashes.

Credentials: ``Authorization: Bearer <key>`` or ``x-api-key: <key>`` (Anthropic's
header; the same keys). Keys are kept only as SHA-256 digests; a lookup hashes
the presented key (~1 us) and finds its digest in a dict, so no comparison of
secrets takes time that depends on how much of a guess was right.

Where keys come from (smg's flag names):
  --api-key KEY                         one shared key for inference (role user), as vLLM's
  --tenant-api-key TENANT:KEY           repeatable; each key resolves to its tenant (role user)
  --control-plane-api-keys ID:NAME:ROLE:KEY   repeatable; role admin or user
  --admin-token TOKEN                   the node's admin credential; without any admin credential
                                        the node makes one (mesh/admin_token.py)
  --jwt-issuer ISS (--jwt-audience, --jwt-jwks-uri, --jwt-role-mapping ...)
                                        JWTs from an OIDC issuer (jwt_verifier.py); a credential that
                                        is not one of the keys above and looks like a JWT is verified

Access by route (``Access``):
  PUBLIC   health, liveness, readiness, metrics: no credential
  DATA     inference, models, tokenize: open while no user credential is configured (then a
           presented credential that matches no key is ignored: the openai SDK always sends one);
           otherwise a known key of any role, and the model must be in its allowlist
  ADMIN    workers, rate limits, API keys: an admin key, always (never open by default)
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .errors import Forbidden, KeysUnknown, Unauthenticated
from .jwt_verifier import JwtConfig, JwtVerifier, looks_like_jwt
from .key_store import KeyStore
from .principal import ANONYMOUS, Principal, Role
from ..base.options import Option


async def _no_fetch(url: str) -> Any:
    raise ValueError("no HTTP client to fetch the issuer's keys")

log = logging.getLogger("gateway.auth")

CREDENTIAL_BYTES_MAX = 4096  # a JWT with many claims fits; anything longer is not a credential of ours


class Access(enum.Enum):
    PUBLIC = "public"
    DATA = "data"
    ADMIN = "admin"


class AuthConfigError(ValueError):
    """A key flag that cannot be used (caught by the config as a ConfigError)."""


@dataclasses.dataclass(frozen=True)
class AuthConfig:
    api_key: str | None = None
    tenant_api_keys: tuple[str, ...] = ()  # "TENANT:KEY"
    control_plane_api_keys: tuple[str, ...] = ()  # "ID:NAME:ROLE:KEY"
    # The node's admin credential. None at start: taken from (or made into) admin_token_file.
    admin_token: str | None = None
    admin_token_file: Path | None = None
    # One JSON line per control-plane change on the gateway.audit logger (who, what, when, from where).
    audit: bool = False
    jwt: JwtConfig = JwtConfig()

    def has_admin_credential(self) -> bool:
        return self.admin_token is not None or any(
            _control_plane_key(spec)[2] is Role.ADMIN for spec in self.control_plane_api_keys)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def _control_plane_key(spec: str) -> tuple[str, str, Role, str]:
    parts = spec.split(":", 3)
    if len(parts) != 4 or not all(parts):
        raise AuthConfigError("--control-plane-api-keys takes ID:NAME:ROLE:KEY")
    key_id, name, role, key = parts
    try:
        return key_id, name, Role(role), key
    except ValueError:
        raise AuthConfigError(f"--control-plane-api-keys: role must be admin or user, got {role!r}") from None


def _tenant_key(spec: str) -> tuple[str, str]:
    tenant, sep, key = spec.partition(":")
    if not sep or not tenant or not key:
        raise AuthConfigError("--tenant-api-key takes TENANT:KEY")
    return tenant, key


class Authenticator:
    def __init__(self, config: AuthConfig, fetch_json: "Callable[[str], Awaitable[Any]] | None" = None,
                 store: KeyStore | None = None, clock: Callable[[], float] = time.time) -> None:
        """``fetch_json(url)``: how JWKS and discovery documents are fetched (the server's HTTP client);
        ``store``: the keys made at run time (key_store.py), replicated by the cluster."""
        self.config = config
        self.store = store if store is not None else KeyStore()
        self._clock = clock
        self._keys: dict[bytes, Principal] = {}
        try:
            self.jwt = JwtVerifier(config.jwt, fetch_json or _no_fetch) if config.jwt.enabled else None
        except ValueError as e:  # a role mapping that cannot be used
            raise AuthConfigError(str(e)) from None
        user_keys = 0
        if config.api_key:
            self._add(config.api_key, Principal("key:api-key", "api-key", Role.USER))
            user_keys += 1
        for spec in config.tenant_api_keys:
            tenant, key = _tenant_key(spec)
            self._add(key, Principal(f"tenant:{tenant}", f"tenant {tenant}", Role.USER, tenant=tenant))
            user_keys += 1
        for spec in config.control_plane_api_keys:
            key_id, name, role, key = _control_plane_key(spec)
            self._add(key, Principal(f"key:{key_id}", name, role))
            user_keys += role is Role.USER
        if config.admin_token:
            self._add(config.admin_token, Principal("key:admin-token", "admin token", Role.ADMIN))
        # No key for inference in the flags and no JWT issuer: open, until the store holds a user key.
        self._open_unless_stored = user_keys == 0 and self.jwt is None
        # Why inference is refused while it would be open: the node's keys on disk could not all be read back
        # (gateway/node/durable.py). None once a key arrives or an operator accepts the loss.
        self.keys_unknown: str | None = None

    @property
    def data_plane_open(self) -> bool:
        """Inference needs no key only while nobody configured one for it (flags, JWT, or the store)."""
        return self._open_unless_stored and not self.store.user_keys

    def _add(self, key: str, principal: Principal) -> None:
        if len(key) < 8:
            raise AuthConfigError(f"the key of {principal.name} is shorter than 8 characters")
        digest = _digest(key)
        if digest in self._keys:
            raise AuthConfigError(f"the key of {principal.name} is also the key of {self._keys[digest].name}")
        self._keys[digest] = principal

    @staticmethod
    def credential(headers: "dict[bytes, bytes]") -> str | None:
        """The presented key: a Bearer token or x-api-key; None when neither is sent."""
        value = headers.get(b"authorization")
        if value is not None:
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"bearer":
                return "" if value else None  # another scheme (Basic...): a credential we cannot accept
            value = token.strip()
        else:
            value = headers.get(b"x-api-key")
            if value is None:
                return None
        if len(value) > CREDENTIAL_BYTES_MAX:
            return ""
        return value.decode("latin-1")

    def lookup(self, credential: str) -> Principal | None:
        """The credential's principal: a key, or a verified JWT (Unauthenticated when it is a bad one;
        jwt_verifier.KeysMissing when its key must be fetched first); None when it is neither."""
        if not credential:
            return None
        if self.jwt is not None and looks_like_jwt(credential):
            try:
                return self.jwt.verify(credential)  # first: its cache answers a repeated token at once
            except Unauthenticated:
                principal = self._key(credential)  # a configured key that merely looks like a JWT
                if principal is None:
                    raise
                return principal
        return self._key(credential)

    def _key(self, credential: str) -> Principal | None:
        digest = _digest(credential)
        principal = self._keys.get(digest)
        if principal is None and len(self.store):
            principal = self.store.lookup(digest, self._clock())
        return principal

    async def refresh_keys(self) -> None:
        """Fetch the issuer's keys again (rate-limited by the verifier): a token named a new kid."""
        if self.jwt is not None:
            try:
                await self.jwt.refresh()
            except Exception as e:  # whatever the fetch's failure (network, HTTP, JSON), no new keys: a 401
                log.warning("JWT issuer keys not fetched: %s", e)

    def authenticate(self, headers: "dict[bytes, bytes]", access: Access) -> Principal:
        """The caller of a route with this access level; raises Unauthenticated or Forbidden."""
        if access is Access.PUBLIC:
            return ANONYMOUS
        if access is Access.DATA and self._open_unless_stored and not self.store.user_keys \
                and b"authorization" not in headers and b"x-api-key" not in headers:
            if self.keys_unknown is not None:
                raise KeysUnknown(self.keys_unknown, "keys_unknown")
            return ANONYMOUS  # the open data plane's usual request: nothing to look up (data_plane_open, inlined)
        credential = self.credential(headers)
        principal = self.lookup(credential) if credential is not None else None
        if access is Access.DATA:
            if principal is not None:
                return principal
            if self.data_plane_open:
                if self.keys_unknown is not None:
                    raise KeysUnknown(self.keys_unknown, "keys_unknown")
                return ANONYMOUS  # whatever was presented: an open data plane has no keys to match
            raise self._unauthenticated(credential)
        if principal is None:
            raise self._unauthenticated(credential, "this endpoint needs an admin API key")
        if not principal.is_admin:
            raise Forbidden(f"the key '{principal.name}' has the role user; this endpoint needs the role admin",
                            "insufficient_role")
        return principal

    @staticmethod
    def _unauthenticated(credential: str | None, missing: str = "an API key is required") -> Unauthenticated:
        if credential is None:
            return Unauthenticated(f"{missing} (Authorization: Bearer KEY, or x-api-key: KEY)", "missing_api_key")
        return Unauthenticated("the API key is not valid", "invalid_api_key", credential_given=True)

    @staticmethod
    def check_model(principal: Principal, model: str) -> None:
        if not principal.may_use(model):
            raise Forbidden(f"the key '{principal.name}' may not use the model '{model}'", "model_not_allowed")


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--admin-token", "auth.admin_token", str, "the node's admin credential (role admin; default: read from, "
           "or made into, --admin-token-file)", "security", secret=True),
    Option("--admin-token-file", "auth.admin_token_file", Path, "file holding the admin token when none is given "
           "(default ~/.local/state/smg-node/admin-token, mode 0600; the CLI reads it)", "security"),
    Option("--api-key", "auth.api_key", str, "one shared key for inference (role user); with any user key set, "
           "inference needs a key", "security", secret=True),
    Option("--tenant-api-key", "auth.tenant_api_keys", "list", "TENANT:KEY, a user key of that tenant (repeatable)",
           "security", secret=True),
    Option("--control-plane-api-keys", "auth.control_plane_api_keys", "list", "ID:NAME:ROLE:KEY keys, role admin "
           "(control plane and inference) or user (inference)", "security", secret=True),
    Option("--control-plane-audit-enabled", "auth.audit", "bool", "log every control-plane change as a JSON line "
           "(logger gateway.audit)", "security"),
)

"""JWTs from an OIDC issuer: keys discovered and cached, tokens verified by PyJWT, claims to a Principal.

Verification is PyJWT's (a well-kept JOSE library, not ours): the signature,
``iss`` and ``aud``; ``exp`` and ``nbf`` are checked here with a small leeway
against the clock passed in. What this module adds is policy:

* Algorithms: an allowlist of asymmetric ones (RS*, PS*, ES*, EdDSA). Never
  ``none``, never HS* (an HMAC "signed" with the issuer's public key is the
  classic confusion attack); and a key is used only with an algorithm of its own
  type (an RSA key never verifies an ES256 header), and with the JWK's ``alg``
  when the issuer states one.
* Keys: the JWKS (``--jwt-jwks-uri``, else ``jwks_uri`` from the issuer's
  ``/.well-known/openid-configuration``) is fetched at start and again when a
  token names a ``kid`` we do not hold (the issuer rotated its keys), at most once
  per ``refresh_interval_min_s`` so random kids cannot make us hammer the issuer.
* Claims to a Principal: ``key_id`` ``jwt:<iss>:<sub>``, tenant from a
  configurable claim, role from the ``roles`` claim (a string or a list) through
  ``--jwt-role-mapping idp_role=gateway_role``; without a mapped role a token is
  a ``user``.
* A verified token is cached until its ``exp`` (bounded LRU), so a client that
  sends the same token costs one dict lookup per request, not a signature check.

No I/O here but ``refresh``, which the caller awaits (the key fetcher is passed in).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import jwt

from .errors import Unauthenticated
from .principal import Principal, Role
from ..base.options import Option

ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
# Which algorithms a key of each JWK type may verify.
_KEY_TYPE_ALGORITHMS = {"RSA": {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"},
                        "EC": {"ES256", "ES384", "ES512"}, "OKP": {"EdDSA"}}
TOKENS_CACHED_MAX = 10_000
JWKS_KEYS_MAX = 64


TENANT_CHARS_MAX = 128


def tenant_id(claim: str) -> str:
    """The tenant a claim names: itself up to TENANT_CHARS_MAX characters, else a digest of all of it. Never cut:
    two tenants whose long names share their first 128 characters would be one (their limits, their data)."""
    if len(claim) <= TENANT_CHARS_MAX:
        return claim
    return "sha256:" + hashlib.sha256(claim.encode("utf-8", "surrogateescape")).hexdigest()


class KeysMissing(Exception):
    """The token names a key we do not hold: refresh the JWKS, then try again."""


@dataclasses.dataclass(frozen=True)
class JwtConfig:
    issuer: str | None = None
    audience: str | None = None
    jwks_uri: str | None = None  # None: from the issuer's discovery document
    role_mapping: tuple[str, ...] = ()  # "idp_role=gateway_role"
    tenant_claim: str = "tenant"
    role_claim: str = "roles"
    # exp/nbf tolerance for clocks that disagree a little.
    leeway_s: float = 30.0
    # Least time between two JWKS fetches caused by unknown kids.
    refresh_interval_min_s: float = 10.0

    @property
    def enabled(self) -> bool:
        return self.issuer is not None

    def roles(self) -> dict[str, Role]:
        mapping = {}
        for spec in self.role_mapping:
            idp_role, sep, role = spec.partition("=")
            if not sep or not idp_role:
                raise ValueError(f"--jwt-role-mapping takes IDP_ROLE=GATEWAY_ROLE, got {spec!r}")
            try:
                mapping[idp_role] = Role(role)
            except ValueError:
                raise ValueError(f"--jwt-role-mapping: the gateway role must be admin or user, got {role!r}") from None
        return mapping


def looks_like_jwt(credential: str) -> bool:
    return credential.count(".") == 2 and credential.startswith("eyJ")


class JwtVerifier:
    def __init__(self, config: JwtConfig, fetch_json: Callable[[str], Awaitable[Any]],
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._roles = config.roles()
        self._fetch_json = fetch_json
        self._clock = clock
        self._keys: dict[str, tuple[jwt.PyJWK, str | None]] = {}  # kid -> (key, the JWK's own "alg")
        self._refreshed_at = float("-inf")
        self._cache: collections.OrderedDict[str, tuple[Principal, float]] = collections.OrderedDict()
        self.refreshes = 0

    @property
    def key_count(self) -> int:
        return len(self._keys)

    # -- keys -------------------------------------------------------------

    async def refresh(self, force: bool = False) -> bool:
        """Fetch the JWKS again (no more often than the minimum interval, unless forced); True if fetched."""
        now = self._clock()
        if not force and now - self._refreshed_at < self.config.refresh_interval_min_s:
            return False
        self._refreshed_at = now
        uri = self.config.jwks_uri
        if uri is None:
            discovery = await self._fetch_json(self.config.issuer.rstrip("/") + "/.well-known/openid-configuration")
            uri = discovery.get("jwks_uri") if isinstance(discovery, dict) else None
            if not isinstance(uri, str):
                raise ValueError("the issuer's discovery document has no jwks_uri")
        document = await self._fetch_json(uri)
        keys: dict[str, tuple[jwt.PyJWK, str | None]] = {}
        for data in (document.get("keys") or [])[:JWKS_KEYS_MAX] if isinstance(document, dict) else []:
            if not isinstance(data, dict) or data.get("use", "sig") != "sig" or not isinstance(data.get("kid"), str):
                continue
            try:
                key = jwt.PyJWK(data)
            except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
                continue  # a key type or algorithm we do not take (oct, HS*, unknown curves)
            if key.key_type in _KEY_TYPE_ALGORITHMS:
                stated = data.get("alg")
                keys[data["kid"]] = (key, stated if isinstance(stated, str) else None)
        self._keys = keys
        self.refreshes += 1
        return True

    # -- tokens -------------------------------------------------------------

    def verify(self, token: str) -> Principal:
        """The token's Principal; Unauthenticated when it is not valid; KeysMissing for an unknown kid."""
        cached = self._cache.get(token)
        now = self._clock()
        if cached is not None:
            principal, expires_at = cached
            if now < expires_at:
                return principal
            del self._cache[token]
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("the token is not a JWT", credential_given=True) from None
        algorithm, kid = header.get("alg"), header.get("kid")
        if algorithm not in ASYMMETRIC_ALGORITHMS:
            raise Unauthenticated(f"the token's algorithm {algorithm!r} is not accepted", credential_given=True)
        entry = self._keys.get(kid) if isinstance(kid, str) else None
        if entry is None:
            raise KeysMissing(kid)
        key, stated = entry
        if algorithm not in _KEY_TYPE_ALGORITHMS[key.key_type] or (stated is not None and stated != algorithm):
            raise Unauthenticated("the token's algorithm does not match its key", credential_given=True)
        try:
            # Times are checked below against our clock (passed in: tests run on a fixed one).
            claims = jwt.decode(token, key.key, algorithms=[algorithm], audience=self.config.audience,
                                issuer=self.config.issuer,
                                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                                         "require": ["exp", "iss", "sub"] + (["aud"] if self.config.audience else [])})
        except jwt.PyJWTError as e:
            raise Unauthenticated(f"the token is not valid: {e}", credential_given=True) from None
        exp, nbf, leeway = claims.get("exp"), claims.get("nbf"), self.config.leeway_s
        if not isinstance(exp, (int, float)) or isinstance(exp, bool) or (
                nbf is not None and (not isinstance(nbf, (int, float)) or isinstance(nbf, bool))):
            raise Unauthenticated("the token's exp or nbf is not a number", credential_given=True)
        if now > exp + leeway:
            raise Unauthenticated("the token has expired", "token_expired", credential_given=True)
        if nbf is not None and now < nbf - leeway:
            raise Unauthenticated("the token is not valid yet", credential_given=True)
        principal = self._principal(claims)
        self._cache[token] = (principal, float(claims["exp"]) + self.config.leeway_s)
        if len(self._cache) > TOKENS_CACHED_MAX:
            self._cache.popitem(last=False)
        return principal

    def _principal(self, claims: dict[str, Any]) -> Principal:
        roles = claims.get(self.config.role_claim) or []
        roles = [roles] if isinstance(roles, str) else [r for r in roles if isinstance(r, str)] \
            if isinstance(roles, list) else []
        mapped = {self._roles[r] for r in roles if r in self._roles}
        role = Role.ADMIN if Role.ADMIN in mapped else Role.USER
        tenant = claims.get(self.config.tenant_claim)
        subject = str(claims["sub"])
        name = claims.get("name") or claims.get("preferred_username") or subject
        return Principal(f"jwt:{claims['iss']}:{subject}", str(name)[:128], role,
                         tenant=tenant_id(str(tenant)) if isinstance(tenant, (str, int)) else None)


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--jwt-issuer", "jwt.issuer", str, "accept JWTs from this OIDC issuer (its keys from "
           "/.well-known/openid-configuration unless --jwt-jwks-uri)", "security"),
    Option("--jwt-audience", "jwt.audience", str, "the audience JWTs must name", "security"),
    Option("--jwt-jwks-uri", "jwt.jwks_uri", str, "where the issuer's keys are (default: discovered)", "security"),
    Option("--jwt-role-mapping", "jwt.role_mapping", "list", "IDP_ROLE=GATEWAY_ROLE (admin or user) pairs for the "
           "roles claim; unmapped tokens are user", "security"),
    Option("--jwt-tenant-claim", "jwt.tenant_claim", str, "the claim naming the tenant (default tenant)", "security"),
    Option("--jwt-role-claim", "jwt.role_claim", str, "the claim listing roles (default roles)", "security"),
    Option("--jwt-keys-refresh-min-secs", "jwt.refresh_interval_min_s", float, "least time between two fetches of "
           "the issuer's keys for unknown kids (default 10)", "security"),
)

"""JWT rules (gateway/auth/jwt_verifier.py) on tokens made here, the clock passed in: one rule per test."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from gateway.auth import JwtConfig, KeysMissing, Role, Unauthenticated
from gateway.auth.jwt_verifier import JwtVerifier

ISSUER = "https://issuer.test"
NOW = 1_800_000_000.0
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def jwk(private, kid: str, alg: str) -> dict:
    algorithm = RSAAlgorithm if alg.startswith(("RS", "PS")) else ECAlgorithm
    return {**json.loads(algorithm.to_jwk(private.public_key())), "kid": kid, "alg": alg, "use": "sig"}


class Issuer:
    def __init__(self) -> None:
        self.keys = [jwk(RSA_KEY, "r1", "RS256"), jwk(EC_KEY, "e1", "ES256")]
        self.fetches = 0

    async def fetch(self, url: str):
        self.fetches += 1
        if url.endswith("/.well-known/openid-configuration"):
            return {"issuer": ISSUER, "jwks_uri": ISSUER + "/jwks"}
        return {"keys": self.keys}


def token(claims=None, key=RSA_KEY, alg="RS256", kid="r1", **overrides) -> str:
    body = {"iss": ISSUER, "sub": "alice", "aud": "smg", "exp": NOW + 300, "iat": NOW, **(claims or {})}
    body.update(overrides)
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


@pytest.fixture
async def verifier():
    clock = [NOW]
    issuer = Issuer()
    v = JwtVerifier(JwtConfig(issuer=ISSUER, audience="smg", role_mapping=("ops=admin",)), issuer.fetch,
                    clock=lambda: clock[0])
    await v.refresh(force=True)
    v.issuer, v.clock = issuer, clock
    return v


async def test_a_valid_token_is_its_principal(verifier):
    p = verifier.verify(token({"tenant": "acme", "name": "Alice"}))
    assert (p.key_id, p.name, p.tenant, p.role) == (f"jwt:{ISSUER}:alice", "Alice", "acme", Role.USER)


async def test_a_long_tenant_claim_is_hashed_never_cut(verifier):
    # Issue 33: claims were cut at 128 characters, so two tenants whose names share those were one tenant.
    first, second = "t" * 128 + "-first", "t" * 128 + "-second"
    a, b = verifier.verify(token({"tenant": first})).tenant, verifier.verify(token({"tenant": second})).tenant
    assert a != b and a.startswith("sha256:") and len(a) <= 128
    assert verifier.verify(token({"tenant": "t" * 128})).tenant == "t" * 128  # up to the bound: itself


async def test_roles_are_mapped_and_unmapped_ones_are_user(verifier):
    assert verifier.verify(token({"roles": ["ops", "x"]})).role is Role.ADMIN
    assert verifier.verify(token({"roles": "guest"})).role is Role.USER


async def test_an_ec_key_verifies_es256(verifier):
    assert verifier.verify(token(key=EC_KEY, alg="ES256", kid="e1")).key_id.endswith("alice")


@pytest.mark.parametrize("overrides", [{"exp": NOW - 31}, {"nbf": NOW + 31}, {"aud": "other"}, {"iss": "https://evil"}])
async def test_expired_early_wrong_audience_or_issuer_is_refused(verifier, overrides):
    with pytest.raises(Unauthenticated):
        verifier.verify(token(**overrides))


async def test_exp_and_nbf_have_a_small_leeway(verifier):
    verifier.verify(token(exp=NOW - 20, nbf=NOW + 20))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


async def test_alg_none_is_refused(verifier):
    unsigned = _b64(b'{"alg":"none","kid":"r1"}') + "." + _b64(json.dumps(
        {"iss": ISSUER, "sub": "alice", "aud": "smg", "exp": NOW + 300}).encode()) + "."
    with pytest.raises(Unauthenticated, match="algorithm"):
        verifier.verify(unsigned)


async def test_an_hmac_keyed_with_the_public_key_is_refused(verifier):
    """The confusion attack: HS256 'signed' with the issuer's public key, which anyone has."""
    pem = RSA_KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = _b64(b'{"alg":"HS256","kid":"r1","typ":"JWT"}') + "." + _b64(json.dumps(
        {"iss": ISSUER, "sub": "mallory", "aud": "smg", "exp": NOW + 300, "roles": ["ops"]}).encode())
    forged = signing_input + "." + _b64(hmac.new(pem, signing_input.encode(), hashlib.sha256).digest())
    with pytest.raises(Unauthenticated, match="algorithm"):
        verifier.verify(forged)


async def test_an_algorithm_of_another_key_type_is_refused(verifier):
    with pytest.raises(Unauthenticated, match="does not match"):
        verifier.verify(token(key=EC_KEY, alg="ES256", kid="r1"))  # an EC signature under the RSA key's kid


async def test_an_unknown_kid_asks_for_a_refresh_which_is_rate_limited(verifier):
    new_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rotated = token(key=new_key, kid="r2")
    with pytest.raises(KeysMissing):
        verifier.verify(rotated)
    verifier.issuer.keys.append(jwk(new_key, "r2", "RS256"))  # the issuer rotates
    assert not await verifier.refresh()  # too soon after the last fetch: not fetched
    verifier.clock[0] += 11
    assert await verifier.refresh()
    assert verifier.verify(rotated).key_id.endswith("alice")


async def test_a_verified_token_is_cached_until_it_expires(verifier):
    t = token(exp=NOW + 60)
    first = verifier.verify(t)
    assert verifier.verify(t) is first
    verifier.clock[0] += 60 + 31
    with pytest.raises(Unauthenticated, match="expired"):
        verifier.verify(t)

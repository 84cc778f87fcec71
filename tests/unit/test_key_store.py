"""Run-time API keys (gateway/auth/key_store.py): one rule per test, time passed in."""

from __future__ import annotations

import hashlib

import pytest

from gateway.auth import Access, AuthConfig, Authenticator, Forbidden, Role, Unauthenticated
from gateway.auth.key_store import KeyStore, KeyStoreError, StoredKey


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def test_a_created_key_is_kept_only_as_its_digest_and_resolves():
    store = KeyStore()
    key, secret = store.create("ci", Role.USER, 100.0, tenant="acme", models=["m"])
    assert secret not in str(key.to_record()) and key.sha256 == hashlib.sha256(secret.encode()).hexdigest()
    p = store.lookup(digest(secret), 101.0)
    assert (p.key_id, p.tenant, p.models) == (f"key:{key.id}", "acme", frozenset({"m"}))
    assert "sha256" not in key.public(101.0)


def test_a_revoked_key_is_refused_and_no_later_record_revives_it():
    store = KeyStore()
    key, secret = store.create("ci", Role.USER, 0.0)
    revoked = store.revoke(key.id)
    assert store.lookup(digest(secret), 1.0) is None
    store.apply(key)  # the old record arriving late from a peer
    assert store.get(key.id).revoked and store.lookup(digest(secret), 1.0) is None
    assert revoked.public(1.0)["active"] is False


def test_an_expired_key_is_refused():
    store = KeyStore()
    _, secret = store.create("ci", Role.USER, 0.0, expires_in_s=10)
    assert store.lookup(digest(secret), 9.9) is not None and store.lookup(digest(secret), 10.0) is None


def test_records_from_peers_are_checked():
    for bad in ({"id": "x"}, {"id": "x", "name": "n", "role": "root", "sha256": "0" * 64, "created_at": 1},
                {"id": "x", "name": "n", "role": "user", "sha256": "short", "created_at": 1}, "not a dict"):
        with pytest.raises(KeyStoreError):
            StoredKey.from_record(bad)


def test_user_keys_close_the_data_plane_and_models_are_enforced():
    store = KeyStore()
    auth = Authenticator(AuthConfig(admin_token="admin-0123456789"), store=store, clock=lambda: 5.0)
    assert auth.data_plane_open
    _, admin_secret = store.create("ops", Role.ADMIN, 0.0)
    assert auth.data_plane_open  # an admin key is not a key for inference
    key, secret = store.create("app", Role.USER, 0.0, models=["m"])
    assert not auth.data_plane_open
    with pytest.raises(Unauthenticated):
        auth.authenticate({}, Access.DATA)
    principal = auth.authenticate({b"authorization": f"Bearer {secret}".encode()}, Access.DATA)
    with pytest.raises(Forbidden):
        Authenticator.check_model(principal, "other")
    assert auth.authenticate({b"x-api-key": admin_secret.encode()}, Access.ADMIN).is_admin
    store.revoke(key.id)
    assert not auth.data_plane_open  # revoking never reopens inference: the revoked key is not "no key"
    with pytest.raises(Unauthenticated):
        auth.authenticate({b"authorization": f"Bearer {secret}".encode()}, Access.DATA)

"""Authentication as subsystems of the node (gateway/base/subsystem.py): its section and flags (keys, roles, the
admin credential, JWT issuers), the keys made at run time (replicated through the cluster's shared document) and the
authenticator every request passes (an issuer's keys fetched before the first token needs them)."""

from __future__ import annotations

import logging
from typing import Any

import httpx2

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from . import authenticator, jwt_verifier
from .authenticator import AuthConfig, AuthConfigError, Authenticator
from .key_store import SETTING_PREFIX, KeyStore, KeyStoreError, StoredKey

log = logging.getLogger("gateway.auth")

JWKS_BYTES_MAX = 1024 * 1024
JWKS_FETCH_TIMEOUT_S = 5.0


def _check(config: Any) -> None:
    try:
        Authenticator(config.auth)
    except (AuthConfigError, ValueError) as e:
        raise ConfigProblem(str(e)) from None


async def _start_key_store(context: StartContext) -> KeyStore:
    """The keys made at run time: those the node's settings document holds (the cluster's, or a lone node's own;
    both kept on disk with a data directory), then every one a peer writes."""
    store = KeyStore()

    def on_setting(name: str, value: Any) -> None:
        if not name.startswith(SETTING_PREFIX):
            return
        try:
            store.apply(StoredKey.from_record(value))
        except KeyStoreError as e:
            log.warning("ignored an API key record from a peer: %s", e)

    context.need("settings").follow_settings(on_setting)
    return store


def _json_fetcher(http_client: httpx2.AsyncClient):
    """How the authenticator fetches an issuer's discovery document and keys: bounded in time and size."""
    async def fetch_json(url: str) -> Any:
        response = await http_client.get(url, timeout=JWKS_FETCH_TIMEOUT_S)
        response.raise_for_status()
        if len(response.content) > JWKS_BYTES_MAX:
            raise ValueError(f"{url} answered more than {JWKS_BYTES_MAX} bytes")
        return response.json()
    return fetch_json


async def _first_key_fetch(auth: Authenticator) -> None:
    """The issuer's keys before the first token needs them; an issuer down at start is tried again when a token
    arrives."""
    try:
        await auth.jwt.refresh(force=True)
        log.info("JWT issuer %s: %d signing keys", auth.config.jwt.issuer, auth.jwt.key_count)
    except (httpx2.HTTPError, ValueError) as e:
        log.warning("JWT issuer %s: keys not fetched yet (%s); tried again on the first token", auth.config.jwt.issuer,
                    e)


async def _start_authenticator(context: StartContext) -> Authenticator:
    auth = Authenticator(context.config.auth, _json_fetcher(context.need("http_client")), context.need("key_store"))
    auth.keys_unknown = context.need("settings").keys_may_be_lost  # before the first request (issue 62)
    if auth.jwt is not None:
        context.nursery.start_soon(_first_key_fetch, auth)
    return auth


AUTH = Subsystem("auth", AuthConfig(), (*authenticator.OPTIONS, *jwt_verifier.OPTIONS), _check)
KEY_STORE = Subsystem("key_store", start=_start_key_store, needs=("settings",))
AUTHENTICATOR = Subsystem("authenticator", start=_start_authenticator, needs=("http_client", "key_store", "settings"))

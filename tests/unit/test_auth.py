"""The authenticator's rules (gateway/auth/authenticator.py), one test per rule, and the admin token file."""

from __future__ import annotations

import os
import stat

import pytest

from mesh.crypto import generate_key

from gateway.auth import ANONYMOUS, Access, AuthConfig, Authenticator, Forbidden, Role, Unauthenticated
from gateway.auth.authenticator import AuthConfigError
from gateway.node.config import ConfigError, add_serve_arguments, build_config, with_admin_credentials
from mesh.admin_token import AdminTokenError, load_or_create_token, read_token

ADMIN = "admin-key-0123456789"
USER = "user-key-0123456789"


def bearer(key: str) -> dict[bytes, bytes]:
    return {b"authorization": b"Bearer " + key.encode()}


def auth(**kw) -> Authenticator:
    return Authenticator(AuthConfig(**kw))


def test_public_routes_need_no_credential():
    assert auth(api_key=USER).authenticate({}, Access.PUBLIC) is ANONYMOUS


def test_data_plane_is_open_while_no_user_key_is_configured_whatever_is_presented():
    a = auth(admin_token=ADMIN)
    assert a.authenticate({}, Access.DATA) is ANONYMOUS
    assert a.authenticate(bearer("unused"), Access.DATA) is ANONYMOUS  # the openai SDK always sends one


def test_a_known_key_is_its_principal_even_on_an_open_data_plane():
    assert auth(admin_token=ADMIN).authenticate(bearer(ADMIN), Access.DATA).role is Role.ADMIN


def test_with_a_user_key_the_data_plane_needs_a_known_key():
    a = auth(api_key=USER)
    with pytest.raises(Unauthenticated) as missing:
        a.authenticate({}, Access.DATA)
    assert missing.value.code == "missing_api_key" and not missing.value.credential_given
    with pytest.raises(Unauthenticated) as wrong:
        a.authenticate(bearer("guess-0123456789"), Access.DATA)
    assert wrong.value.code == "invalid_api_key" and wrong.value.credential_given
    assert a.authenticate(bearer(USER), Access.DATA).key_id == "key:api-key"


def test_x_api_key_authenticates_like_a_bearer_key():
    assert auth(api_key=USER).authenticate({b"x-api-key": USER.encode()}, Access.DATA).role is Role.USER


def test_another_scheme_is_not_a_credential():
    with pytest.raises(Unauthenticated):
        auth(api_key=USER).authenticate({b"authorization": b"Basic " + USER.encode()}, Access.DATA)


def test_the_control_plane_is_never_open():
    for a in (auth(), auth(admin_token=ADMIN)):
        with pytest.raises(Unauthenticated):
            a.authenticate({}, Access.ADMIN)
        with pytest.raises(Unauthenticated):
            a.authenticate(bearer("unused"), Access.ADMIN)


def test_the_control_plane_needs_the_admin_role():
    a = auth(admin_token=ADMIN, control_plane_api_keys=(f"k1:ci:user:{USER}",))
    with pytest.raises(Forbidden) as e:
        a.authenticate(bearer(USER), Access.ADMIN)
    assert e.value.code == "insufficient_role"
    assert a.authenticate(bearer(ADMIN), Access.ADMIN).is_admin


def test_control_plane_keys_carry_their_id_name_and_role():
    a = auth(control_plane_api_keys=(f"ops:Operations:admin:{ADMIN}",))
    p = a.authenticate(bearer(ADMIN), Access.ADMIN)
    assert (p.key_id, p.name, p.role) == ("key:ops", "Operations", Role.ADMIN)


def test_a_tenant_key_resolves_to_its_tenant():
    p = auth(tenant_api_keys=(f"acme:{USER}",)).authenticate(bearer(USER), Access.DATA)
    assert p.tenant == "acme" and p.key_id == "tenant:acme"


def test_a_key_limited_to_models_may_use_only_those():
    from gateway.auth import Principal
    p = Principal("key:k", "k", Role.USER, models=frozenset({"a"}))
    Authenticator.check_model(p, "a")
    with pytest.raises(Forbidden):
        Authenticator.check_model(p, "b")


@pytest.mark.parametrize("kw", [dict(control_plane_api_keys=("k1:name:root:key-0123456789",)),
                                dict(control_plane_api_keys=("only:three:parts",)),
                                dict(tenant_api_keys=("no-key",)),
                                dict(api_key="short"),
                                dict(api_key=USER, admin_token=USER)])
def test_unusable_key_flags_are_refused(kw):
    with pytest.raises(AuthConfigError):
        Authenticator(AuthConfig(**kw))


def test_an_overlong_credential_is_refused_without_hashing_it():
    with pytest.raises(Unauthenticated):
        auth(api_key=USER).authenticate(bearer("x" * 10_000), Access.DATA)


def test_token_file_is_made_once_with_mode_600(tmp_path):
    path = tmp_path / "state" / "admin-token"
    token, created = load_or_create_token(path)
    assert created and len(token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_or_create_token(path) == (token, False)


def test_a_token_file_others_can_read_is_refused(tmp_path):
    path = tmp_path / "admin-token"
    path.write_text("planted-token\n")
    os.chmod(path, 0o644)
    with pytest.raises(AdminTokenError):
        read_token(path)


KEY = generate_key()


def _config(argv, tmp_path):
    import argparse
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return build_config(parser.parse_args(argv), environ={"SMG_NODE_ADMIN_TOKEN_FILE": str(tmp_path / "t")})


def test_a_node_without_an_admin_credential_takes_the_token_file(tmp_path):
    config = with_admin_credentials(_config(["--admin-token-file", str(tmp_path / "t"),
                                             "--mesh-bind", "127.0.0.1:0"], tmp_path))
    assert config.auth.admin_token == read_token(tmp_path / "t")
    assert config.mesh.rpc_token == config.auth.admin_token  # the CLI's endpoint is never open


def test_an_explicit_admin_token_is_used_and_no_file_is_made(tmp_path):
    config = with_admin_credentials(_config(["--admin-token", ADMIN, "--admin-token-file", str(tmp_path / "t")],
                                            tmp_path))
    assert config.auth.admin_token == ADMIN and not (tmp_path / "t").exists()


def test_a_mesh_off_loopback_needs_encryption_or_an_explicit_insecure_flag(tmp_path):
    with pytest.raises(ConfigError, match="--encrypt"):
        _config(["--mesh-bind", "0.0.0.0:7946"], tmp_path)
    assert _config(["--mesh-bind", "0.0.0.0:7946", "--mesh-insecure"], tmp_path).mesh.insecure
    _config(["--mesh-bind", "127.0.0.1:7946"], tmp_path)  # loopback: no --encrypt needed (a key is derived)


def test_a_mesh_without_encrypt_derives_its_key_from_the_admin_token_and_is_never_in_the_clear(tmp_path):
    from mesh.crypto import decode_key
    first = with_admin_credentials(_config(["--mesh-bind", "127.0.0.1:7946"], tmp_path)).mesh
    second = with_admin_credentials(_config(["--mesh-bind", "127.0.0.1:7947"], tmp_path)).mesh
    assert first.keys == second.keys and len(decode_key(first.keys[0])) == 32  # one token file, one key
    assert first.key_source == "admin-token" and read_token(tmp_path / "t") not in first.keys[0]
    strong = "Zq3-8vJx_Lk2Rw9tYpB4nHs7Gm1Dc6Fe"
    other = with_admin_credentials(_config(["--mesh-bind", "127.0.0.1:7946", "--admin-token", strong], tmp_path))
    assert other.mesh.keys != first.keys  # another token, another key
    explicit = with_admin_credentials(_config(["--mesh-bind", "127.0.0.1:7946", "--encrypt", KEY], tmp_path))
    assert explicit.mesh.keys == (KEY,) and explicit.mesh.key_source == "flag"
    clear = with_admin_credentials(_config(["--mesh-bind", "127.0.0.1:7946", "--mesh-insecure"], tmp_path))
    assert clear.mesh.keys == ()  # only when asked


@pytest.mark.parametrize("token", ["admin123", "admin-key-0123456789", "passwordpasswordpasswordpassword",
                                   "correct horse battery staple", "a" * 100])
def test_a_weak_admin_token_is_refused_as_the_mesh_key_s_secret(tmp_path, token):
    """Issue 59: with `admin123` a local process guessing six words read a tenant's conversation over the mesh."""
    with pytest.raises(ConfigError, match=r"the admin token is too weak to derive the mesh's gossip key from \(about "
                                          r"\d+ bits, at least 128 needed\).*--encrypt"):
        with_admin_credentials(_config(["--mesh-bind", "127.0.0.1:7946", "--admin-token", token], tmp_path))
    # The same token is fine where nothing is derived from it: no mesh, or a mesh with its own key.
    assert with_admin_credentials(_config(["--admin-token", token], tmp_path)).auth.admin_token == token
    with_admin_credentials(_config(["--mesh-bind", "127.0.0.1:7946", "--admin-token", token, "--encrypt", KEY],
                                   tmp_path))


def test_the_token_files_salt_is_the_clusters_and_an_older_file_keeps_the_fixed_one(tmp_path):
    from mesh.admin_token import cluster_salt, salt_path
    from mesh.crypto import derive_key, secret_strength_bits
    token = secrets_token = load_or_create_token(tmp_path / "t")[0]
    assert secret_strength_bits(secrets_token) >= 200  # the node's own tokens pass with room to spare
    salt = cluster_salt(tmp_path / "t")
    assert len(salt) == 32 and stat.S_IMODE(salt_path(tmp_path / "t").stat().st_mode) == 0o600
    mesh = with_admin_credentials(_config(["--mesh-bind", "127.0.0.1:7946"], tmp_path)).mesh
    assert mesh.keys == (derive_key(token, salt),) != (derive_key(token),)
    # A token file older than its salt (made before the salt was): the fixed salt, so its key does not change.
    (tmp_path / "u").write_text(token)
    os.chmod(tmp_path / "u", 0o600)
    older = with_admin_credentials(_config(["--mesh-bind", "127.0.0.1:7946", "--admin-token-file",
                                            str(tmp_path / "u")], tmp_path)).mesh
    assert cluster_salt(tmp_path / "u") is None and older.keys == (derive_key(token),)


def test_a_prompt_longer_than_its_context_can_hold_is_refused_before_encoding():
    from types import SimpleNamespace

    from gateway.api.errors import ContextLengthExceeded
    from gateway.api.pipeline import check_prompt_chars
    entry = SimpleNamespace(max_context_tokens=100)
    tokenizer = SimpleNamespace(token_chars_max=8)
    check_prompt_chars(entry, tokenizer, "x" * 800, "prompt")  # might fit: left to the encoder and the count
    with pytest.raises(ContextLengthExceeded):
        check_prompt_chars(entry, tokenizer, "x" * 801, "prompt")
    check_prompt_chars(SimpleNamespace(max_context_tokens=None), tokenizer, "x" * 10_000, "prompt")

"""JWTs end to end with the openai SDK: a local OIDC issuer this test serves (discovery document and
JWKS over HTTP), a real node, key rotation at the issuer, an expired token, a wrong audience, alg none."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time

import httpx2
import jwt
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from chaos.processes import NodeProcess

from tests.support.nodes import MODEL


class _Issuer(http.server.BaseHTTPRequestHandler):
    keys: list[dict] = []
    base = ""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/.well-known/openid-configuration":
            body = {"issuer": self.base, "jwks_uri": self.base + "/jwks"}
        elif self.path == "/jwks":
            body = {"keys": self.keys}
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def public_jwk(key, kid: str) -> dict:
    return {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": kid, "alg": "RS256", "use": "sig"}


@pytest.fixture(scope="module")
def issuer():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Issuer)
    _Issuer.base = f"http://127.0.0.1:{server.server_address[1]}"
    first = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _Issuer.keys = [public_jwk(first, "k1")]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield _Issuer, first
    server.shutdown()


@pytest.fixture(scope="module")
def jwt_node(engines, log_dir, issuer):
    n = NodeProcess(["--worker-urls", engines[0].url, "--jwt-issuer", issuer[0].base, "--jwt-audience", "smg",
                     "--jwt-role-mapping", "ops=admin", "--jwt-keys-refresh-min-secs", "0.2"], log_dir, "jwt-node")
    yield n
    n.stop()


def make_token(issuer, key, kid="k1", **claims) -> str:
    now = time.time()
    body = {"iss": issuer.base, "sub": "alice", "aud": "smg", "iat": now, "exp": now + 300, **claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": kid})


def ask(node, token: str) -> str:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key=token, max_retries=0, timeout=30)
    return client.chat.completions.create(model=MODEL, max_tokens=2,
                                          messages=[{"role": "user", "content": "hi"}]).choices[0].message.content


def test_a_token_from_the_issuer_is_accepted_and_bad_ones_are_not(jwt_node, issuer):
    meta, key = issuer
    assert ask(jwt_node, make_token(meta, key))
    for bad in (make_token(meta, key, exp=time.time() - 120), make_token(meta, key, aud="someone-else"),
                base64.urlsafe_b64encode(b'{"alg":"none","kid":"k1"}').rstrip(b"=").decode() + "." +
                base64.urlsafe_b64encode(json.dumps({"iss": meta.base, "sub": "x", "aud": "smg",
                                                     "exp": time.time() + 300}).encode()).rstrip(b"=").decode() + "."):
        with pytest.raises(openai.AuthenticationError):
            ask(jwt_node, bad)
    with pytest.raises(openai.AuthenticationError):  # the data plane is closed once JWTs are configured
        ask(jwt_node, "not-a-key")


def test_roles_from_the_token_open_the_control_plane(jwt_node, issuer):
    meta, key = issuer
    user = httpx2.get(jwt_node.url + "/workers", headers={"authorization": f"Bearer {make_token(meta, key)}"})
    assert user.status_code == 403
    ops = make_token(meta, key, roles=["ops"])
    assert httpx2.get(jwt_node.url + "/workers", headers={"authorization": f"Bearer {ops}"}).status_code == 200


def test_keys_rotated_at_the_issuer_are_fetched_when_a_token_names_one(jwt_node, issuer):
    meta, _ = issuer
    second = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    meta.keys = [*meta.keys, public_jwk(second, "k2")]
    time.sleep(0.3)  # past the node's minimum interval between key fetches (0.2 s here)
    assert ask(jwt_node, make_token(meta, second, kid="k2"))
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(openai.AuthenticationError):  # a kid the issuer never published
        ask(jwt_node, make_token(meta, stranger, kid="k9"))

"""Engines over TLS: a simulated engine serving gRPC over TLS, reached as grpcs:// through our HTTP/2
client (ALPN h2) and through grpcio, with the engines' CA; an untrusted engine is not registered."""

from __future__ import annotations

import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess

from tests.support.certs import CertAuthority
from tests.support.nodes import MODEL


@pytest.fixture(scope="module")
def tls_engine(log_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("engine-tls")
    ca = CertAuthority(directory, "engine CA")
    cert, key, _ = ca.issue("engine", "127.0.0.1")
    engine = EngineProcess(["--zero-cost", "--tls-cert-path", str(cert), "--tls-key-path", str(key)], log_dir,
                           "tls-engine")
    yield engine, ca
    engine.stop()


@pytest.mark.parametrize("grpc_client", ["h2", "grpcio"])
def test_grpcs_engines_serve_through_both_grpc_clients(tls_engine, log_dir, grpc_client):
    engine, ca = tls_engine
    url = f"grpcs://127.0.0.1:{engine.port}"
    node = NodeProcess(["--worker-urls", url, "--engine-tls-ca-path", str(ca.path), "--grpc-client", grpc_client],
                       log_dir, f"grpcs-node-{grpc_client}")
    try:
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
        reply = client.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "tls"}])
        assert reply.usage.completion_tokens == 4
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL, max_tokens=4, stream=True, messages=[{"role": "user", "content": "tls"}]) if c.choices)
        assert streamed == reply.choices[0].message.content
    finally:
        node.kill()


def test_an_engine_whose_certificate_we_do_not_trust_is_not_used(tls_engine, log_dir, http):
    engine, _ = tls_engine
    r = http.post("/workers", json={"url": f"grpcs://127.0.0.1:{engine.port}"})  # the session node: no engine CA
    assert r.status_code == 502 and "certificate" in r.json()["error"]["message"].lower(), r.text
    plain = http.post("/workers", json={"url": f"grpc://127.0.0.1:{engine.port}"})  # nor in the clear
    assert plain.status_code in (400, 502), plain.text


def test_an_https_worker_is_verified_with_the_engines_ca(engines, log_dir, tmp_path):
    """An OpenAI-compatible worker over HTTPS (here another node serving TLS): proxied when its CA is
    given, refused at registration when it is not."""
    import httpx2

    ca = CertAuthority(tmp_path, "worker CA")
    cert, key, _ = ca.issue("worker", "127.0.0.1")
    worker = NodeProcess(["--worker-urls", engines[0].url, "--tls-cert-path", str(cert), "--tls-key-path", str(key)],
                         log_dir, "https-worker")
    front = None
    try:
        front = NodeProcess(["--worker-urls", worker.url, "--engine-tls-ca-path", str(ca.path)], log_dir, "https-front")
        client = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0, timeout=30)
        reply = client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}])
        assert reply.usage.completion_tokens == 2
        with httpx2.Client(base_url=front.url, headers=front.admin_headers) as http:
            assert http.get("/workers").json()["workers"][0]["url"] == worker.url
    finally:
        for process in (front, worker):
            if process is not None:
                process.kill()

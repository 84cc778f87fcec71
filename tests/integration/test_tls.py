"""TLS for clients on the node's own HTTP server, with certificates made here: HTTPS with the openai SDK,
mutual TLS, and a renewed certificate used without a restart."""

from __future__ import annotations

import shutil
import socket
import ssl

import httpx2
import openai
import pytest
from cryptography import x509

from chaos.processes import NodeProcess

from tests.support.certs import CertAuthority
from tests.support.nodes import MODEL
from tests.support.waiting import eventually


def served_serial(url: str, ca_path, client: "tuple | None" = None) -> int:
    host, port = url.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=str(ca_path))
    if client:
        context.load_cert_chain(str(client[0]), str(client[1]))
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def test_https_with_the_sdk_and_a_renewed_certificate_without_a_restart(engines, log_dir, tmp_path):
    ca = CertAuthority(tmp_path)
    cert, key, first_serial = ca.issue("server", "127.0.0.1")
    node = NodeProcess(["--worker-urls", engines[0].url, "--tls-cert-path", str(cert), "--tls-key-path", str(key),
                        "--tls-reload-interval-secs", "0.2"], log_dir, "tls-node")
    try:
        assert node.url.startswith("https://")
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0,
                               http_client=httpx2.Client(verify=ssl.create_default_context(cafile=str(ca.path))))
        reply = client.chat.completions.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
        assert reply.usage.completion_tokens == 3
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL, max_tokens=3, stream=True, messages=[{"role": "user", "content": "hi"}]) if c.choices)
        assert streamed == reply.choices[0].message.content
        with pytest.raises(httpx2.HTTPError):  # plain HTTP to a TLS port gets no answer
            httpx2.get(node.url.replace("https://", "http://") + "/health", timeout=5)
        assert served_serial(node.url, ca.path) == first_serial
        # Renewal: new files in place (written beside, then moved, as certbot does).
        new_cert, new_key, new_serial = ca.issue("renewed", "127.0.0.1")
        shutil.move(new_key, key)
        shutil.move(new_cert, cert)
        eventually(lambda: served_serial(node.url, ca.path) == new_serial, 10,
                   "the renewed certificate was not picked up", interval_s=0.1)
        assert client.models.list().data[0].id == MODEL  # the same client goes on working
    finally:
        node.kill()


def test_mutual_tls_refuses_a_client_without_a_certificate_of_the_client_ca(engines, log_dir, tmp_path):
    ca, other_ca = CertAuthority(tmp_path, "server CA"), CertAuthority(tmp_path, "other CA")
    cert, key, _ = ca.issue("server", "127.0.0.1")
    client_cert = ca.issue("client", "client-1", server=False)
    stranger_cert = other_ca.issue("stranger", "client-2", server=False)
    node = NodeProcess(["--worker-urls", engines[0].url, "--tls-cert-path", str(cert), "--tls-key-path", str(key),
                        "--tls-client-ca-path", str(ca.path)], log_dir, "mtls-node")
    try:
        served_serial(node.url, ca.path, client_cert[:2])  # a client the CA signed: the handshake passes
        for client in (None, stranger_cert[:2]):
            with pytest.raises((ssl.SSLError, OSError, httpx2.HTTPError)):  # TLS 1.3: refused after the client's finish
                context = ssl.create_default_context(cafile=str(ca.path))
                if client:
                    context.load_cert_chain(str(client[0]), str(client[1]))
                with httpx2.Client(verify=context) as http:
                    http.get(node.url + "/health", timeout=5)
        context = ssl.create_default_context(cafile=str(ca.path))
        context.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
        with httpx2.Client(verify=context) as http:
            assert http.get(node.url + "/health", timeout=5).status_code == 200
    finally:
        node.kill()


def test_hypercorn_serves_the_same_tls_flags_and_reloads_too(engines, log_dir, tmp_path):
    ca = CertAuthority(tmp_path)
    cert, key, serial = ca.issue("server", "127.0.0.1")
    node = NodeProcess(["--worker-urls", engines[0].url, "--http-server", "hypercorn", "--tls-cert-path", str(cert),
                        "--tls-key-path", str(key), "--tls-reload-interval-secs", "0.2"], log_dir, "tls-hypercorn-node")
    try:
        url = node.url.replace("http://", "https://")  # hypercorn reports its bind as it was given
        assert served_serial(url, ca.path) == serial
        with httpx2.Client(verify=ssl.create_default_context(cafile=str(ca.path))) as http:
            assert http.get(url + "/health", timeout=5).status_code == 200
        new_cert, new_key, new_serial = ca.issue("renewed", "127.0.0.1")
        shutil.move(new_key, key)
        shutil.move(new_cert, cert)
        eventually(lambda: served_serial(url, ca.path) == new_serial, 10,
                   "hypercorn did not pick up the renewed certificate", interval_s=0.1)
    finally:
        node.kill()

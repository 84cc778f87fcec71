"""TLS to engines: ``grpcs://`` gRPC targets and ``https://`` OpenAI-compatible workers.

A gRPC target is ``host:port`` in the clear or ``grpcs://host:port`` over TLS (the
worker's canonical URL, gateway/workers/origin.py). Both gRPC clients take the same
``EngineTlsConfig``: our HTTP/2 client wraps its TCP stream in TLS with ALPN ``h2``
(gRPC requires it), grpcio gets channel credentials from the same files; HTTP
workers' client verifies with the same CA. ``--engine-tls-ca-path`` adds a CA to
trust (else the system's); ``--engine-tls-cert-path`` / ``--engine-tls-key-path``
present a client certificate to engines that require one (mutual TLS).
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path
from ..base.options import Option

TLS_TARGET_PREFIX = "grpcs://"


@dataclasses.dataclass(frozen=True)
class EngineTlsConfig:
    ca_path: Path | None = None
    cert_path: Path | None = None
    key_path: Path | None = None


def split_target(target: str) -> tuple[str, int, bool]:
    """(host, port, tls) of ``host:port`` or ``grpcs://host:port`` (IPv6 hosts without brackets)."""
    tls = target.startswith(TLS_TARGET_PREFIX)
    host, _, port = target.removeprefix(TLS_TARGET_PREFIX).rpartition(":")
    return host.strip("[]"), int(port), tls


def client_context(config: EngineTlsConfig, alpn: "list[str] | None" = None) -> ssl.SSLContext:
    """A client context that verifies the engine (the given CA, else the system's) and may present ours."""
    context = ssl.create_default_context(cafile=str(config.ca_path) if config.ca_path else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.cert_path is not None:
        context.load_cert_chain(str(config.cert_path), str(config.key_path) if config.key_path else None)
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


def grpc_credentials(config: EngineTlsConfig):
    import grpc

    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    return grpc.ssl_channel_credentials(root_certificates=read(config.ca_path), private_key=read(config.key_path),
                                        certificate_chain=read(config.cert_path))


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--engine-tls-ca-path", "engine_tls.ca_path", Path, "CA that signs grpcs:// and https:// workers' "
           "certificates (default: the system's)", "engines"),
    Option("--engine-tls-cert-path", "engine_tls.cert_path", Path, "client certificate presented to engines (mutual "
           "TLS)", "engines"),
    Option("--engine-tls-key-path", "engine_tls.key_path", Path, "its private key", "engines"),
)

"""Certificates made for a test with the cryptography package: a CA, and leaf certificates it signs."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


class CertAuthority:
    def __init__(self, directory: Path, name: str = "smg-node test CA") -> None:
        self.dir = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.path = directory / f"{name.replace(' ', '-')}.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, common_name: str, server: bool = True, client: bool = False
              ) -> tuple[Path, Path, int]:
        """(certificate path, key path, serial number) of a leaf for 127.0.0.1 and localhost; a server's,
        a client's (``server=False``), or both (a mesh member is both)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        serial = x509.random_serial_number()
        builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(serial)
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH] * server
                                                        + [ExtendedKeyUsageOID.CLIENT_AUTH] * (client or not server)),
                                  critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = self.dir / f"{stem}.pem", self.dir / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return cert_path, key_path, serial


def loopback_tls_contexts(directory: Path) -> "tuple[ssl.SSLContext, ssl.SSLContext]":
    """(the node's server context for 127.0.0.1, as ``--tls-cert-path`` builds it; a client context trusting its
    CA): what a test of our own TLS server needs."""
    from gateway.net.tls import ServerTls, TlsConfig
    authority = CertAuthority(directory)
    cert, key, _ = authority.issue("server", "127.0.0.1")
    return ServerTls(TlsConfig(cert_path=cert, key_path=key)).context, ssl.create_default_context(
        cafile=str(authority.path))

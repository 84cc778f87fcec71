"""How a node reaches the Kubernetes API server, as every Kubernetes client does.

In a pod (``KUBERNETES_SERVICE_HOST`` set): the service account's token and CA under
``/var/run/secrets/kubernetes.io/serviceaccount``; the token is projected and rotated by the kubelet
(about hourly), so it is read again whenever its file changes rather than once. Otherwise a kubeconfig
(``KUBECONFIG``, first file of the list, else ``~/.kube/config``): its current context's cluster (server,
certificate-authority[-data], insecure-skip-tls-verify) and user (token, tokenFile, client certificate and key,
as files or data). Exec and auth-provider plugins are not run: a node runs no programs a config file names.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

from .pods import host_in_url

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialsError(ValueError):
    pass


class TokenFile:
    """A bearer token read from a file, and read again when the file changes (its mtime or size)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._token = ""

    def token(self) -> str:
        try:
            stat = self.path.stat()
        except OSError as e:
            raise CredentialsError(f"token file {self.path}: {e.strerror}") from None
        if (stat.st_mtime_ns, stat.st_size) != self._seen:
            self._token = self.path.read_text().strip()
            self._seen = (stat.st_mtime_ns, stat.st_size)
        return self._token


@dataclasses.dataclass
class KubeCredentials:
    server: str  # https://host:port
    ssl_context: ssl.SSLContext | bool  # False only when the kubeconfig says insecure-skip-tls-verify
    token_file: TokenFile | None = None
    token: str | None = None
    namespace: str | None = None  # the pod's own namespace (in the cluster), or the context's
    source: str = ""

    def headers(self) -> dict[str, str]:
        token = self.token_file.token() if self.token_file is not None else self.token
        return {"authorization": f"Bearer {token}"} if token else {}


def load_credentials(environ: "dict[str, str] | None" = None, service_account_dir: Path = SERVICE_ACCOUNT_DIR,
                     home: "Path | None" = None) -> KubeCredentials:
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if host and (service_account_dir / "token").exists():
        return in_cluster(host, port, service_account_dir)
    paths = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    path = Path(paths[0]) if paths else (home or Path.home()) / ".kube" / "config"
    if not path.exists():
        raise CredentialsError("--service-discovery: not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST and "
                               f"service account token) and no kubeconfig at {path} (set KUBECONFIG)")
    return from_kubeconfig(path)


def in_cluster(host: str, port: str, directory: Path) -> KubeCredentials:
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    namespace_file = directory / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.exists() else None
    return KubeCredentials(f"https://{host_in_url(host)}:{port}", context, TokenFile(directory / "token"),
                           namespace=namespace, source=f"service account ({directory})")


def _named(entries: Any, name: str, what: str, path: Path) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(what) or {}
    raise CredentialsError(f"kubeconfig {path}: no {what} named {name!r}")


def _material(section: dict[str, Any], key: str, base: Path) -> "tuple[Path | None, bytes | None]":
    """A file (``key``, relative to the kubeconfig's directory) or inline base64 (``key-data``)."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return None, base64.b64decode(data)
        except ValueError:
            raise CredentialsError(f"kubeconfig: {key}-data is not base64") from None
    file = section.get(key)
    return ((base / file) if file else None), None


def from_kubeconfig(path: Path) -> KubeCredentials:
    import yaml  # only a kubeconfig needs it

    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise CredentialsError(f"kubeconfig {path}: {e}") from None
    name = config.get("current-context")
    if not name:
        raise CredentialsError(f"kubeconfig {path}: no current-context")
    context = _named(config.get("contexts"), name, "context", path)
    cluster = _named(config.get("clusters"), context.get("cluster"), "cluster", path)
    user = _named(config.get("users"), context.get("user"), "user", path) if context.get("user") else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise CredentialsError(f"kubeconfig {path}: cluster {context.get('cluster')!r} has no https:// server")
    base = path.parent
    ssl_context: ssl.SSLContext | bool = False
    if server.startswith("https://"):
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context = False
        else:
            ca_file, ca_data = _material(cluster, "certificate-authority", base)
            ssl_context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None,
                                                     cadata=ca_data.decode() if ca_data else None)
            cert_file, cert_data = _material(user, "client-certificate", base)
            key_file, key_data = _material(user, "client-key", base)
            if cert_file or cert_data:
                _load_client_certificate(ssl_context, cert_file, cert_data, key_file, key_data)
    if user.get("exec") or user.get("auth-provider"):
        raise CredentialsError(f"kubeconfig {path}: user {context.get('user')!r} authenticates through a plugin "
                               "(exec/auth-provider), which smg-node does not run; give it a token or a client "
                               "certificate")
    token_file = Path(base / user["tokenFile"]) if user.get("tokenFile") else None
    return KubeCredentials(server.rstrip("/"), ssl_context, TokenFile(token_file) if token_file else None,
                           token=user.get("token"), namespace=context.get("namespace"),
                           source=f"kubeconfig {path} (context {name})")


def _load_client_certificate(context: ssl.SSLContext, cert_file: Path | None, cert_data: bytes | None,
                             key_file: Path | None, key_data: bytes | None) -> None:
    # ssl loads certificates from files only: inline data goes through a private temporary file, removed at once.
    with tempfile.TemporaryDirectory() as tmp:
        if cert_data is not None:
            cert_file = Path(tmp) / "cert.pem"
            cert_file.write_bytes(cert_data)
        if key_data is not None:
            key_file = Path(tmp) / "key.pem"
            key_file.write_bytes(key_data)
        context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)

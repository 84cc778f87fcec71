"""A worker URL is an origin: scheme, host, port. Pure parsing and the registration allowlist; no I/O.

Why nothing else: a path, query or fragment on a worker URL was appended to
every forwarded request, so a "worker" pointed at ``http://127.0.0.1:7373/v1/leave?``
turned one chat request into a call to the node's own admin endpoint. A worker
is reached only at the paths the gateway chooses. User info
(``http://user:pass@host``) is refused too: credentials for a worker are the
operator's to configure, never part of an identifier that is shown and replicated.

    grpc://host:port    SGLang / vLLM gRPC (port required)
    grpcs://host:port   the same over TLS (gateway/engine/engine_tls.py)
    http://host[:port]  OpenAI-compatible HTTP (80 by default)
    https://host[:port] the same over TLS (443 by default)

The canonical form (lower-case scheme and host, explicit port, no trailing
slash) names the worker: its id is derived from it, so ``http://H`` and
``http://h:80/`` are one worker.

Allowlist (``--worker-allowed-hosts``): when set, a registration must name a
host in it, given as exact host names or networks (``10.0.0.0/8``,
``::1/128``). A host name is matched by name only: resolving it here and
connecting later could see different addresses (DNS rebinding), so allow
networks for IP literals and names for names.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import urllib.parse
from ..base.options import Option

SCHEMES = {"grpc": None, "grpcs": None, "http": 80, "https": 443}  # scheme -> default port (None: required)


class WorkerUrlError(ValueError):
    """The URL is not an origin we can register (the message says why)."""


class WorkerNotAllowed(ValueError):
    """The origin is well formed but its host is outside --worker-allowed-hosts."""


@dataclasses.dataclass(frozen=True)
class WorkerOrigin:
    scheme: str
    host: str  # lower case; IPv6 without brackets
    port: int

    @property
    def kind(self) -> str:
        return "grpc" if self.scheme in ("grpc", "grpcs") else "http"

    @property
    def grpc_target(self) -> str:
        """What the gRPC clients connect to: host:port, or grpcs://host:port over TLS."""
        return self.url if self.scheme == "grpcs" else self.netloc

    @property
    def netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.netloc}"


def parse_worker_origin(url: str) -> WorkerOrigin:
    try:
        parsed = urllib.parse.urlsplit(url.strip())
        port = parsed.port
    except ValueError as e:
        raise WorkerUrlError(f"not a URL: {e}") from None
    scheme = parsed.scheme.lower()
    if scheme not in SCHEMES:
        raise WorkerUrlError("a worker URL starts with grpc://, grpcs://, http:// or https://")
    if parsed.username is not None or parsed.password is not None:
        raise WorkerUrlError("a worker URL carries no user or password")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment or "?" in url or "#" in url:
        raise WorkerUrlError("a worker URL is scheme://host:port, with no path, query or fragment")
    host = (parsed.hostname or "").lower()
    if not host or any(c.isspace() or c in "/\\@%" for c in host):
        raise WorkerUrlError("a worker URL needs a host")
    if port is None:
        port = SCHEMES[scheme]
        if port is None:
            raise WorkerUrlError(f"a {scheme}:// worker URL needs a port")
    if not 0 < port < 65536:
        raise WorkerUrlError("the port must be between 1 and 65535")
    return WorkerOrigin(scheme, host, port)


class WorkerAllowlist:
    """Which hosts workers may be registered at; everything when built from nothing."""

    def __init__(self, entries: "tuple[str, ...] | list[str]" = ()) -> None:
        self.names: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in entries:
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                if not entry or "/" in entry:
                    raise ValueError(f"--worker-allowed-hosts: {entry!r} is neither a host name nor a network") \
                        from None
                self.names.add(entry.lower())
        self.open = not entries

    def check(self, origin: WorkerOrigin) -> None:
        if self.open or origin.host in self.names:
            return
        try:
            address = ipaddress.ip_address(origin.host)
        except ValueError:
            raise WorkerNotAllowed(f"the host {origin.host} is not in --worker-allowed-hosts") from None
        if not any(address in network for network in self.networks):
            raise WorkerNotAllowed(f"the address {origin.host} is not in --worker-allowed-hosts")


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--worker-allowed-hosts", "worker_allowed_hosts", "list", "hosts (names or networks like 10.0.0.0/8) "
           "where workers may be registered; default: any", "security"),
)

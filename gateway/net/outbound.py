"""Outbound requests a client's input makes the node send (image fetches, MCP servers): only where the operator
allows, never into the node's own network unless listed.

``HostPolicy`` is an allowlist (``--media-allowed-hosts``, ``--mcp-allowed-hosts``): host names
(``api.example.com``), domains (``.example.com``: the domain and its subdomains) and networks (``203.0.113.0/24``).
A URL passes (``checked``) when its host is a listed name or an address inside a listed network, and every address
the name resolves to is a public one or inside a listed network: an allowed name that resolves, or is rebound, to
a private, loopback, link-local, multicast or reserved address gets nothing. The connection then goes to the
address that was checked (a second lookup cannot swap it); ``PinnedTransport`` does this for every request an
httpx2 client sends, redirects included, so code we do not own (the MCP SDK) cannot reach elsewhere.

Errors: ``OutboundRefused`` (the client's 400: code ``invalid_url`` for what is no http(s) URL, ``url_not_allowed``
for what the policy refuses), ``OutboundUnresolved`` (the name does not resolve).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import urllib.parse

import httpx2
import trio

from ..base.errors import InvalidInput

SCHEMES = ("http", "https")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class OutboundRefused(InvalidInput):
    """A URL the policy does not let the node reach."""


class OutboundUnresolved(InvalidInput):
    """A host name that does not resolve."""


class HostPolicy:
    """Where outbound requests may go: names, .domains and networks (``flag`` names the option, for errors)."""

    def __init__(self, allowed: "tuple[str, ...]", flag: str = "--media-allowed-hosts") -> None:
        self.flag = flag
        self.names: set[str] = set()
        self.domains: list[str] = []
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in allowed:
            entry = entry.strip().lower().rstrip(".")
            if not entry:
                continue
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            if entry.startswith("."):
                self.domains.append(entry)
            elif all(part and all(c.isalnum() or c == "-" for c in part) for part in entry.split(".")):
                self.names.add(entry)
            else:
                raise ValueError(f"{flag}: {entry!r} is neither a host name, a .domain nor a network")

    @property
    def allows_anything(self) -> bool:
        return bool(self.names or self.domains or self.networks)

    def name_listed(self, host: str) -> bool:
        return host in self.names or any(host.endswith(domain) or host == domain[1:] for domain in self.domains)

    def address_allowed(self, address: Address, name_listed: bool) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        if any(address in network for network in self.networks):
            return True
        if not address.is_global or address.is_multicast:  # private, loopback, link-local, reserved, ...
            return False
        return name_listed

    async def checked(self, url: str, what: str = "outbound URL") -> "Target":
        """Where ``url`` may be reached: its host, the checked address to connect to, its port; else
        OutboundRefused (or OutboundUnresolved). ``what`` names the URL's use in errors ("image URL")."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise OutboundRefused(f"{shown(url)} is not a URL", code="invalid_url") from None
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise OutboundRefused(f"only http(s) {what}s are reached, not {shown(url)}", code="invalid_url")
        if parts.username or parts.password:
            raise OutboundRefused(f"{what}s with credentials in them are not reached", code="invalid_url")
        host = parts.hostname.lower().rstrip(".")
        listed = self.name_listed(host)
        try:
            addresses: list[Address] = [ipaddress.ip_address(host)]
        except ValueError:
            if not listed:
                raise OutboundRefused(f"{host} is not among the hosts this node may reach for an {what} "
                                      f"({self.flag})", code="url_not_allowed") from None
            try:
                infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
            except OSError:
                raise OutboundUnresolved(f"{host} does not resolve", code="unresolved") from None
            addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
        if not addresses or not all(self.address_allowed(a, listed) for a in addresses):
            raise OutboundRefused(f"{host} is not a host this node may reach for an {what}: an address it resolves "
                                  f"to is private, loopback or link-local, or not in an allowed network ({self.flag})",
                                  code="url_not_allowed")
        address = addresses[0]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # reached as what it is: [::ffff:127.0.0.2] is 127.0.0.2
        return Target(host, address, port, parts.scheme)


@dataclasses.dataclass(frozen=True)
class Target:
    host: str
    address: Address
    port: int
    scheme: str

    @property
    def netloc(self) -> str:
        """The checked address and port, as a URL's authority."""
        ip = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{ip}:{self.port}"

    def host_header(self) -> str:
        shown_host = f"[{self.host}]" if ":" in self.host else self.host
        return shown_host if (self.scheme, self.port) in (("http", 80), ("https", 443)) else f"{shown_host}:{self.port}"


class PinnedTransport(httpx2.AsyncHTTPTransport):
    """An httpx2 transport that sends each request only where ``policy`` allows, to the address it checked (the
    Host header and the TLS server name stay the URL's), and never through a proxy from the environment."""

    def __init__(self, policy: HostPolicy, what: str = "outbound URL", **kwargs) -> None:
        super().__init__(trust_env=False, **kwargs)
        self.policy = policy
        self.what = what

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            target = await self.policy.checked(str(request.url), self.what)
        except (OutboundRefused, OutboundUnresolved) as e:
            raise httpx2.ConnectError(str(e), request=request) from None
        # host and port, not netloc: httpx2 splits a netloc at its first colon ("[::1]:80": "Invalid port").
        request.url = request.url.copy_with(host=str(target.address), port=target.port)
        request.headers["host"] = target.host_header()
        if target.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": target.host}
        return await super().handle_async_request(request)


def shown(url: str) -> str:
    """A URL as an error message may repeat it: without its query, cut short."""
    return url.split("?", 1)[0][:200]

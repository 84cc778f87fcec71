"""Fetching the images a request names, as an outbound request the operator allows and nothing more.

A ``data:`` URI (base64) needs no fetch. An ``http(s)`` URL is fetched only when ``HostPolicy`` allows it:
its host is a listed name (``images.example.com``, or ``.example.com`` for the domain and its subdomains)
or an address inside a listed network; and every address the name resolves to is a public one, or inside
a listed network (so an allowed name that resolves, or is rebound, to a private, loopback, link-local,
multicast or reserved address gets nothing). The connection goes to the address that was checked (the
request's Host header and TLS server name stay the URL's), so a second lookup cannot swap it. Redirects
are not followed by the client: each Location is checked as the first URL was, at most ``redirects_max``
of them. The whole fetch is bounded in time, the body in bytes (read no further than the bound), and no
proxy from the environment is used (it would connect where we did not check).

Errors: ``FetchRefused`` (the URL is not one this node fetches: 400 with the reason), ``FetchFailed`` (the
server did not give an image: 400 naming its status, or 504 for a timeout).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import urllib.parse

import httpx2
import trio

from ..errors import InvalidInput, TimedOut

SCHEMES = ("http", "https")
REDIRECTS = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "smg-node (image fetch)"


class FetchRefused(InvalidInput):
    """A URL this node does not fetch."""


class FetchFailed(InvalidInput):
    """The server did not give the image."""


class FetchTimedOut(TimedOut):
    """The image did not arrive in time."""


class HostPolicy:
    """Where image fetches may go (``--media-allowed-hosts``): names, .domains and networks."""

    def __init__(self, allowed: "tuple[str, ...]") -> None:
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
                raise ValueError(f"--media-allowed-hosts: {entry!r} is neither a host name, a .domain nor a network")

    @property
    def fetches_anything(self) -> bool:
        return bool(self.names or self.domains or self.networks)

    def name_listed(self, host: str) -> bool:
        return host in self.names or any(host.endswith(domain) or host == domain[1:] for domain in self.domains)

    def address_allowed(self, address: "ipaddress.IPv4Address | ipaddress.IPv6Address", name_listed: bool) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        if any(address in network for network in self.networks):
            return True
        if not address.is_global or address.is_multicast:  # private, loopback, link-local, reserved, ...
            return False
        return name_listed


def data_uri_bytes(url: str, bytes_max: int) -> bytes:
    """The bytes of a base64 ``data:`` URI (``data:image/png;base64,...``), bounded before they are decoded."""
    head, sep, payload = url.partition(",")
    if not sep or not head.lower().endswith(";base64"):
        raise FetchRefused("a data: URI must be base64 (data:<mime>;base64,<data>)", code="invalid_image_url")
    if len(payload) * 3 // 4 > bytes_max:
        raise FetchRefused(f"the image is larger than {bytes_max} bytes", code="image_too_large")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise FetchRefused("the data: URI is not valid base64", code="invalid_image_url") from None


class Fetcher:
    def __init__(self, policy: HostPolicy, timeout_s: float, redirects_max: int, bytes_max: int,
                 client: httpx2.AsyncClient | None = None) -> None:
        self.policy = policy
        self.timeout_s = timeout_s
        self.redirects_max = redirects_max
        self.bytes_max = bytes_max
        # No proxy from the environment, no redirects followed by the client: this module checks every hop.
        self._client = client or httpx2.AsyncClient(trust_env=False, follow_redirects=False, timeout=timeout_s,
                                                    limits=httpx2.Limits(max_connections=64))

    async def aclose(self) -> None:
        await self._client.aclose()

    async def fetch(self, url: str) -> bytes:
        """The body at ``url`` (http or https), every hop checked; FetchRefused, FetchFailed, FetchTimedOut."""
        if not self.policy.fetches_anything:
            raise FetchRefused("this node fetches no image URLs (--media-allowed-hosts lists none): send the image "
                               "as a data: URI", code="image_url_not_allowed")
        try:
            with trio.fail_after(self.timeout_s):
                for _ in range(self.redirects_max + 1):
                    location = await self._hop(url)
                    if location is None or isinstance(location, bytes):
                        return location
                    url = location
        except trio.TooSlowError:
            raise FetchTimedOut(f"the image at {_shown(url)} did not arrive within {self.timeout_s:g} s",
                                code="image_fetch_timeout") from None
        raise FetchFailed(f"more than {self.redirects_max} redirects", code="image_fetch_failed")

    async def _hop(self, url: str) -> "bytes | str":
        """One request: the body, or the next URL to try (a redirect's Location, resolved)."""
        target, host, address, port = await self._checked(url)
        headers = {"host": _host_header(host, port, urllib.parse.urlsplit(url).scheme), "user-agent": USER_AGENT,
                   "accept": "image/*"}
        extensions = {"sni_hostname": host} if target.startswith("https") else {}
        try:
            async with self._client.stream("GET", target, headers=headers, extensions=extensions) as response:
                if response.status_code in REDIRECTS:
                    location = response.headers.get("location")
                    if not location:
                        raise FetchFailed(f"{_shown(url)} redirected without a Location", code="image_fetch_failed")
                    return urllib.parse.urljoin(url, location)
                if response.status_code != 200:
                    raise FetchFailed(f"{_shown(url)} answered {response.status_code}", code="image_fetch_failed")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > self.bytes_max:
                    raise FetchRefused(f"the image at {_shown(url)} is larger than {self.bytes_max} bytes",
                                       code="image_too_large")
                parts, size = [], 0
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > self.bytes_max:
                        raise FetchRefused(f"the image at {_shown(url)} is larger than {self.bytes_max} bytes",
                                           code="image_too_large")
                    parts.append(chunk)
                return b"".join(parts)
        except httpx2.HTTPError as e:
            raise FetchFailed(f"the image at {_shown(url)} could not be fetched: {type(e).__name__}",
                              code="image_fetch_failed") from None

    async def _checked(self, url: str) -> tuple[str, str, str, int]:
        """(the URL to request, aimed at a checked address; the host; that address; the port)."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise FetchRefused(f"{_shown(url)} is not a URL", code="invalid_image_url") from None
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise FetchRefused(f"only http(s) URLs and data: URIs are fetched, not {_shown(url)}",
                               code="invalid_image_url")
        if parts.username or parts.password:
            raise FetchRefused("image URLs with credentials are not fetched", code="invalid_image_url")
        host = parts.hostname.lower().rstrip(".")
        listed = self.policy.name_listed(host)
        try:
            literal = ipaddress.ip_address(host)
            addresses = [literal]
        except ValueError:
            if not listed:
                raise FetchRefused(f"{host} is not among the hosts images may be fetched from "
                                   "(--media-allowed-hosts)", code="image_url_not_allowed") from None
            try:
                infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
            except OSError:
                raise FetchFailed(f"{host} does not resolve", code="image_fetch_failed") from None
            addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
        if not addresses or not all(self.policy.address_allowed(a, listed) for a in addresses):
            raise FetchRefused(f"{host} is not a host images may be fetched from: an address it resolves to is "
                               "private, loopback or link-local, or not in an allowed network",
                               code="image_url_not_allowed")
        address = addresses[0]
        ip = f"[{address}]" if address.version == 6 else str(address)
        target = urllib.parse.urlunsplit((parts.scheme, f"{ip}:{port}", parts.path or "/", parts.query, ""))
        return target, host, str(address), port


def _host_header(host: str, port: int, scheme: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if (scheme, port) in (("http", 80), ("https", 443)) else f"{shown}:{port}"


def _shown(url: str) -> str:
    """A URL as an error message may repeat it: without its query, cut short."""
    return url.split("?", 1)[0][:200]

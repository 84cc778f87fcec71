"""Fetching the images a request names, as an outbound request the operator allows and nothing more.

A ``data:`` URI (base64) needs no fetch. An ``http(s)`` URL is fetched only when ``HostPolicy`` allows it:
its host is a listed name (``images.example.com``, or ``.example.com`` for the domain and its subdomains)
or an address inside a listed network; and every address the name resolves to is a public one, or inside
a listed network (so an allowed name that resolves, or is rebound, to a private, loopback, link-local,
multicast or reserved address gets nothing). The connection goes to the address that was checked (the
request's Host header and TLS server name stay the URL's), so a second lookup cannot swap it. Redirects
are not followed by the client: each Location is checked as the first URL was, at most ``redirects_max``
of them. The whole fetch is bounded in time, the body in bytes (read no further than the bound), and no
proxy from the environment is used (it would connect where we did not check). The bytes are reported as they
arrive (``on_bytes``: a declared Content-Length at once, then what goes past it), so the request's total over
all its images is checked against what is in flight, not what finished.

Errors: ``FetchRefused`` (the URL is not one this node fetches: 400 with the reason), ``FetchFailed`` (the
server did not give an image: 400 naming its status, or 504 for a timeout).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx2
import trio

from ..base.errors import InvalidInput, TimedOut
from ..net.outbound import HostPolicy, OutboundRefused, OutboundUnresolved, Target
from ..net.outbound import shown as _shown

REDIRECTS = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "smg-node (image fetch)"


class FetchRefused(InvalidInput):
    """A URL this node does not fetch."""


class FetchFailed(InvalidInput):
    """The server did not give the image."""


class FetchTimedOut(TimedOut):
    """The image did not arrive in time."""


def data_uri_bytes(url: str, bytes_max: int, noun: str = "image") -> bytes:
    """The bytes of a base64 ``data:`` URI (``data:image/png;base64,...``), bounded before they are decoded."""
    head, sep, payload = url.partition(",")
    if not sep or not head.lower().endswith(";base64"):
        raise FetchRefused("a data: URI must be base64 (data:<mime>;base64,<data>)", code=f"invalid_{noun}_url")
    if len(payload) * 3 // 4 > bytes_max:
        raise FetchRefused(f"the {noun} is larger than {bytes_max} bytes", code=f"{noun}_too_large")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise FetchRefused("the data: URI is not valid base64", code=f"invalid_{noun}_url") from None


class Fetcher:
    def __init__(self, policy: HostPolicy, timeout_s: float, redirects_max: int, bytes_max: int,
                 client: httpx2.AsyncClient | None = None, connections_max: int = 64) -> None:
        self.policy = policy
        self.timeout_s = timeout_s
        self.redirects_max = redirects_max
        self.bytes_max = bytes_max
        # No proxy from the environment, no redirects followed by the client: this module checks every hop.
        self._client = client or httpx2.AsyncClient(trust_env=False, follow_redirects=False, timeout=timeout_s,
                                                    limits=httpx2.Limits(max_connections=connections_max))

    async def aclose(self) -> None:
        await self._client.aclose()

    async def fetch(self, url: str, on_bytes: "Callable[[int], None]" = lambda n: None,
                    slot: "contextlib.AbstractAsyncContextManager[Any] | None" = None, bytes_max: int | None = None,
                    noun: str = "image") -> bytes:
        """The body at ``url`` (http or https), every hop checked; FetchRefused, FetchFailed, FetchTimedOut.
        ``on_bytes`` is told of the body's bytes as they come (and may raise to stop the fetch). ``slot``: held
        for the fetch, its wait within the fetch's time (a fetch that waited its whole time for a connection
        times out like one whose server was slow). ``bytes_max``: this body's bound (the fetcher's by default);
        ``noun``: what it is, as errors say it ("image", "video")."""
        if not self.policy.allows_anything:
            raise FetchRefused(f"this node fetches no {noun} URLs (--media-allowed-hosts lists none): send the "
                               f"{noun} as a data: URI", code=f"{noun}_url_not_allowed")
        try:
            with trio.fail_after(self.timeout_s):
                async with slot or contextlib.nullcontext():
                    return await self._hops(url, on_bytes, bytes_max or self.bytes_max, noun)
        except trio.TooSlowError:
            raise FetchTimedOut(f"the {noun} at {_shown(url)} did not arrive within {self.timeout_s:g} s",
                                code=f"{noun}_fetch_timeout") from None

    async def _hops(self, url: str, on_bytes: "Callable[[int], None]", bytes_max: int, noun: str) -> bytes:
        """The first hop that gives a body, following at most redirects_max redirects."""
        for _ in range(self.redirects_max + 1):
            location = await self._hop(url, on_bytes, bytes_max, noun)
            if isinstance(location, bytes):
                return location
            url = location
        raise FetchFailed(f"more than {self.redirects_max} redirects", code=f"{noun}_fetch_failed")

    async def _hop(self, url: str, on_bytes: "Callable[[int], None]", bytes_max: int, noun: str) -> "bytes | str":
        """One request: the body, or the next URL to try (a redirect's Location, resolved)."""
        target_url, target = await self._checked(url, noun)
        headers = {"host": target.host_header(), "user-agent": USER_AGENT, "accept": f"{noun}/*"}
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        try:
            async with self._client.stream("GET", target_url, headers=headers, extensions=extensions) as response:
                if response.status_code in REDIRECTS:
                    location = response.headers.get("location")
                    if not location:
                        raise FetchFailed(f"{_shown(url)} redirected without a Location", code=f"{noun}_fetch_failed")
                    return urllib.parse.urljoin(url, location)
                if response.status_code != 200:
                    raise FetchFailed(f"{_shown(url)} answered {response.status_code}", code=f"{noun}_fetch_failed")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > bytes_max:
                    raise FetchRefused(f"the {noun} at {_shown(url)} is larger than {bytes_max} bytes",
                                       code=f"{noun}_too_large")
                counted = int(declared) if declared is not None and declared.isdigit() else 0
                if counted:
                    on_bytes(counted)  # what is on its way, before it is read
                parts, size = [], 0
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > bytes_max:
                        raise FetchRefused(f"the {noun} at {_shown(url)} is larger than {bytes_max} bytes",
                                           code=f"{noun}_too_large")
                    if size > counted:
                        on_bytes(size - counted)
                        counted = size
                    parts.append(chunk)
                if size < counted:
                    on_bytes(size - counted)  # a body shorter than it said
                return b"".join(parts)
        except httpx2.HTTPError as e:
            raise FetchFailed(f"the {noun} at {_shown(url)} could not be fetched: {type(e).__name__}",
                              code=f"{noun}_fetch_failed") from None

    async def _checked(self, url: str, noun: str) -> tuple[str, Target]:
        """(the URL to request, aimed at the checked address; where that is)."""
        try:
            target = await self.policy.checked(url, f"{noun} URL")
        except OutboundUnresolved as e:
            raise FetchFailed(e.message, code=f"{noun}_fetch_failed") from None
        except OutboundRefused as e:
            raise FetchRefused(e.message, code=f"invalid_{noun}_url" if e.code == "invalid_url"
                               else f"{noun}_url_not_allowed") from None
        parts = urllib.parse.urlsplit(url)
        target_url = urllib.parse.urlunsplit((parts.scheme, target.netloc, parts.path or "/", parts.query, ""))
        return target_url, target

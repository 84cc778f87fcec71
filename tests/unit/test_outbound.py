"""Outbound requests a client's input makes (image fetches, MCP servers): which addresses the policy lets the node
reach, and that an httpx2 client on PinnedTransport reaches only those, to the address checked (a real server
on 127.0.0.2, allowed as a network; 127.0.0.3 is not)."""

from __future__ import annotations

import http.server
import ipaddress
import threading

import httpx2
import pytest

from gateway.net.outbound import HostPolicy, OutboundRefused, PinnedTransport


@pytest.mark.parametrize("allowed, host, address, ok", [
    ((), "img.example.com", "93.184.216.34", False),  # nothing listed: nothing fetched
    (("img.example.com",), "img.example.com", "93.184.216.34", True),
    (("img.example.com",), "other.example.com", "93.184.216.34", False),
    ((".example.com",), "a.b.example.com", "93.184.216.34", True),
    ((".example.com",), "example.com", "93.184.216.34", True),
    ((".example.com",), "evil-example.com", "93.184.216.34", False),
    (("img.example.com",), "img.example.com", "127.0.0.1", False),  # a listed name that resolves to loopback
    (("img.example.com",), "img.example.com", "10.1.2.3", False),  # or to a private address
    (("img.example.com",), "img.example.com", "169.254.169.254", False),  # or to link-local (cloud metadata)
    (("img.example.com",), "img.example.com", "::1", False),
    (("img.example.com",), "img.example.com", "::ffff:127.0.0.1", False),  # loopback written as IPv6
    (("img.example.com",), "img.example.com", "fe80::1", False),
    (("img.example.com",), "img.example.com", "224.0.0.1", False),  # multicast
    (("img.example.com",), "img.example.com", "0.0.0.0", False),
    (("img.example.com", "10.0.0.0/8"), "img.example.com", "10.1.2.3", True),  # a listed network allows it
    (("10.0.0.0/8",), "10.9.9.9", "10.9.9.9", True),
    (("10.0.0.0/8",), "10.9.9.9", "11.0.0.1", False),
])
def test_where_an_outbound_request_may_go(allowed, host, address, ok):
    policy = HostPolicy(allowed)
    listed = policy.name_listed(host)
    assert (policy.allows_anything and policy.address_allowed(ipaddress.ip_address(address), listed)) is ok


def test_a_policy_refuses_what_is_not_a_host_a_domain_or_a_network():
    for bad in ("http://x", "a b", "x/y", "*.example.com"):
        with pytest.raises(ValueError):
            HostPolicy((bad,))


async def test_checked_urls_and_the_reasons_for_refusals():
    policy = HostPolicy(("127.0.0.2/32", "example.invalid"), "--mcp-allowed-hosts")
    target = await policy.checked("http://127.0.0.2:8080/mcp")
    assert (str(target.address), target.port, target.netloc, target.host_header()) == \
        ("127.0.0.2", 8080, "127.0.0.2:8080", "127.0.0.2:8080")
    for url, code in (("ftp://127.0.0.2/x", "invalid_url"), ("http://user:pw@127.0.0.2/", "invalid_url"),
                      ("http://127.0.0.3/", "url_not_allowed"), ("http://localhost/", "url_not_allowed"),
                      ("http://[::1]/", "url_not_allowed"), ("not a url", "invalid_url")):
        with pytest.raises(OutboundRefused) as e:
            await policy.checked(url, "MCP server URL")
        assert e.value.code == code, url
    assert "--mcp-allowed-hosts" in str(await _refusal(policy, "http://127.0.0.3/"))


async def _refusal(policy: HostPolicy, url: str) -> OutboundRefused:
    try:
        await policy.checked(url)
    except OutboundRefused as e:
        return e
    raise AssertionError(f"{url} was allowed")


@pytest.fixture
def servers():
    """Two real HTTP servers: 127.0.0.2 answers with the Host header it got; 127.0.0.3 redirects to 127.0.0.3."""
    started = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/away":
                self.send_response(307)
                self.send_header("location", f"http://127.0.0.3:{started[1].server_address[1]}/")
                self.end_headers()
                return
            body = self.headers.get("host", "").encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    for host in ("127.0.0.2", "127.0.0.3"):
        server = http.server.ThreadingHTTPServer((host, 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
    yield [s.server_address[1] for s in started]
    for server in started:
        server.shutdown()


async def test_a_pinned_client_reaches_only_what_the_policy_allows(servers):
    allowed_port, other_port = servers
    client = httpx2.AsyncClient(transport=PinnedTransport(HostPolicy(("127.0.0.2/32",))), follow_redirects=True)
    async with client:
        answer = await client.get(f"http://127.0.0.2:{allowed_port}/")
        assert answer.status_code == 200 and answer.text == f"127.0.0.2:{allowed_port}"
        with pytest.raises(httpx2.ConnectError, match="not among|not a host"):
            await client.get(f"http://127.0.0.3:{other_port}/")
        # A redirect out of the allowed hosts is checked as the first URL was: refused.
        with pytest.raises(httpx2.ConnectError):
            await client.get(f"http://127.0.0.2:{allowed_port}/away")
        # An allowed address spelled as IPv4-mapped IPv6 is reached (it failed with "Invalid port": issue 59), as
        # the IPv4 address it is, with the URL's own Host header.
        answer = await client.get(f"http://[::ffff:127.0.0.2]:{allowed_port}/")
        assert answer.status_code == 200 and answer.text == f"[::ffff:127.0.0.2]:{allowed_port}"

"""The console: a read-only web page every node serves (``/console``) showing the cluster as this node sees it,
live, behind the admin credential (issue 62).

    GET /console         the page (HTML, its script inline; nothing of the cluster in it)
    GET /console/state   what the page shows, as JSON: this node, the members and their state, the workers with
                         health, circuit, load and models, the routed models and their cooldowns, the rate limits,
                         the last error answers

Both need an admin credential, as a bearer token (curl, scripts) or as HTTP Basic's password (any user name): a
browser asks for it once (``WWW-Authenticate: Basic``) and sends it again with the page's own requests. The page
polls the state every second, so a member's death or a worker's circuit opening shows without a reload. Nothing
on the page changes the cluster: there is no control here, by design (the CLI and the admin API do that).
"""

from __future__ import annotations

import base64
import binascii
import importlib.resources
import os
import time
from typing import Any

import trio

from mesh import member_json  # the mesh's one rendering of a member, as `smg-node members --json` shows it

from ...auth import Authenticator
from ..errors import Forbidden, Unauthorized
from ..http import Request
from ..state import GatewayState

_PAGE = importlib.resources.files(__package__).joinpath("console.html").read_bytes()
_SECURITY_HEADERS = [
    # The page runs its own inline script and fetches from this origin only; it is never framed.
    (b"content-security-policy", b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                 b"connect-src 'self'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"), (b"cache-control", b"no-store")]
ERRORS_SHOWN_MAX = 50


class ConsoleUnauthorized(Unauthorized):
    """A 401 a browser answers with its credential dialog."""

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"www-authenticate", b'Basic realm="smg-node console", charset="UTF-8"')]


def _credential(request: Request) -> str | None:
    """The presented credential: a bearer token, or HTTP Basic's password."""
    value = request.headers.get(b"authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(b" ")
    if scheme.lower() == b"basic":
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return ""
        return decoded.partition(":")[2]
    return Authenticator.credential(request.headers)


def _admit(state: GatewayState, request: Request) -> None:
    credential = _credential(request)
    principal = state.authenticator.lookup(credential) if credential else None
    if principal is None:
        raise ConsoleUnauthorized("the console needs an admin credential (the admin token as the password)",
                                  code="missing_api_key" if credential is None else "invalid_api_key")
    if not principal.is_admin:
        raise Forbidden(f"the key '{principal.name}' has the role user; the console needs the role admin",
                        code="insufficient_role")


async def page(state: GatewayState, request: Request) -> None:
    _admit(state, request)
    await request.send_bytes(200, _PAGE, [(b"content-type", b"text/html; charset=utf-8"), *_SECURITY_HEADERS])


def _members(state: GatewayState) -> list[dict[str, Any]]:
    cluster = state.cluster
    if cluster is None or cluster.agent is None:
        return [{"name": "this node (no mesh)", "address": state.status.own_url, "state": "alive", "tags": {}}]
    return [member_json(m) for m in sorted(cluster.agent.members(), key=lambda m: m.name)]


def _routes(state: GatewayState) -> dict[str, Any]:
    providers = getattr(state, "providers", None)
    if providers is None:
        return {}
    return providers.routes.describe(providers.cooldowns.cooling_targets(providers.now()))


def snapshot(state: GatewayState) -> dict[str, Any]:
    """What the page shows (``/console/state``)."""
    now = trio.current_time()
    limiter = state.rate_limiter
    settings = state.settings
    return {
        "node": {"name": state.cluster.node_name if state.cluster is not None else settings.node_name,
                 "url": state.status.own_url, "pid": os.getpid(), "process": state.config.worker_index,
                 "uptime_s": round(time.time() - state.status.started_at, 1),
                 "ready": not state.status.shutting_down and (
                     state.cluster is None or state.cluster.registry_received),
                 "data_dir": str(settings.data_dir) if settings.data_dir is not None else None,
                 "keys_may_be_lost": settings.keys_may_be_lost, "time": time.time()},
        "members": _members(state),
        "workers": [state.registry.describe(w, now) for w in state.registry.all()],
        "routes": _routes(state),
        "limits": {**limiter.limits.to_dict(), "node": limiter.statistics()} if limiter is not None else None,
        "errors": list(state.status.recent_errors)[-ERRORS_SHOWN_MAX:],
    }


async def state_json(state: GatewayState, request: Request) -> None:
    _admit(state, request)
    await request.send_json(200, snapshot(state), [*_SECURITY_HEADERS[1:]])

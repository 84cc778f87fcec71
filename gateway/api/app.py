"""The ASGI application: routing table, request ids, the error boundary, access logs, metrics.

Every ``ApiError`` becomes its OpenAI-shaped body and status here; anything
unexpected becomes a 500 with the request id, logged with its traceback. A
request that fails after its response started can only be cut short.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import trio

from mesh.asgi import answer_lifespan

from ..auth import Access, Authenticator, KeysMissing, Unauthenticated
from . import (adapters, admin, anthropic, classify, console, conversations, embeddings, native, openai, parse,
               responses, scoring, spend)
from .cached import CACHED_ROUTES, answer_cached
from .errors import ApiError, BadRequest, MethodNotAllowed, NotFound, Unavailable, to_api_error
from .http import ClientGone, Request
from .state import ERROR_MESSAGE_CHARS_MAX, GatewayState

log = logging.getLogger("gateway.api")
access_log = logging.getLogger("gateway.access")
audit_log = logging.getLogger("gateway.audit")

Handler = Callable[[GatewayState, Request], Awaitable[None]]
Route = tuple[Handler, Access]

PUBLIC, DATA, ADMIN = Access.PUBLIC, Access.DATA, Access.ADMIN
# How long a data-plane request waits for a node that has not joined its cluster yet (its seeds answer
# within a second or two when they are up), and how often it looks.
JOIN_WAIT_S = 5.0
JOIN_POLL_S = 0.05
# Every route says who may call it (gateway/auth/authenticator.py): the control plane (workers,
# rate limits) is ADMIN, reads included, since worker URLs and limits are the cluster's layout.
_ROUTES: dict[str, dict[str, Route]] = {
    "/v1/chat/completions": {"POST": (openai.chat_completions, DATA)},
    "/v1/completions": {"POST": (openai.completions, DATA)},
    "/v1/embeddings": {"POST": (embeddings.embeddings, DATA)},
    # vLLM's scoring and classification routes, each under the names its server answers to.
    "/v1/score": {"POST": (scoring.score, DATA)},
    "/score": {"POST": (scoring.score, DATA)},
    "/v1/rerank": {"POST": (scoring.rerank, DATA)},
    "/rerank": {"POST": (scoring.rerank, DATA)},
    "/v2/rerank": {"POST": (scoring.rerank, DATA)},
    "/v1/classify": {"POST": (classify.classify, DATA)},
    "/classify": {"POST": (classify.classify, DATA)},
    "/generate": {"POST": (native.generate, DATA)},
    "/v1/tokenize": {"POST": (native.tokenize, DATA)},
    "/v1/detokenize": {"POST": (native.detokenize, DATA)},
    "/v1/models": {"GET": (admin.list_models, DATA)},
    "/v1/messages": {"POST": (anthropic.messages, DATA)},
    "/v1/responses": {"POST": (responses.create, DATA)},
    "/v1/messages/count_tokens": {"POST": (anthropic.count_tokens, DATA)},
    "/v1/conversations": {"POST": (conversations.create, DATA)},
    "/health": {"GET": (admin.health, PUBLIC)},
    "/liveness": {"GET": (admin.liveness, PUBLIC)},
    "/readiness": {"GET": (admin.readiness, PUBLIC)},
    "/metrics": {"GET": (admin.metrics, PUBLIC)},
    "/workers": {"GET": (admin.list_workers, ADMIN), "POST": (admin.add_worker, ADMIN)},
    "/admin/rate-limits": {"GET": (admin.get_rate_limits, ADMIN), "PUT": (admin.put_rate_limits, ADMIN)},
    "/admin/api-keys": {"GET": (admin.list_api_keys, ADMIN), "POST": (admin.create_api_key, ADMIN)},
    "/admin/models": {"GET": (admin.get_models_config, ADMIN), "PUT": (admin.put_models_config, ADMIN)},
    "/admin/data": {"GET": (admin.data_status, ADMIN)},
    "/admin/spend": {"GET": (spend.get_spend, ADMIN)},
    "/admin/adapters": {"GET": (adapters.list_adapters, ADMIN)},
    "/admin/budgets": {"GET": (spend.get_budgets, ADMIN), "PUT": (spend.put_budgets, ADMIN)},
    # The console checks the admin credential itself: it also takes it as HTTP Basic's password, which a browser asks
    # for (console/__init__.py).
    "/console": {"GET": (console.page, PUBLIC)},
    "/console/state": {"GET": (console.state_json, PUBLIC)},
    "/admin/data/accept": {"POST": (admin.accept_data_loss, ADMIN)},
    # Operators' tools (smg lists them with the control plane): a parser on a text, no engine.
    "/parse/function_call": {"POST": (parse.parse_function_call, ADMIN)},
    "/parse/reasoning": {"POST": (parse.parse_reasoning, ADMIN)},
}
# Routes with a parameter: (pattern, methods, the route's name in metrics and logs). A model id may hold
# slashes (Qwen/Qwen3-8B): the SDK's models.retrieve sends it as it is.
_PARAM_ROUTES: "tuple[tuple[re.Pattern[str], dict[str, Route], str], ...]" = (
    (re.compile(r"^/admin/adapters/(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,127})/load$"),
     {"POST": (adapters.load_adapter, ADMIN)}, "/admin/adapters/{name}/load"),
    (re.compile(r"^/admin/adapters/(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,127})/unload$"),
     {"POST": (adapters.unload_adapter, ADMIN)}, "/admin/adapters/{name}/unload"),
    (re.compile(r"^/admin/adapters/(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,127})$"),
     {"PUT": (adapters.put_adapter, ADMIN), "DELETE": (adapters.delete_adapter, ADMIN)}, "/admin/adapters/{name}"),
    (re.compile(r"^/admin/budgets/(?P<scope>key|tenant)/(?P<name>[^/\x00-\x1f\x7f]{1,256})$"),
     {"PUT": (spend.put_budget, ADMIN), "DELETE": (spend.delete_budget, ADMIN)}, "/admin/budgets/{scope}/{name}"),
    (re.compile(r"^/v1/models/(?P<model>[^\x00-\x20\x7f]{1,256})$"), {"GET": (admin.retrieve_model, DATA)},
     "/v1/models/{model}"),
    (re.compile(r"^/v1/responses/(?P<response_id>[A-Za-z0-9_-]{1,128})$"),
     {"GET": (responses.retrieve, DATA), "DELETE": (responses.delete, DATA)}, "/v1/responses/{id}"),
    (re.compile(r"^/v1/responses/(?P<response_id>[A-Za-z0-9_-]{1,128})/cancel$"),
     {"POST": (responses.cancel, DATA)}, "/v1/responses/{id}/cancel"),
    (re.compile(r"^/v1/responses/(?P<response_id>[A-Za-z0-9_-]{1,128})/input_items$"),
     {"GET": (responses.list_input_items, DATA)}, "/v1/responses/{id}/input_items"),
    (re.compile(r"^/v1/conversations/(?P<conversation_id>[A-Za-z0-9_-]{1,128})$"),
     {"GET": (conversations.retrieve, DATA), "POST": (conversations.update, DATA),
      "DELETE": (conversations.delete, DATA)}, "/v1/conversations/{id}"),
    (re.compile(r"^/v1/conversations/(?P<conversation_id>[A-Za-z0-9_-]{1,128})/items$"),
     {"GET": (conversations.list_items, DATA), "POST": (conversations.add_items, DATA)},
     "/v1/conversations/{id}/items"),
    (re.compile(r"^/v1/conversations/(?P<conversation_id>[A-Za-z0-9_-]{1,128})/items/(?P<item_id>[A-Za-z0-9_-]{1,128})$"),
     {"GET": (conversations.retrieve_item, DATA), "DELETE": (conversations.delete_item, DATA)},
     "/v1/conversations/{id}/items/{item}"),
    (re.compile(r"^/workers/(?P<worker_id>[A-Za-z0-9._-]{1,128})$"),
     {"GET": (admin.get_worker, ADMIN), "DELETE": (admin.remove_worker, ADMIN)}, "/workers/{id}"),
    (re.compile(r"^/admin/api-keys/(?P<key_id>[0-9a-f]{1,64})$"), {"DELETE": (admin.revoke_api_key, ADMIN)},
     "/admin/api-keys/{id}"),
)
# Routes whose errors are in Anthropic's shape rather than OpenAI's.
_ANTHROPIC_ROUTES = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
# The access log escapes what a client chose (path, method) so it cannot forge log lines.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\\\"]")


class GatewayApp:
    def __init__(self, state: GatewayState, background: trio.Nursery, authenticator: Authenticator) -> None:
        self.state = state
        self._background = background
        self._body_bytes_max = state.config.admission.body_bytes_max  # None: the catalog sizes it
        self._auth = authenticator
        self._audit = state.config.auth.audit
        self._cost_of = state.spend.cost_of if state.config.spend.cost_header else None  # --cost-header
        self._cached_routes = CACHED_ROUTES if state.config.cache.enabled else {}  # --response-cache
        # A node of a cluster serves the data plane once it holds the cluster's worker registry; until
        # then (its first moment after a start) a request waits for it (JOIN_WAIT_S), rather than get a
        # 404 or 503 for models the node does not know yet. nginx cannot see /readiness (passive checks
        # only) and no longer counts 503s (they may be one model's): the wait is what keeps a restarted
        # node from answering wrongly behind it.
        self._joining = state.cluster is not None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not served
        request = Request(scope, receive, send, self._request_id(scope),
                          self._body_bytes_max or self.state.catalog.body_bytes_max_auto, self._background)
        if self._cost_of is not None:
            request.cost_of = self._cost_of
        tracing = self.state.tracing
        if tracing is None or not tracing.samples(request.headers):
            await self._serve(request, None)
            return
        with tracing.request_span(f"{request.method} {_printable(request.path)}", request.headers, {
                "http.request.method": request.method, "url.path": _printable(request.path),
                "smg.request_id": request.request_id}) as span:
            await self._serve(request, span)

    async def _serve(self, request: Request, span: Any) -> None:
        """The request, from its route to its answer (``span``: its trace's server span, when tracing)."""
        started = time.perf_counter()
        route = "unmatched"
        access = PUBLIC
        try:
            route, handler, access = self._resolve(request)
            headers = request.headers
            if b"transfer-encoding" in headers and b"content-length" in headers:
                # The native server refuses this before the app sees it; another ASGI server (hypercorn, whose
                # h11 reads such a body as chunked and keeps the connection) must not serve it either: two
                # framings are how requests are smuggled past a proxy that reads the other one.
                raise AmbiguousFraming("Transfer-Encoding with Content-Length: the body's framing is ambiguous",
                                       code="ambiguous_framing")
            raw_headers = request.scope["headers"]
            if len(headers) != len(raw_headers):
                _refuse_repeated_credentials(raw_headers)  # the dict kept the last of each repeated header
            try:
                if span is None:
                    request.principal = self._auth.authenticate(request.headers, access)
                else:
                    span.update_name(f"{request.method} {route}")  # the route: its ids are not a span name
                    span.set_attribute("http.route", route)
                    with self.state.tracing.span("authenticate", attributes={"smg.access": access.name.lower()}):
                        request.principal = self._auth.authenticate(request.headers, access)
            except KeysMissing:  # a JWT signed with a key we do not hold yet: the issuer rotated
                await self._auth.refresh_keys()
                try:
                    request.principal = self._auth.authenticate(request.headers, access)
                except KeysMissing:
                    raise Unauthenticated("the token's signing key is not among the issuer's keys",
                                          credential_given=True) from None
            if self._joining and access is DATA:
                await self._wait_joined()
            cached_api = self._cached_routes.get(route) if self._cached_routes else None
            if cached_api is not None and request.method == "POST":
                await answer_cached(self.state, request, cached_api, handler)
            else:
                await handler(self.state, request)
        except ClientGone:
            pass
        except Exception as e:
            error = to_api_error(e)
            if error is None:
                log.exception("request %s %s %s failed", request.request_id, request.method, request.path)
                error = ApiError(f"internal error (request id {request.request_id})", code="internal_error")
            body = anthropic.anthropic_error_body(error) if route in _ANTHROPIC_ROUTES else error.body_bytes()
            self.state.status.recent_errors.append({
                "time": time.time(), "route": route, "status": error.status, "code": error.code,
                "message": error.message[:ERROR_MESSAGE_CHARS_MAX], "request_id": request.request_id})
            await self._fail(request, error.status, body, error.headers())
        finally:
            status = request.status if request.response_started else 499  # 499: client closed first
            if span is not None:
                span.set_attribute("http.response.status_code", status)
            metrics = self.state.metrics
            metrics.child(metrics.requests, route, str(status)).inc()
            elapsed = time.perf_counter() - started
            metrics.child(metrics.request_duration, route).observe(elapsed)
            cost = self.state.spend.record(request, status) if request.usage is not None else None
            if access_log.isEnabledFor(logging.INFO):
                if cost:  # a priced answer: its target (if a route's) and its cost in dollars
                    access_log.info("%s %s %d %.1fms target=%s cost=%.8f", _printable(request.method),
                                    _printable(request.path), status, elapsed * 1000, request.target or "-", cost,
                                    extra={"request_id": request.request_id, "target": request.target,
                                           "cost_usd": cost})
                elif request.target is None:
                    access_log.info("%s %s %d %.1fms", _printable(request.method), _printable(request.path), status,
                                    elapsed * 1000, extra={"request_id": request.request_id})
                else:  # a routed model's request: the target that answered (the operator's name for it)
                    access_log.info("%s %s %d %.1fms target=%s", _printable(request.method), _printable(request.path),
                                    status, elapsed * 1000, request.target,
                                    extra={"request_id": request.request_id, "target": request.target})
            if self._audit and access is ADMIN and request.method not in ("GET", "HEAD"):
                self._audit_entry(request, status)

    async def _wait_joined(self) -> None:
        """Until the node holds the cluster's registry and registered the workers it lists, or knows workers of
        its own (--worker-urls: it serves those, as it would cut off from its seeds)."""
        cluster, registry = self.state.cluster, self.state.registry
        with trio.move_on_after(JOIN_WAIT_S):
            while not cluster.registry_applied and not registry.all():
                await trio.sleep(JOIN_POLL_S)
        if cluster.registry_applied:
            self._joining = False
        elif not registry.all():
            raise Unavailable("this node has not joined its cluster yet (no worker registry received): retry, "
                              "another node can serve it", code="not_joined", retry_after_s=1)

    def _resolve(self, request: Request) -> tuple[str, Handler, Access]:
        methods = _ROUTES.get(request.path)
        route = request.path
        if methods is None:
            for pattern, methods, route in _PARAM_ROUTES:
                match = pattern.match(request.path)
                if match is not None:
                    request.path_params = match.groupdict()
                    break
            else:
                raise NotFound(f"no route {_printable(request.path)}", code="not_found")
        entry = methods.get(request.method)
        if entry is None:
            raise MethodNotAllowed(f"{_printable(request.method)} is not allowed on {_printable(request.path)}",
                                   code="method_not_allowed")
        return route, entry[0], entry[1]

    @staticmethod
    def _audit_entry(request: Request, status: int) -> None:
        """A control-plane change attempted: who, what, when, from where, and how it ended."""
        principal = request.principal
        client = request.scope.get("client")
        audit_log.info(orjson.dumps({
            "time": time.time(), "request_id": request.request_id,
            "who": principal.key_id if principal is not None else None,
            "name": principal.name if principal is not None else None,
            "action": f"{request.method} {request.path}", "from": f"{client[0]}:{client[1]}" if client else None,
            "status": status, "outcome": "done" if 200 <= status < 300 else "refused"}).decode())

    @staticmethod
    def _request_id(scope: dict[str, Any]) -> str:
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                text = value.decode("latin-1")
                if _REQUEST_ID.match(text):
                    return text
                break
        # 128 random bits as hex, like uuid4().hex but from the random module (3.2 -> 0.6 µs; no system call
        # per request); random reseeds itself in forked children, so worker processes do not repeat ids.
        return f"{random.getrandbits(128):032x}"

    @staticmethod
    async def _fail(request: Request, status: int, body: bytes, headers: "list[tuple[bytes, bytes]]") -> None:
        if request.response_started or request.disconnected:
            return  # the head is out (or nobody listens): nothing more can be said in HTTP terms
        await request.send_bytes(status, body, [(b"content-type", b"application/json"), *headers])


class AmbiguousFraming(BadRequest):
    """A 400 after which the connection must close: what follows on it cannot be told apart from this body."""

    def headers(self) -> "list[tuple[bytes, bytes]]":
        return [*super().headers(), (b"connection", b"close")]


_CREDENTIAL_HEADERS = (b"authorization", b"x-api-key")


def _refuse_repeated_credentials(headers: "list[tuple[bytes, bytes]]") -> None:
    """Two Authorization (or x-api-key) headers: which one counts depends on who reads them (a proxy may check
    the first, we would take the last), so neither does: 400."""
    for name in _CREDENTIAL_HEADERS:
        if sum(1 for key, _ in headers if key == name) > 1:
            raise BadRequest(f"the request carries more than one {name.decode()} header: send one credential",
                             code="duplicate_credential")


def _printable(text: str) -> str:
    """``text`` with control characters, quotes and backslashes escaped (log injection)."""
    if _UNPRINTABLE.search(text) is None:
        return text
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)

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

import trio

from . import admin, native, openai
from .errors import ApiError, MethodNotAllowed, NotFound
from .http import ClientGone, Request, answer_lifespan

log = logging.getLogger("gateway.api")
access_log = logging.getLogger("gateway.access")

Handler = Callable[[Any, Request], Awaitable[None]]

_ROUTES: dict[str, dict[str, Handler]] = {
    "/v1/chat/completions": {"POST": openai.chat_completions},
    "/v1/completions": {"POST": openai.completions},
    "/generate": {"POST": native.generate},
    "/v1/tokenize": {"POST": native.tokenize},
    "/v1/detokenize": {"POST": native.detokenize},
    "/v1/models": {"GET": admin.list_models},
    "/health": {"GET": admin.health},
    "/liveness": {"GET": admin.liveness},
    "/readiness": {"GET": admin.readiness},
    "/metrics": {"GET": admin.metrics},
    "/workers": {"GET": admin.list_workers, "POST": admin.add_worker},
    "/admin/rate-limits": {"GET": admin.get_rate_limits, "PUT": admin.put_rate_limits},
}
_WORKER_ROUTE = re.compile(r"^/workers/(?P<worker_id>[A-Za-z0-9._-]{1,128})$")
_WORKER_METHODS: dict[str, Handler] = {"GET": admin.get_worker, "DELETE": admin.remove_worker}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")


class GatewayApp:
    def __init__(self, state: Any, background: trio.Nursery) -> None:
        self.state = state
        self._background = background
        self._body_bytes_max = state.config.admission.body_bytes_max

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not served
        request = Request(scope, receive, send, self._request_id(scope), self._body_bytes_max, self._background)
        started = time.perf_counter()
        route = "unmatched"
        try:
            route, handler = self._resolve(request)
            await handler(self.state, request)
        except ApiError as e:
            await self._fail(request, e.status, e.body_bytes(), e.headers())
        except ClientGone:
            pass
        except Exception:
            log.exception("request %s %s %s failed", request.request_id, request.method, request.path)
            body = ApiError(f"internal error (request id {request.request_id})", code="internal_error").body_bytes()
            await self._fail(request, 500, body, [])
        finally:
            status = request.status if request.response_started else 499  # 499: client closed first
            metrics = self.state.metrics
            metrics.child(metrics.requests, route, str(status)).inc()
            elapsed = time.perf_counter() - started
            metrics.child(metrics.request_duration, route).observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info("%s %s %d %.1fms", request.method, request.path, status, elapsed * 1000,
                                extra={"request_id": request.request_id})

    def _resolve(self, request: Request) -> tuple[str, Handler]:
        methods = _ROUTES.get(request.path)
        route = request.path
        if methods is None:
            match = _WORKER_ROUTE.match(request.path)
            if match is None:
                raise NotFound(f"no route {request.path}", code="not_found")
            request.path_params = match.groupdict()
            methods, route = _WORKER_METHODS, "/workers/{id}"
        handler = methods.get(request.method)
        if handler is None:
            raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}", code="method_not_allowed")
        return route, handler

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

"""HTTP errors in the OpenAI error shape. Every error becomes an HTTP status here, nowhere deeper.

    ApiError(status, message, type, code, param)      -> {"error": {...}} with that status
      BadRequest              400 invalid_request_error   malformed JSON, wrong types, bad values
        ContextLengthExceeded 400 code=context_length_exceeded
      Unauthorized            401 + WWW-Authenticate     no API key, or one we do not know
      Forbidden               403                         a key without the role or the model
      NotFound                404 code=model_not_found / not_found
      Conflict                409                         a worker registered twice
      PayloadTooLarge         413
      TooManyRequests         429 + Retry-After           queue full, rate limit reached
      Unavailable             503 + Retry-After           no healthy engine, queue wait timed out, keys unknown
      UpstreamError           502                         the engine failed after retries
      UpstreamTimeout         504                         the engine did not answer in time

The core raises no HTTP: ``to_api_error`` maps what it raises (``gateway.base.errors``,
``engine.errors.EngineCallError``, ``auth`` errors) to one of these, here and
only here, so that a status and its body are decided once.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from ..base import errors as core
from ..auth import AuthError, KeysUnknown, Unauthenticated
from ..engine.errors import EngineCallError
from ..workers.errors import WorkerError

log = logging.getLogger("gateway.api")


# What of a client's value an error message shows: enough to recognise it, never a body echoed back.
SHOWN_CHARS_MAX = 64


def shown(value: Any) -> str:
    """A client's value as an error message names it: a string quoted, anything else as JSON, cut short."""
    if isinstance(value, str):
        return repr(value[:SHOWN_CHARS_MAX]) + ("..." if len(value) > SHOWN_CHARS_MAX else "")
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = type(value).__name__
    return text[:SHOWN_CHARS_MAX] + ("..." if len(text) > SHOWN_CHARS_MAX else "")


def type_name(value: Any) -> str:
    """A JSON value's type as a message says it: "a string", "an object", "null"..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class ApiError(Exception):
    status = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}

    def body_bytes(self) -> bytes:
        return orjson.dumps(self.body())

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.retry_after_s is None:
            return []
        return [(b"retry-after", str(self.retry_after_s).encode())]


class Conflict(ApiError):
    status = 409
    error_type = "invalid_request_error"


class BadRequest(ApiError):
    status = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    def __init__(self, message: str, param: str | None = "messages") -> None:
        super().__init__(message, code="context_length_exceeded", param=param)


class NotFound(ApiError):
    status = 404
    error_type = "invalid_request_error"


class MethodNotAllowed(ApiError):
    status = 405
    error_type = "invalid_request_error"


class Unauthorized(ApiError):
    status = 401
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, code: str | None = None, credential_given: bool = False) -> None:
        super().__init__(message, code=code)
        self.credential_given = credential_given

    def headers(self) -> list[tuple[bytes, bytes]]:
        # RFC 6750: the scheme, and error="invalid_token" when a token was sent and refused.
        challenge = b'Bearer realm="smg-node"' + (b', error="invalid_token"' if self.credential_given else b"")
        return [(b"www-authenticate", challenge)]


class Forbidden(ApiError):
    status = 403
    error_type = "invalid_request_error"


class PayloadTooLarge(ApiError):
    status = 413
    error_type = "invalid_request_error"


class TooManyRequests(ApiError):
    status = 429
    error_type = "rate_limit_error"


class InsufficientQuota(ApiError):
    """OpenAI's answer when an account's quota is used up: 429 with type insufficient_quota."""

    status = 429
    error_type = "insufficient_quota"


class Unavailable(ApiError):
    status = 503
    error_type = "service_unavailable"


class UpstreamError(ApiError):
    status = 502
    error_type = "upstream_error"


class UpstreamTimeout(ApiError):
    status = 504
    error_type = "timeout"


def from_engine_error(e: EngineCallError, model: str | None = None) -> ApiError:
    """Our own words for what an engine said: its text (exception messages, paths, versions) goes to the log, not
    to the client. ``model``, when known, is named: in a fleet, which model's engines failed."""
    code = e.code
    serving = f" serving model {model!r}" if model else ""
    log.info("engine error %s: %s", code, e.details)
    if code == "INVALID_ARGUMENT" or code == "OUT_OF_RANGE" or code == "FAILED_PRECONDITION":
        return BadRequest(f"the engine refused the request's parameters ({code}); its reason is in the gateway's "
                          "log", code="engine_rejected")
    if code == "RESOURCE_EXHAUSTED":
        return Unavailable(f"every engine{serving} is at capacity; retry later", code="engine_overloaded",
                           retry_after_s=1)
    if code == "DEADLINE_EXCEEDED":
        return UpstreamTimeout(f"the engine{serving} did not answer in time", code="engine_timeout")
    if code == "UNAVAILABLE":
        return Unavailable(f"the engine{serving} is unavailable; retry later", code="engine_unavailable",
                           retry_after_s=1)
    if code == "NOT_FOUND":
        return NotFound("the engine does not know this request", code="not_found")
    return UpstreamError(f"the engine{serving} failed ({code})", code="engine_error")


def from_auth_error(e: AuthError) -> ApiError:
    if isinstance(e, Unauthenticated):
        return Unauthorized(e.message, code=e.code, credential_given=e.credential_given)
    if isinstance(e, KeysUnknown):
        return Unavailable(e.message, code=e.code, retry_after_s=5)
    return Forbidden(e.message, code=e.code)


# Each core failure's answer: (class, default code). A worker registration problem keeps the type
# it always had (invalid_request_error, code worker_error) whatever its status.
_CORE_ANSWERS: "tuple[tuple[type[core.GatewayError], type[ApiError]], ...]" = (
    (core.InvalidInput, BadRequest), (core.NotAllowed, Forbidden), (core.NotKnown, NotFound),
    (core.AlreadyExists, Conflict), (core.Overloaded, TooManyRequests), (core.NoCapacity, Unavailable),
    (core.Unreachable, UpstreamError), (core.TimedOut, UpstreamTimeout), (core.TooLarge, PayloadTooLarge),
    (core.QuotaExceeded, InsufficientQuota))


class _WorkerRequestError(ApiError):
    error_type = "invalid_request_error"

    def __init__(self, e: WorkerError, status: int) -> None:
        super().__init__(e.message, code="worker_error")
        self.status = status


def from_core_error(e: core.GatewayError) -> ApiError:
    for kind, answer in _CORE_ANSWERS:
        if isinstance(e, kind):
            if isinstance(e, WorkerError):
                return _WorkerRequestError(e, answer.status)
            return answer(e.message, code=e.code, retry_after_s=e.retry_after_s, param=e.param)
    return ApiError(e.message, code=e.code, param=e.param)


def transport_error_body(status: int, message: str, code: str | None) -> tuple[bytes, bytes]:
    """The body of the answers the HTTP server gives itself (gateway/http1 ErrorBody), in the OpenAI shape."""
    error_type = {500: "server_error", 503: "service_unavailable"}.get(status, "invalid_request_error")
    return b"application/json", orjson.dumps({"error": {"message": message, "type": error_type, "param": None,
                                                        "code": code}})


def to_api_error(e: Exception) -> ApiError | None:
    """The answer to what a handler raised; None for what is not a known failure (a bug: 500)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, core.GatewayError):
        return from_core_error(e)
    if isinstance(e, EngineCallError):
        return from_engine_error(e)
    if isinstance(e, AuthError):
        return from_auth_error(e)
    return None

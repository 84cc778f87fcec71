"""HTTP errors in the OpenAI error shape. Every error becomes an HTTP status here, nowhere deeper.

    ApiError(status, message, type, code, param)      -> {"error": {...}} with that status
      BadRequest              400 invalid_request_error   malformed JSON, wrong types, bad values
        ContextLengthExceeded 400 code=context_length_exceeded
      Unauthorized            401 + WWW-Authenticate     no API key, or one we do not know
      Forbidden               403                         a key without the role or the model
      NotFound                404 code=model_not_found / not_found
      PayloadTooLarge         413
      TooManyRequests         429 + Retry-After           queue full, rate limit reached
      Unavailable             503 + Retry-After           no healthy engine, queue wait timed out
      UpstreamError           502                         the engine failed after retries
      UpstreamTimeout         504                         the engine did not answer in time

``from_engine_error`` maps an ``EngineCallError`` (a gRPC status name) to one
of these at the API boundary.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..auth import AuthError, Unauthenticated
from ..engine.errors import EngineCallError


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


class Unavailable(ApiError):
    status = 503
    error_type = "service_unavailable"


class UpstreamError(ApiError):
    status = 502
    error_type = "upstream_error"


class UpstreamTimeout(ApiError):
    status = 504
    error_type = "timeout"


def from_engine_error(e: EngineCallError) -> ApiError:
    code = e.code
    if code == "INVALID_ARGUMENT" or code == "OUT_OF_RANGE" or code == "FAILED_PRECONDITION":
        return BadRequest(f"the engine rejected the request: {e.details}", code="engine_rejected")
    if code == "RESOURCE_EXHAUSTED":
        return Unavailable("every engine is at capacity; retry later", code="engine_overloaded", retry_after_s=1)
    if code == "DEADLINE_EXCEEDED":
        return UpstreamTimeout("the engine did not answer in time", code="engine_timeout")
    if code == "UNAVAILABLE":
        return Unavailable(f"engine unavailable: {e.details}", code="engine_unavailable", retry_after_s=1)
    if code == "NOT_FOUND":
        return NotFound(f"the engine does not know this: {e.details}", code="not_found")
    return UpstreamError(f"engine error {code}: {e.details}", code="engine_error")


def from_auth_error(e: AuthError) -> ApiError:
    if isinstance(e, Unauthenticated):
        return Unauthorized(e.message, code=e.code, credential_given=e.credential_given)
    return Forbidden(e.message, code=e.code)

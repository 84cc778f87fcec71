"""Client for OpenAI-compatible HTTP workers (``--worker-urls http://...``).

These workers get the client's request as it is: no tokenization, streaming
passed through byte for byte. Failures map to ``EngineCallError`` so routing,
retries and circuit breaking treat both kinds of worker alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx2

from ..net.http_client import HttpClient, HttpClientError, HttpResponse
from .errors import EngineCallError

# Status codes of a worker's answer that mean "try another worker" (smg's list).
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_STATUS_TO_CODE = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                   408: "DEADLINE_EXCEEDED", 413: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT",
                   429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
                   504: "DEADLINE_EXCEEDED"}
# Hop-by-hop headers (RFC 9110 7.6.1) and ones the server recomputes (the relay client sends its own host,
# content-length and accept-encoding).
_DROP_HEADERS = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                           b"trailer", b"transfer-encoding", b"upgrade", b"content-length", b"host", b"date", b"server",
                           b"accept-encoding"})
# A retryable answer's body is read for its message only (the first 512 bytes are kept); past this it is not read.
_DETAIL_BYTES_MAX = 64 * 1024


def _call_error(exc: Exception) -> EngineCallError:
    if isinstance(exc, httpx2.TimeoutException):
        return EngineCallError("DEADLINE_EXCEEDED", str(exc) or type(exc).__name__)
    if isinstance(exc, httpx2.TransportError):
        return EngineCallError("UNAVAILABLE", str(exc) or type(exc).__name__)
    return EngineCallError("INTERNAL", f"{type(exc).__name__}: {exc}")


class HttpUpstreamResponse:
    """A worker's answer being relayed: status, headers to pass on, body chunks."""

    def __init__(self, response: HttpResponse) -> None:
        self.status = response.status
        self.headers = [(k, v) for k, v in response.headers if k not in _DROP_HEADERS]
        self._response = response

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response:
                yield chunk
        except HttpClientError as e:
            raise EngineCallError("UNAVAILABLE", f"the worker's answer broke off: {e}") from None


class HttpWorkerClient:
    """An OpenAI-compatible HTTP worker (``gateway.workers.worker.WorkerClient``): requests are relayed
    as they are, so it needs no tokenizer here; it reports no load and no KV events."""

    kind = "http"
    runtime_name = "openai"
    needs_tokenizer = False
    publishes_kv_events = False

    def __init__(self, base_url: str, client: httpx2.AsyncClient, api_key: str | None = None,
                 health_endpoint: str = "/health", relay: HttpClient | None = None) -> None:
        """``api_key``: the worker's own key, configured by the operator (the clients' keys are the
        gateway's and never reach a worker: gateway/api/proxy.py). ``client`` asks the worker's health and
        models (now and then); ``relay``, the node's own HTTP/1.1 client, carries the requests (the hot path:
        the library client cost a quarter of a relayed request's CPU)."""
        self.architectures: tuple[str, ...] = ()  # an OpenAI-compatible server does not say
        self.base_url = base_url.rstrip("/")
        self._client = client
        self._relay = relay or HttpClient()
        self._auth = [("authorization", f"Bearer {api_key}")] if api_key else []
        self._relay_auth = [(b"authorization", f"Bearer {api_key}".encode("latin-1"))] if api_key else []
        self._health_endpoint = health_endpoint

    async def health(self, timeout_s: float) -> bool:
        try:
            r = await self._client.get(self.base_url + self._health_endpoint, timeout=timeout_s,
                                       headers=self._auth)
        except httpx2.HTTPError as e:
            raise _call_error(e) from None
        return r.status_code < 400

    async def loads(self, timeout_s: float) -> None:
        return None  # no load report: policies count this gateway's own requests

    async def aclose(self) -> None:
        pass  # the HTTP connection pool is shared by every worker and closed with the gateway

    async def models(self, timeout_s: float) -> list[str]:
        try:
            r = await self._client.get(self.base_url + "/v1/models", timeout=timeout_s, headers=self._auth)
            r.raise_for_status()
            return [m["id"] for m in r.json().get("data", []) if isinstance(m, dict) and "id" in m]
        except httpx2.HTTPStatusError as e:
            raise EngineCallError(_STATUS_TO_CODE.get(e.response.status_code, "INTERNAL"), str(e)) from None
        except httpx2.HTTPError as e:
            raise _call_error(e) from None
        except (ValueError, AttributeError) as e:
            raise EngineCallError("INTERNAL", f"bad /v1/models answer: {e}") from None

    @contextlib.asynccontextmanager
    async def forward(self, path: str, body: bytes, headers: "list[tuple[bytes, bytes]]",
                      timeout_s: float | None) -> AsyncIterator[HttpUpstreamResponse]:
        """Send the request; a retryable status raises (nothing was relayed yet). The time is the caller's (its
        cancel scope: gateway/api/proxy.py)."""
        send_headers = [(k, v) for k, v in headers if k.lower() not in _DROP_HEADERS] + self._relay_auth
        try:
            response = await self._relay.request(b"POST", self.base_url + path, send_headers, body)
        except HttpClientError as e:
            raise EngineCallError("UNAVAILABLE", str(e)) from None
        try:
            if response.status in RETRYABLE_STATUSES:
                try:
                    detail = (await response.read(_DETAIL_BYTES_MAX))[:512].decode("utf-8", "replace")
                except HttpClientError:
                    detail = ""
                raise EngineCallError(_STATUS_TO_CODE.get(response.status, "UNAVAILABLE"),
                                      f"worker answered {response.status}: {detail}")
            yield HttpUpstreamResponse(response)
        finally:
            await response.aclose()

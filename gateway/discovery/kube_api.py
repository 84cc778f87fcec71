"""The two calls discovery makes to the Kubernetes API server: list pods (in pages) and watch them.

Written on the gateway's HTTP client rather than a Kubernetes client library: the official ``kubernetes``
package is synchronous (urllib3) and ``kubernetes_asyncio`` runs on asyncio, neither on trio; two read-only
calls of a documented protocol are less than either would bring.

Watch, as the API documents it (https://kubernetes.io/docs/reference/using-api/api-concepts/): a chunked
stream of JSON lines ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}``, resumed from a
resourceVersion; a version the server no longer has is ``410 Gone``, either as the HTTP status or as an
ERROR event carrying a Status with code 410, and the client must list again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson
import trio

from .config import Selector, selector_text
from .credentials import KubeCredentials

# One watch event (a pod's JSON) larger than this is no pod of ours: the stream is dropped and resumed.
EVENT_BYTES_MAX = 4 * 1024 * 1024
# A list page larger than this likewise (500 pods of ~20 KB each fit several times).
LIST_BYTES_MAX = 64 * 1024 * 1024
# A page larger than this is parsed in a worker thread: orjson takes ~3 ms a MiB, which the event loop should not.
THREAD_PARSE_BYTES = 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
# Beyond the watch's own timeoutSeconds: the server ends the stream then; silence this much longer means the
# connection is gone without a word (a node or network that vanished).
READ_GRACE_S = 30.0
# The first item of every watch: the server answered 200 and the stream is open (not an event of the API's).
OPENED = "OPENED"


class KubeApiError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ResourceGone(KubeApiError):
    """410: the resourceVersion (or a list's continue token) is too old; list again."""


def _error(response_status: int, body: bytes, what: str) -> KubeApiError:
    try:
        message = orjson.loads(body).get("message", "")
    except (orjson.JSONDecodeError, AttributeError):
        message = body[:200].decode("utf-8", "replace")
    hint = " (the service account needs get/list/watch on pods: deploy/kubernetes's Role)" \
        if response_status in (401, 403) else ""
    error = ResourceGone if response_status == 410 else KubeApiError
    return error(f"{what}: HTTP {response_status} {message}{hint}", response_status)


class KubeApi:
    def __init__(self, credentials: KubeCredentials, http: "httpx2.AsyncClient | None" = None) -> None:
        self.credentials = credentials
        self.http = http or httpx2.AsyncClient(verify=credentials.ssl_context, follow_redirects=False)

    async def aclose(self) -> None:
        await self.http.aclose()

    def _url(self, namespace: str | None) -> str:
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        return self.credentials.server + path

    async def list_pods(self, namespace: str | None, selector: Selector, limit: int,
                        continue_token: str = "") -> "tuple[list[Any], str, str]":
        """One page: (items, the list's resourceVersion, the continue token or '')."""
        params = {"labelSelector": selector_text(selector), "limit": str(limit)}
        if continue_token:
            params["continue"] = continue_token
        timeout = httpx2.Timeout(60.0, connect=CONNECT_TIMEOUT_S)
        async with self.http.stream("GET", self._url(namespace), params=params, headers=self.credentials.headers(),
                                    timeout=timeout) as response:
            body = bytearray()  # (appending to bytes would copy the page so far at every chunk)
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > LIST_BYTES_MAX:
                    raise KubeApiError(f"list of pods: page larger than {LIST_BYTES_MAX} bytes")
            if response.status_code != 200:
                raise _error(response.status_code, bytes(body), "list of pods")
        if len(body) > THREAD_PARSE_BYTES:
            return await trio.to_thread.run_sync(_pod_list, bytes(body))
        return _pod_list(body)

    async def watch_pods(self, namespace: str | None, selector: Selector, resource_version: str,
                         timeout_s: float) -> "AsyncIterator[tuple[str, Any]]":
        """(OPENED, None), then (type, object) of each event until the server ends the watch; ResourceGone for a
        410 either way."""
        params = {"labelSelector": selector_text(selector), "watch": "1", "allowWatchBookmarks": "true",
                  "resourceVersion": resource_version, "timeoutSeconds": str(int(timeout_s))}
        timeout = httpx2.Timeout(timeout_s + READ_GRACE_S, connect=CONNECT_TIMEOUT_S)
        async with self.http.stream("GET", self._url(namespace), params=params, headers=self.credentials.headers(),
                                    timeout=timeout) as response:
            if response.status_code != 200:
                raise _error(response.status_code, await response.aread(), "watch of pods")
            yield OPENED, None
            # Lines cut as they end, each byte looked at once: a bytearray that grows in place and a scan that
            # starts where the last one stopped (appending to bytes and splitting off each line copied the rest
            # every time: quadratic in an event's size).
            pending = bytearray()
            async for chunk in response.aiter_bytes():
                scan = len(pending)
                pending += chunk
                start = 0
                while (end := pending.find(b"\n", scan)) >= 0:
                    line = bytes(pending[start:end])
                    start = scan = end + 1
                    if line.strip():
                        yield _event(line)
                del pending[:start]
                if len(pending) > EVENT_BYTES_MAX:
                    raise KubeApiError(f"watch of pods: an event larger than {EVENT_BYTES_MAX} bytes")
            if pending.strip():
                yield _event(bytes(pending))


def _pod_list(body: "bytes | bytearray") -> "tuple[list[Any], str, str]":
    """(items, the list's resourceVersion, the continue token) of a PodList's JSON."""
    try:
        answer = orjson.loads(body)
        meta = answer.get("metadata") or {}
        items = answer.get("items") or []
        if not isinstance(items, list):
            raise TypeError
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        raise KubeApiError("list of pods: not a PodList") from None
    return items, str(meta.get("resourceVersion") or ""), str(meta.get("continue") or "")


def _event(line: bytes) -> "tuple[str, Any]":
    try:
        event = orjson.loads(line)
        kind, obj = event["type"], event.get("object")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise KubeApiError("watch of pods: a line that is not an event") from None
    if kind == "ERROR":
        code = obj.get("code") if isinstance(obj, dict) else None
        message = obj.get("message", "") if isinstance(obj, dict) else ""
        error = ResourceGone if code == 410 else KubeApiError
        raise error(f"watch of pods: ERROR {code} {message}", code)
    return str(kind), obj

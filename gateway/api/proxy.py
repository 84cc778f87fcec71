"""Relaying requests to OpenAI-compatible HTTP workers, as they are.

Same routing, admission, retries and circuit breaking as gRPC engines; the
body and the answer (streamed or not) pass through unchanged. A failure before
the first byte of the answer is retried; after it, a streamed answer ends with
an SSE error event (the client would otherwise wait on a silent stream).
"""

from __future__ import annotations

import trio

from ..engine.errors import EngineCallError
from ..serving.generation import Generator, UsageTally
from ..routing.policies import RoutingRequest
from ..workers import AttemptFailed, Worker, WorkerAttempt
from .errors import UpstreamError, UpstreamTimeout, from_engine_error
from .http import Request, sse_event
from .ratelimits import rate_limited

# Request headers a worker should see. Everything else stays here: the client's credentials above
# all (Authorization, x-api-key, cookies), which are the gateway's to check, never a worker's to
# receive; a worker that wants a key of its own is given one by the operator, not by our clients.
_FORWARD_HEADERS = (b"content-type", b"accept", b"openai-organization", b"openai-project")


class HttpProxy:
    def __init__(self, generator: Generator, admission, request_timeout_s: float, rate_limiter=None) -> None:
        self._generator = generator
        self._admission = admission
        self._timeout_s = request_timeout_s
        self.rate_limiter = rate_limiter

    async def forward(self, request: Request, body: bytes, model: str, path: str, stream: bool,
                      routing: RoutingRequest) -> None:
        headers = [(k, v) for k, v in request.headers.items() if k in _FORWARD_HEADERS]
        headers.append((b"x-request-id", request.request_id.encode("latin-1")))

        async def attempt(worker: Worker) -> None:
            relayed = False
            sent = headers
            tracing = self._generator.tracing
            if tracing is not None and tracing.active():  # the worker's spans join the attempt's
                sent = [*headers, *tracing.context_headers()]
            with WorkerAttempt(worker) as counted:
                try:
                    async with worker.client.forward(path, body, sent, self._timeout_s) as upstream:
                        is_sse = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                     for k, v in upstream.headers)
                        try:
                            await request.start_stream(upstream.status, upstream.headers)
                            relayed = True
                            async for chunk in upstream.chunks():
                                await request.send_chunk(chunk)
                        except EngineCallError as e:
                            if is_sse:
                                await request.send_chunk(sse_event(from_engine_error(e).body()))
                        await request.end_stream()
                except EngineCallError as e:
                    counted.failed(e)
                    if not relayed:
                        raise AttemptFailed(e) from None

        # The body is not tokenized here: token limits reserve ~1 token per 4 bytes (OpenAI's rule of
        # thumb) and keep that reservation, since the worker's usage is not parsed out of its answer.
        estimate = max(1, len(body) // 4)
        # ``self``: the limiter alone, no budgets (an HTTP worker's answer is relayed unread: no usage to charge).
        async with rate_limited(self, request, model, UsageTally(prompt_tokens=estimate), estimate), \
                self._admission.slot(request.tenant_key):
            async with request.cancel_on_disconnect():
                with trio.move_on_after(self._timeout_s) as timeout:
                    await self._generator.with_retries(request.request_id, model, routing, "http", attempt)
        if timeout.cancelled_caught and not request.response_started:
            raise UpstreamTimeout("the worker did not answer within the request timeout", code="request_timeout")
        if not request.response_started and not request.disconnected:
            raise UpstreamError("the worker closed the connection without an answer", code="upstream_error")

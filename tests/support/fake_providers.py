"""Hosted providers played on loopback, in a thread of the test process: each speaks its provider's documented wire
format, holds every request the gateway sends to the provider SDK's own request types (``sdk_types.problems``;
what fails is kept in ``problems``, which a test asserts empty), and answers with bodies and events the provider's
official SDK parses (each is built through the SDK's response models before it is sent).

A test scripts a server: ``reply`` (the answer to a request: text, reasoning, tool calls, finish reason, usage)
and ``failures`` (the next requests' failures, in order: a status with the provider's error body and headers, a
delay, a connection dropped mid-answer). ``requests`` keeps what came (path, headers, body).

    FakeOpenAI      chat completions: /v1/chat/completions, and Azure's deployment and v1 paths; embeddings;
                    the Responses API (/v1/responses)
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.server
import json
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.support.sdk_types import problems


@dataclasses.dataclass
class Reply:
    content: str | None = "Hello from the provider."
    reasoning: str | None = None
    calls: list[tuple[str, dict]] = dataclasses.field(default_factory=list)  # (name, arguments)
    finish: str | None = None  # None: tool_calls when there are calls, else stop
    prompt_tokens: int = 11
    completion_tokens: int = 7
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    # Anthropic's content blocks as they are (FakeAnthropic), in place of those made from the fields above: redacted
    # thinking, several signed thinking blocks.
    blocks: "list[dict] | None" = None


@dataclasses.dataclass
class Failure:
    status: int = 500
    message: str = "the provider is having a bad day"
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    delay_s: float = 0.0  # before answering (a timeout test waits longer than the target's bound)
    drop_after_bytes: int | None = None  # a 200 whose connection is dropped after this many body bytes
    # A 200 stream that pauses: (after this many body bytes, for this many seconds), in order.
    stalls: "tuple[tuple[int, float], ...]" = ()
    code: str | None = None
    # A 200 stream whose event after message_start is an error of this type (Anthropic's overloaded_error, as it
    # sends one mid-stream), the stream then ending (FakeAnthropic).
    error_event: str | None = None


@contextlib.contextmanager
def each_test(servers: "dict[str, FakeProvider]") -> Any:
    """Around one test: every server's script, record and reply reset to its default ("Hello from NAME."), and
    after it, what any server got that its SDK would not send is the test's failure."""
    for server in servers.values():
        server.requests.clear()
        server.failures.clear()
        server.reply = (lambda name: lambda body: Reply(content=f"Hello from {name}."))(server.name)
    yield
    for server in servers.values():
        assert server.problems == [], f"{server.name} got requests its SDK would not send: {server.problems}"


def routed_node(config: str, directory: Any, log_dir: Any, name: str, env: "dict[str, str]",
                args: "tuple[str, ...]" = ()) -> Any:
    """A node (chaos.processes.NodeProcess) whose models config is ``config`` (TOML; written in ``directory``), its
    credentials' variables in ``env``."""
    from chaos.processes import NodeProcess

    path = directory / "models.toml"
    path.write_text(config)
    return NodeProcess([*args, "--models-config", str(path)], log_dir, name, env=env)


@contextlib.contextmanager
def started(servers: "dict[str, FakeProvider]") -> Any:
    """The servers for a module's tests, closed after them."""
    try:
        yield servers
    finally:
        for server in servers.values():
            server.close()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class FakeProvider:
    """The common part: a threaded HTTP/1.1 server, the script, the record of requests."""

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.problems: list[str] = []
        self.failures: list[Failure] = []
        self.abandoned = 0  # streams whose connection the gateway closed before their end
        self.reply: Callable[[Any], Reply] = lambda body: Reply(content=f"Hello from {name}.")
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                # What a node asks of an OpenAI-compatible HTTP worker: its health and its model.
                if self.path.split("?")[0] in ("/health", "/v1/models"):
                    owner.send_json(self, 200, {"object": "list", "data": [{"id": owner.name, "object": "model"}]})
                else:
                    owner.send_json(self, 404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length", "0"))
                raw = self.raw_body = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                    owner.problems.append(f"{self.path}: the body is not JSON")
                with owner._lock:
                    owner.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    failure = owner.failures.pop(0) if owner.failures else None
                try:
                    owner.handle(self, body, failure)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the gateway left first (a timeout it enforced): nothing to answer

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeProvider":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- answering helpers --
    @staticmethod
    def send_json(handler: Any, status: int, value: Any, headers: "dict[str, str] | None" = None) -> None:
        data = json.dumps(value).encode()
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            handler.send_header(k, v)
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def start_events(handler: Any) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()

    @staticmethod
    def send_chunk(handler: Any, data: bytes) -> None:
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        handler.wfile.flush()

    def send_events(self, handler: Any, pieces: "list[bytes]", failure: Failure | None) -> None:
        """A 200 stream of ``pieces``, its connection dropped where ``failure`` says."""
        self.start_events(handler)
        sent = 0
        stalls = list(failure.stalls) if failure is not None else []
        try:
            for piece in pieces:
                if failure is not None and failure.drop_after_bytes is not None and sent >= failure.drop_after_bytes:
                    handler.close_connection = True
                    handler.wfile.flush()
                    handler.connection.shutdown(2)
                    return
                while stalls and sent >= stalls[0][0]:
                    time.sleep(stalls.pop(0)[1])
                self.send_chunk(handler, piece)
                sent += len(piece)
            self.end_events(handler)
        except (BrokenPipeError, ConnectionResetError):  # the gateway closed the call before its end
            handler.close_connection = True
            self.abandoned += 1

    @staticmethod
    def end_events(handler: Any) -> None:
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    def fail(self, handler: Any, failure: Failure) -> bool:
        """Play ``failure`` when it is one (True: answered)."""
        if failure.delay_s:
            time.sleep(failure.delay_s)
        if failure.drop_after_bytes is not None or failure.status == 200:
            return False
        self.send_json(handler, failure.status, self.error_body(failure), failure.headers)
        return True

    def error_body(self, failure: Failure) -> Any:
        raise NotImplementedError

    def handle(self, handler: Any, body: Any, failure: Failure | None) -> None:
        raise NotImplementedError

    def check(self, value: Any, typ: Any, where: str) -> None:
        found = problems(value, typ, where)
        if found:
            self.problems.extend(found)


class FakeOpenAI(FakeProvider):
    """OpenAI's chat completions (and Azure's paths to them): requests checked against the openai SDK's
    ``CompletionCreateParams``, answers built as its ``ChatCompletion`` and ``ChatCompletionChunk``."""

    def error_body(self, failure: Failure) -> Any:
        return {"error": {"message": failure.message, "type": "server_error" if failure.status >= 500 else
                          "invalid_request_error", "param": None, "code": failure.code}}

    def handle(self, handler: Any, body: Any, failure: Failure | None) -> None:
        from openai.types.chat import completion_create_params as params

        path = handler.path.split("?")[0]
        if path.endswith("/embeddings") and isinstance(body, dict):
            self.embeddings(handler, path, body, failure)
            return
        if path.endswith("/responses") and isinstance(body, dict):
            self.responses(handler, body, failure)
            return
        if path.endswith("/classify") and isinstance(body, dict):
            self.classify(handler, body, failure)
            return
        if not (path.endswith("/chat/completions")):
            self.send_json(handler, 404, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}})
            return
        if not isinstance(body, dict):
            self.send_json(handler, 400, {"error": {"message": "not JSON", "type": "invalid_request_error"}})
            return
        stream = bool(body.get("stream"))
        checked = dict(body)
        if "/openai/deployments/" in path:  # Azure names the deployment in the path, not the body
            checked.setdefault("model", path.split("/openai/deployments/")[1].split("/")[0])
        self.check(checked, params.CompletionCreateParamsStreaming if stream else
                   params.CompletionCreateParamsNonStreaming, "chat.completions")
        if failure is not None and self.fail(handler, failure):
            return
        reply = self.reply(body)
        calls = [{"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                 for i, (name, args) in enumerate(reply.calls)]
        finish = reply.finish or ("tool_calls" if calls else "stop")
        usage = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                 "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                 "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
                 "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens}}
        model = body.get("model", "deployment")
        # n answers (the same, each its index in its text but the first), and logprobs as OpenAI shapes them.
        answers = [reply.content if k == 0 or reply.content is None else f"{reply.content} ({k})"
                   for k in range(body.get("n") or 1)]
        top = body.get("top_logprobs") or 0

        def logprobs(words: "list[str]") -> Any:
            if not body.get("logprobs"):
                return None
            entry = lambda word, rank: {"token": word, "logprob": -0.25 * (rank + 1), "bytes": list(word.encode())}
            return {"content": [{**entry(w, 0), "top_logprobs": [entry(w, r) for r in range(top)]} for w in words],
                    "refusal": None}

        if not stream:
            from openai.types.chat import ChatCompletion

            choices = []
            for k, content in enumerate(answers):
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = calls
                if reply.reasoning is not None:
                    message["reasoning_content"] = reply.reasoning  # compatible servers' (vLLM, DeepSeek)
                choices.append({"index": k, "message": message, "finish_reason": finish,
                                "logprobs": logprobs(_words(content or ""))})
            answer = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
                      "choices": choices, "usage": usage}
            ChatCompletion.model_validate(answer)
            self.send_json(handler, 200, answer)
            return
        from openai.types.chat import ChatCompletionChunk

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, with_usage: bool = False,
                  index: int = 0, words: "list[str] | None" = None) -> bytes:
            choice = {"index": index, "delta": delta, "finish_reason": finish_reason}
            if words is not None and body.get("logprobs"):
                choice["logprobs"] = logprobs(words)
            value = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model,
                     "choices": [] if with_usage else [choice]}
            if with_usage:
                value["usage"] = usage
            ChatCompletionChunk.model_validate(value)
            return b"data: " + json.dumps(value, separators=(",", ":")).encode() + b"\n\n"  # compact, as OpenAI's

        pieces = []
        for k, content in enumerate(answers):
            pieces.append(chunk({"role": "assistant", "content": ""}, index=k))
            if reply.reasoning:
                pieces += [chunk({"reasoning_content": word}, index=k) for word in _words(reply.reasoning)]
            if content:
                pieces += [chunk({"content": word}, index=k, words=[word]) for word in _words(content)]
        for i, call in enumerate(calls):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            pieces.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                                 "function": {"name": call["function"]["name"], "arguments": ""}}]}))
            pieces.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": arguments[:half]}}]}))
            pieces.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": arguments[half:]}}]}))
        pieces += [chunk({}, finish, index=k) for k in range(len(answers))]
        if (body.get("stream_options") or {}).get("include_usage"):
            pieces.append(chunk({}, with_usage=True))
        pieces.append(b"data: [DONE]\n\n")
        self.send_events(handler, pieces, failure)

    def classify(self, handler: Any, body: "dict[str, Any]", failure: Failure | None) -> None:
        """vLLM's /classify, as its server answers a sequence-classification model (an OpenAI-compatible worker's:
        OpenAI has none): each input's two labels' probabilities made from its text, the likelier label."""
        if failure is not None and self.fail(handler, failure):
            return
        raw = body.get("input")
        inputs = [raw] if isinstance(raw, str) else raw
        if not isinstance(inputs, list) or not inputs or not all(isinstance(item, str) for item in inputs):
            self.send_json(handler, 400, {"error": {"message": "input must be a string or strings",
                                                    "type": "BadRequestError"}})
            return
        data, tokens = [], 0
        for index, text in enumerate(inputs):
            tokens += len(text.split())
            positive = (len(text) % 10) / 10
            data.append({"index": index, "label": "positive" if positive > 0.5 else "negative",
                         "probs": [1 - positive, positive], "num_classes": 2})
        self.send_json(handler, 200, {"id": "classify-1", "object": "list", "created": 1, "model": body.get("model"),
                                      "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                                                              "completion_tokens": 0}})

    def embeddings(self, handler: Any, path: str, body: "dict[str, Any]", failure: Failure | None) -> None:
        """OpenAI's embeddings: the request checked as ``EmbeddingCreateParams``; each input's vector made from its
        text (``dimensions`` long, 4 by default), base64 float32 when asked; the usage one token a word or id."""
        from openai.types import CreateEmbeddingResponse, embedding_create_params

        checked = dict(body)
        if "/openai/deployments/" in path:
            checked.setdefault("model", path.split("/openai/deployments/")[1].split("/")[0])
        self.check(checked, embedding_create_params.EmbeddingCreateParams, "embeddings")
        if failure is not None and self.fail(handler, failure):
            return
        raw = body["input"]
        inputs = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else raw
        size = body.get("dimensions") or 4
        data, tokens = [], 0
        for index, item in enumerate(inputs):
            text = item if isinstance(item, str) else " ".join(map(str, item))
            tokens += len(text.split())
            vector = [((len(text) * (k + 1)) % 97) / 97.0 for k in range(size)]
            encoded: Any = vector
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        answer = {"object": "list", "data": data, "model": checked["model"],
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        if body.get("encoding_format") != "base64":
            CreateEmbeddingResponse.model_validate(answer)
        self.send_json(handler, 200, answer)


    def responses(self, handler: Any, body: "dict[str, Any]", failure: Failure | None) -> None:
        """OpenAI's Responses API: the request checked as ``ResponseCreateParams``; the answer a ``Response`` (a
        reasoning item with its summary, the message, the function calls), streamed as its typed events."""
        from openai.types.responses import Response, ResponseStreamEvent, response_create_params as params
        from pydantic import TypeAdapter

        stream = bool(body.get("stream"))
        self.check(body, params.ResponseCreateParamsStreaming if stream else params.ResponseCreateParamsNonStreaming,
                   "responses")
        if failure is not None and self.fail(handler, failure):
            return
        reply = self.reply(body)
        output: list[dict[str, Any]] = []
        if reply.reasoning is not None:
            output.append({"id": "rs_1", "type": "reasoning", "status": "completed",
                           "summary": [{"type": "summary_text", "text": reply.reasoning}]})
        if reply.content is not None:
            output.append({"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": reply.content, "annotations": []}]})
        for i, (name, args) in enumerate(reply.calls):
            output.append({"id": f"fc_{i}", "type": "function_call", "call_id": f"call_{i}", "name": name,
                           "arguments": json.dumps(args), "status": "completed"})
        incomplete = reply.finish == "length"
        response = {"id": "resp_fake", "object": "response", "created_at": 1, "model": body["model"],
                    "status": "incomplete" if incomplete else "completed",
                    "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                    "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
                    "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
                    "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
                              "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                              "input_tokens_details": {"cached_tokens": reply.cached_tokens, "cache_write_tokens": 0},
                              "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens}}}
        Response.model_validate(response)
        if not stream:
            self.send_json(handler, 200, response)
            return
        events = TypeAdapter(ResponseStreamEvent)
        sequence = iter(range(1_000_000))

        def event(value: dict[str, Any]) -> bytes:
            value = {**value, "sequence_number": next(sequence)}
            events.validate_python(value)
            return b"event: " + value["type"].encode() + b"\ndata: " + json.dumps(value).encode() + b"\n\n"

        pieces = [event({"type": "response.created", "response": {**response, "status": "in_progress",
                                                                  "output": [], "usage": None}})]
        for index, item in enumerate(output):
            pieces.append(event({"type": "response.output_item.added", "output_index": index,
                                 "item": {**item, "status": "in_progress"} if item["type"] != "reasoning" else
                                 {**item, "summary": []}}))
            if item["type"] == "reasoning":
                text = item["summary"][0]["text"]
                pieces.append(event({"type": "response.reasoning_summary_part.added", "item_id": item["id"],
                                     "output_index": index, "summary_index": 0,
                                     "part": {"type": "summary_text", "text": ""}}))
                pieces += [event({"type": "response.reasoning_summary_text.delta", "item_id": item["id"],
                                  "output_index": index, "summary_index": 0, "delta": word})
                           for word in _words(text)]
            elif item["type"] == "message":
                pieces += [event({"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                                  "content_index": 0, "delta": word, "logprobs": []})
                           for word in _words(item["content"][0]["text"])]
            else:
                half = len(item["arguments"]) // 2
                pieces += [event({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                                  "output_index": index, "delta": part})
                           for part in (item["arguments"][:half], item["arguments"][half:])]
            pieces.append(event({"type": "response.output_item.done", "output_index": index, "item": item}))
        pieces.append(event({"type": "response.incomplete" if incomplete else "response.completed",
                             "response": response}))
        self.send_events(handler, pieces, failure)


def _words(text: str) -> list[str]:
    """Text in stream-sized pieces (a word and its space)."""
    out, current = [], ""
    for ch in text:
        current += ch
        if ch == " ":
            out.append(current)
            current = ""
    if current:
        out.append(current)
    return out


class FakeAnthropic(FakeProvider):
    """Anthropic's Messages API: requests checked against the anthropic SDK's ``MessageCreateParams`` (and its
    x-api-key and anthropic-version headers), answers built as its ``Message`` and stream events."""

    signature = "sig-fake-thinking"

    def error_body(self, failure: Failure) -> Any:
        kind = {429: "rate_limit_error", 529: "overloaded_error", 400: "invalid_request_error",
                401: "authentication_error", 404: "not_found_error"}.get(failure.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": failure.message}}

    def handle(self, handler: Any, body: Any, failure: Failure | None) -> None:
        from anthropic.types import message_create_params as params

        if handler.path != "/v1/messages":
            self.send_json(handler, 404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}})
            return
        # The key as x-api-key (the gateway sends it so) or a bearer token (the anthropic SDK's own since 2.x).
        keyed = handler.headers.get("x-api-key") or handler.headers.get("authorization", "").startswith("Bearer ")
        if not keyed or not handler.headers.get("anthropic-version"):
            self.problems.append("/v1/messages: no x-api-key or anthropic-version header")
        stream = bool(body.get("stream"))
        self.check(body, params.MessageCreateParamsStreaming if stream else params.MessageCreateParamsNonStreaming,
                   "messages")
        roles = [m.get("role") for m in body.get("messages", [])]
        if any(a == b for a, b in zip(roles, roles[1:])) or (roles and roles[0] != "user"):
            self.problems.append(f"messages: roles must alternate from user, got {roles}")
        if failure is not None and self.fail(handler, failure):
            return
        reply = self.reply(body)
        blocks: list[dict[str, Any]] = []
        if reply.reasoning:
            blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": self.signature})
        if reply.content:
            blocks.append({"type": "text", "text": reply.content, "citations": None})
        for i, (name, args) in enumerate(reply.calls):
            blocks.append({"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args})
        if reply.blocks is not None:
            blocks = reply.blocks
        called = any(block["type"] == "tool_use" for block in blocks)
        stop = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}.get(
            reply.finish or ("tool_calls" if called else "stop"), "end_turn")
        usage = {"input_tokens": reply.prompt_tokens - reply.cached_tokens, "output_tokens": reply.completion_tokens,
                 "cache_read_input_tokens": reply.cached_tokens, "cache_creation_input_tokens": 0}
        message = {"id": "msg_fake", "type": "message", "role": "assistant", "model": body.get("model"),
                   "content": blocks, "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not stream:
            from anthropic.types import Message

            Message.model_validate(message)
            self.send_json(handler, 200, message)
            return
        from anthropic.types import RawMessageStreamEvent
        from pydantic import TypeAdapter

        events = TypeAdapter(RawMessageStreamEvent)

        def event(value: dict[str, Any]) -> bytes:
            events.validate_python(value)
            return b"event: " + value["type"].encode() + b"\ndata: " + json.dumps(value).encode() + b"\n\n"

        pieces = [event({"type": "message_start", "message": {**message, "content": [], "stop_reason": None,
                                                               "usage": {**usage, "output_tokens": 1}}}),
                  b"event: ping\ndata: {\"type\": \"ping\"}\n\n"]
        if failure is not None and failure.error_event:
            pieces.append(b"event: error\ndata: " + json.dumps({"type": "error", "error": {
                "type": failure.error_event, "message": failure.message}}).encode() + b"\n\n")  # (no stream event type)
            blocks = []
        for index, block in enumerate(blocks):
            if block["type"] == "thinking":
                pieces.append(event({"type": "content_block_start", "index": index,
                                     "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
                pieces += [event({"type": "content_block_delta", "index": index,
                                  "delta": {"type": "thinking_delta", "thinking": w}})
                           for w in _words(block["thinking"])]
                pieces.append(event({"type": "content_block_delta", "index": index,
                                     "delta": {"type": "signature_delta", "signature": block["signature"]}}))
            elif block["type"] == "redacted_thinking":  # whole in its start, as Anthropic sends it
                pieces.append(event({"type": "content_block_start", "index": index, "content_block": block}))
            elif block["type"] == "text":
                pieces.append(event({"type": "content_block_start", "index": index,
                                     "content_block": {"type": "text", "text": ""}}))
                pieces += [event({"type": "content_block_delta", "index": index,
                                  "delta": {"type": "text_delta", "text": w}}) for w in _words(block["text"])]
            else:
                pieces.append(event({"type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
                text = json.dumps(block["input"])
                pieces += [event({"type": "content_block_delta", "index": index,
                                  "delta": {"type": "input_json_delta", "partial_json": part}})
                           for part in (text[:len(text) // 2], text[len(text) // 2:])]
            pieces.append(event({"type": "content_block_stop", "index": index}))
        if not (failure is not None and failure.error_event):
            pieces.append(event({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": reply.completion_tokens}}))
            pieces.append(event({"type": "message_stop"}))
        self.send_events(handler, pieces, failure)


class FakeGemini(FakeProvider):
    """Google Gemini's generateContent and streamGenerateContent (alt=sse): each part of a request held to the
    google-genai SDK's own models (camelCase, unknown fields refused), answers built as its
    ``GenerateContentResponse``. A function call's part carries a thought signature, as Gemini's thinking models
    sign theirs; ``signatures`` keeps the ones sent back."""

    signature = "c2lnbmF0dXJlLWZha2U="
    BODY_KEYS = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings",
                 "cachedContent"}

    def error_body(self, failure: Failure) -> Any:
        status = {429: "RESOURCE_EXHAUSTED", 400: "INVALID_ARGUMENT", 500: "INTERNAL", 503: "UNAVAILABLE"}.get(
            failure.status, "UNKNOWN")
        error: dict[str, Any] = {"code": failure.status, "message": failure.message, "status": status}
        if failure.status == 429 and "retry-after" not in failure.headers:
            error["details"] = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "20s"}]
        return {"error": error}

    def _check_body(self, body: Any) -> None:
        from google.genai import types

        unknown = set(body) - self.BODY_KEYS
        if unknown:
            self.problems.append(f"generateContent: unknown fields {sorted(unknown)}")
        for key, model in (("systemInstruction", types.Content), ("toolConfig", types.ToolConfig),
                           ("generationConfig", types.GenerationConfig)):
            if key in body:
                try:
                    model.model_validate(body[key])
                except Exception as e:
                    self.problems.append(f"generateContent.{key}: {e}")
        for key, model in (("contents", types.Content), ("tools", types.Tool)):
            for i, item in enumerate(body.get(key) or ()):
                try:
                    model.model_validate(item)
                except Exception as e:
                    self.problems.append(f"generateContent.{key}[{i}]: {e}")
        for content in body.get("contents") or ():
            if content.get("role") not in ("user", "model"):
                self.problems.append(f"generateContent.contents: role {content.get('role')!r}")

    def handle(self, handler: Any, body: Any, failure: Failure | None) -> None:
        from google.genai import types

        path, _, query = handler.path.partition("?")
        stream = path.endswith(":streamGenerateContent")
        if not (path.startswith("/v1beta/models/") and (stream or path.endswith(":generateContent"))):
            self.send_json(handler, 404, {"error": {"code": 404, "message": "no", "status": "NOT_FOUND"}})
            return
        if stream and query != "alt=sse":
            self.problems.append(f"{handler.path}: a stream is asked for as server-sent events (alt=sse)")
        if not handler.headers.get("x-goog-api-key"):
            self.problems.append(f"{handler.path}: no x-goog-api-key")
        self._check_body(body)
        self.signatures = [part.get("thoughtSignature") for content in body.get("contents") or ()
                           for part in content.get("parts") or () if "functionCall" in part]
        if failure is not None and self.fail(handler, failure):
            return
        reply = self.reply(body)
        parts: list[dict[str, Any]] = []
        if reply.reasoning:
            parts.append({"text": reply.reasoning, "thought": True})
        if reply.content:
            parts.append({"text": reply.content})
        for name, args in reply.calls:
            parts.append({"functionCall": {"name": name, "args": args}, "thoughtSignature": self.signature})
        finish = {"stop": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}.get(reply.finish or "stop",
                                                                                          "STOP")
        usage = {"promptTokenCount": reply.prompt_tokens, "candidatesTokenCount": reply.completion_tokens,
                 "totalTokenCount": reply.prompt_tokens + reply.completion_tokens + reply.reasoning_tokens,
                 "cachedContentTokenCount": reply.cached_tokens, "thoughtsTokenCount": reply.reasoning_tokens}
        model = path.split("/v1beta/models/")[1].split(":")[0]

        def answer(answer_parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": answer_parts}, "index": 0}
            if last:
                candidate["finishReason"] = finish
            value = {"candidates": [candidate], "modelVersion": model, "responseId": "fake"}
            if last:
                value["usageMetadata"] = usage
            types.GenerateContentResponse.model_validate(value)
            return value

        if not stream:
            self.send_json(handler, 200, answer(parts, True))
            return
        pieces = []
        for part in parts:
            if "text" in part:
                pieces += [{**part, "text": word} for word in _words(part["text"])]
            else:
                pieces.append(part)
        self.start_events(handler)
        for i, piece in enumerate(pieces):
            self.send_chunk(handler, b"data: " + json.dumps(answer([piece], i == len(pieces) - 1)).encode() +
                            b"\r\n\r\n")
        self.end_events(handler)


AWS_KEYS = {"AWS_ACCESS_KEY_ID": "AKIDFAKEEXAMPLE", "AWS_SECRET_ACCESS_KEY": "fake-secret-access-key",
            "AWS_SESSION_TOKEN": "fake-session-token", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}


def event_message(headers: "dict[str, str]", payload: bytes) -> bytes:
    """One message of AWS's event stream (string headers only, as Bedrock's are), checked by botocore's own
    decoder before it is sent."""
    import struct
    import zlib

    from botocore.eventstream import EventStreamBuffer

    encoded = b"".join(bytes([len(k)]) + k.encode() + b"\x07" + struct.pack(">H", len(v)) + v.encode()
                       for k, v in headers.items())
    total = 16 + len(encoded) + len(payload)
    prelude = struct.pack(">II", total, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    message += struct.pack(">I", zlib.crc32(message))
    buffer = EventStreamBuffer()
    buffer.add_data(message)
    assert [m.payload for m in buffer] == [payload]
    return message


class FakeBedrock(FakeProvider):
    """AWS Bedrock's Converse and ConverseStream: the SigV4 signature checked again with botocore (the region and
    credentials of ``AWS_KEYS``), the body held to botocore's bedrock-runtime service model, answers parsed by its
    rest-json parser, streams as AWS event stream messages botocore decodes."""

    region = "us-east-1"

    def error_body(self, failure: Failure) -> Any:
        return {"message": failure.message}

    def fail(self, handler: Any, failure: Failure) -> bool:
        exception = {429: "ThrottlingException", 400: "ValidationException", 503: "ServiceUnavailableException",
                     500: "InternalServerException", 403: "AccessDeniedException"}.get(failure.status)
        if exception and "x-amzn-errortype" not in {k.lower() for k in failure.headers}:
            failure.headers = {**failure.headers, "x-amzn-ErrorType": f"{exception}:http://internal.amazon.com/"}
        return super().fail(handler, failure)

    def _check_signature(self, handler: Any, raw_headers: "dict[str, str]", body: bytes) -> None:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        given = raw_headers.get("authorization", "")
        signed = given.split("SignedHeaders=")[1].split(",")[0].split(";") if "SignedHeaders=" in given else []
        url = f"http://127.0.0.1:{self.port}{handler.path}"
        request = AWSRequest(method="POST", url=url, data=body,
                             headers={k: v for k, v in raw_headers.items() if k in signed and k != "host"})
        request.context["timestamp"] = raw_headers.get("x-amz-date", "")
        auth = SigV4Auth(Credentials(AWS_KEYS["AWS_ACCESS_KEY_ID"], AWS_KEYS["AWS_SECRET_ACCESS_KEY"],
                                     AWS_KEYS["AWS_SESSION_TOKEN"]), "bedrock", self.region)
        expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
        if f"Signature={expected}" not in given or "/bedrock/aws4_request" not in given:
            self.problems.append(f"{handler.path}: the SigV4 signature does not verify ({given[:80]}...)")
        if raw_headers.get("x-amz-security-token") != AWS_KEYS["AWS_SESSION_TOKEN"]:
            self.problems.append(f"{handler.path}: no session token with the temporary credentials")

    def handle(self, handler: Any, body: Any, failure: Failure | None) -> None:
        import urllib.parse

        import botocore.session
        from botocore.validate import ParamValidator

        path = handler.path
        stream = path.endswith("/converse-stream")
        if not (path.startswith("/model/") and (stream or path.endswith("/converse"))):
            self.send_json(handler, 404, {"message": "no such route"})
            return
        model = urllib.parse.unquote(path[len("/model/"):].rsplit("/", 1)[0])
        self._check_signature(handler, {k.lower(): v for k, v in handler.headers.items()}, handler.raw_body)
        service = botocore.session.get_session().get_service_model("bedrock-runtime")
        operation = service.operation_model("ConverseStream" if stream else "Converse")
        report = ParamValidator().validate({"modelId": model, **body}, operation.input_shape)
        if report.has_errors():
            self.problems.append(f"{path}: {report.generate_report()}")
        roles = [m.get("role") for m in body.get("messages", [])]
        if any(r not in ("user", "assistant") for r in roles) or any(a == b for a, b in zip(roles, roles[1:])):
            self.problems.append(f"{path}: roles must alternate user and assistant, got {roles}")
        if failure is not None and self.fail(handler, failure):
            return
        reply = self.reply(body)
        blocks: list[dict[str, Any]] = []
        if reply.reasoning:
            blocks.append({"reasoningContent": {"reasoningText": {"text": reply.reasoning,
                                                                  "signature": "sig-bedrock"}}})
        if reply.content:
            blocks.append({"text": reply.content})
        for i, (name, args) in enumerate(reply.calls):
            blocks.append({"toolUse": {"toolUseId": f"tooluse_{i}", "name": name, "input": args}})
        if reply.blocks is not None:  # Anthropic's form, as Bedrock's Claude models give them
            blocks = [_converse_block(block) for block in reply.blocks]
        stop = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}.get(
            reply.finish or ("tool_calls" if reply.calls or any("toolUse" in b for b in blocks) else "stop"),
            "end_turn")
        usage = {"inputTokens": reply.prompt_tokens - reply.cached_tokens, "outputTokens": reply.completion_tokens,
                 "totalTokens": reply.prompt_tokens + reply.completion_tokens,
                 "cacheReadInputTokens": reply.cached_tokens, "cacheWriteInputTokens": 0}
        if not stream:
            from botocore.parsers import create_parser

            answer = {"output": {"message": {"role": "assistant", "content": blocks}}, "stopReason": stop,
                      "usage": usage, "metrics": {"latencyMs": 12}}
            data = json.dumps(answer).encode()
            create_parser("rest-json").parse({"status_code": 200, "headers": {}, "body": data},
                                             operation.output_shape)
            self.send_json(handler, 200, answer)
            return

        def event(kind: str, value: dict[str, Any]) -> bytes:
            return event_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                                 json.dumps(value).encode())

        pieces = [event("messageStart", {"role": "assistant"})]
        for index, block in enumerate(blocks):
            if "text" in block:
                pieces += [event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"text": w}})
                           for w in _words(block["text"])]
            elif "redactedContent" in block.get("reasoningContent", {}):  # one delta, whole
                pieces.append(event("contentBlockDelta", {"contentBlockIndex": index, "delta": {
                    "reasoningContent": {"redactedContent": block["reasoningContent"]["redactedContent"]}}}))
            elif "reasoningContent" in block:
                thought = block["reasoningContent"]["reasoningText"]["text"]
                pieces += [event("contentBlockDelta", {"contentBlockIndex": index, "delta": {
                    "reasoningContent": {"text": w}}}) for w in _words(thought)]
                pieces.append(event("contentBlockDelta", {"contentBlockIndex": index, "delta": {  # its signature last
                    "reasoningContent": {"signature": block["reasoningContent"]["reasoningText"]["signature"]}}}))
            else:
                use = block["toolUse"]
                pieces.append(event("contentBlockStart", {"contentBlockIndex": index, "start": {
                    "toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}}))
                text = json.dumps(use["input"])
                pieces += [event("contentBlockDelta", {"contentBlockIndex": index,
                                                       "delta": {"toolUse": {"input": part}}})
                           for part in (text[:len(text) // 2], text[len(text) // 2:])]
            pieces.append(event("contentBlockStop", {"contentBlockIndex": index}))
        pieces.append(event("messageStop", {"stopReason": stop}))
        pieces.append(event("metadata", {"usage": usage, "metrics": {"latencyMs": 12}}))
        handler.send_response(200)
        handler.send_header("content-type", "application/vnd.amazon.eventstream")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        for piece in pieces:
            self.send_chunk(handler, piece)
        self.end_events(handler)


def _converse_block(block: "dict[str, Any]") -> "dict[str, Any]":
    """An Anthropic content block as Converse's (Reply.blocks for FakeBedrock); a redacted block's data is a blob,
    base64 in the JSON protocol."""
    if block["type"] == "thinking":
        return {"reasoningContent": {"reasoningText": {"text": block["thinking"], "signature": block["signature"]}}}
    if block["type"] == "redacted_thinking":
        return {"reasoningContent": {"redactedContent": block["data"]}}
    if block["type"] == "tool_use":
        return {"toolUse": {"toolUseId": block["id"], "name": block["name"], "input": block["input"]}}
    return {"text": block["text"]}

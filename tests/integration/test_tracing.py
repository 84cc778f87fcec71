"""Tracing (--enable-trace) into real OTLP receivers: a gRPC TraceService and an OTLP/HTTP endpoint, each
decoding OpenTelemetry's protobuf messages. A client's request, with its own W3C traceparent, yields one
trace: the node's server span as the child of the client's, and the steps as its children (authentication,
template and tokens, the engine attempt with its time to first token). A collector that is away costs
dropped or failed spans, counted, and no request time."""

from __future__ import annotations

import concurrent.futures
import http.server
import threading
import time

import grpc
import httpx2
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from chaos.processes import EngineProcess, NodeProcess

from tests.support.fake_providers import FakeOpenAI
from tests.support.real_servers import free_port
from tests.support.nodes import MODEL
from tests.support.node_pairs import mesh_args, start_pair
from tests.support.waiting import eventually

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


class Receiver:
    """What an OTLP collector received: every span, by trace id."""

    def __init__(self) -> None:
        self.spans: list = []
        self.resources: list = []
        self._lock = threading.Lock()

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(span)
                        self.resources.append(attributes)

    def trace(self, trace_id: str, names: "set[str]", timeout_s: float = 15.0) -> dict:
        """The spans of ``trace_id`` by name, once every name in ``names`` arrived."""
        def arrived():
            with self._lock:
                found = {s.name: s for s in self.spans if s.trace_id.hex() == trace_id}
            assert names <= set(found), f"spans of {trace_id}: {sorted(found)}, wanted {sorted(names)}"
            return found

        return eventually(arrived, timeout_s, "the trace's spans")


class GrpcCollector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):  # noqa: N802 (the service's method name)
        self.receiver.take(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture(scope="module")
def grpc_collector():
    receiver = Receiver()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(GrpcCollector(receiver), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, f"127.0.0.1:{port}"
    server.stop(0)


@pytest.fixture(scope="module")
def http_collector():
    receiver = Receiver()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["content-length"]))
            assert self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
            receiver.take(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield receiver, f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()


@pytest.fixture(scope="module")
def engine(log_dir):
    e = EngineProcess(["--zero-cost"], log_dir, "trace-engine")
    yield e
    e.stop()


@pytest.mark.parametrize("collector", ["grpc_collector", "http_collector"])
def test_one_request_is_one_trace_under_the_clients(request, collector, engine, log_dir):
    receiver, endpoint = request.getfixturevalue(collector)
    client = ["--grpc-client", "grpcio"] if collector == "http_collector" else []  # both engine clients send it
    node = NodeProcess(["--worker-urls", engine.url, "--enable-trace", "--otlp-traces-endpoint", endpoint, *client],
                       log_dir, f"trace-node-{collector}")
    try:
        for stream in (False, True):
            trace_id = TRACE_ID[:-1] + ("1" if stream else "0")
            headers = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN_ID}-01", "tracestate": "vendor=abc"}
            r = httpx2.post(node.url + "/v1/chat/completions", json={**CHAT, "stream": stream}, headers=headers,
                            timeout=30)
            assert r.status_code == 200
            steps = {"POST /v1/chat/completions", "authenticate", "tokenize", "engine.generate"}
            spans = receiver.trace(trace_id, steps | {"parse"})  # a whole answer, or a stream's pieces, parsed
            root = spans["POST /v1/chat/completions"]
            assert root.parent_span_id.hex() == CLIENT_SPAN_ID and root.kind == root.SPAN_KIND_SERVER
            attributes = {a.key: a.value for a in root.attributes}
            assert attributes["http.response.status_code"].int_value == 200
            for name in ("authenticate", "tokenize", "engine.generate"):
                assert spans[name].parent_span_id == root.span_id, name
                assert root.start_time_unix_nano <= spans[name].start_time_unix_nano <= root.end_time_unix_nano
            # The engine got the attempt's context in the call's metadata (the simulated engine logs it).
            context = f"in trace 00-{trace_id}-{spans['engine.generate'].span_id.hex()}-01 state vendor=abc"
            eventually(lambda: context in engine.log_text(), 10, f"the engine did not get {context}")
            attempt = {a.key: a.value for a in spans["engine.generate"].attributes}
            assert spans["engine.generate"].kind == root.SPAN_KIND_CLIENT
            assert attempt["smg.worker.url"].string_value == engine.url and attempt["smg.attempt"].int_value == 1
            assert attempt["gen_ai.usage.output_tokens"].int_value == 4 and "smg.cached_tokens" in attempt
            assert attempt["smg.policy"].string_value == "cache_aware"
            if stream:
                assert attempt["smg.ttft_s"].double_value > 0
                parse = {a.key: a.value for a in spans["parse"].attributes}  # one span over the stream's pieces
                assert spans["parse"].parent_span_id == root.span_id and parse["smg.parse_pieces"].int_value >= 2
                assert 0 < parse["smg.parse_s"].double_value
                assert spans["engine.generate"].start_time_unix_nano <= spans["parse"].start_time_unix_nano \
                    <= spans["parse"].end_time_unix_nano <= root.end_time_unix_nano
        # A request without a traceparent starts its own trace; a malformed one is ignored, never a failure.
        r = httpx2.post(node.url + "/v1/chat/completions", json=CHAT, headers={"traceparent": "00-zz-" + "x" * 200},
                        timeout=30)
        assert r.status_code == 200
        resource = receiver.resources[0]
        assert resource["service.name"] == "smg-node" and resource["service.instance.id"]
    finally:
        node.stop()


def test_a_collector_that_is_away_costs_counted_spans_not_request_time(engine, log_dir):
    away = f"127.0.0.1:{free_port()}"  # nothing listens there
    node = NodeProcess(["--worker-urls", engine.url, "--enable-trace", "--otlp-traces-endpoint", away,
                        "--trace-export-timeout-secs", "1"], log_dir, "trace-node-away")
    plain = NodeProcess(["--worker-urls", engine.url], log_dir, "trace-node-plain")
    try:
        with httpx2.Client(timeout=30) as client:
            for url in (node.url, plain.url):  # warm both
                client.post(url + "/v1/chat/completions", json=CHAT)
            timings = {}
            for url in (node.url, plain.url):
                started = time.perf_counter()
                for _ in range(30):
                    assert client.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
                timings[url] = time.perf_counter() - started
        # Not a timing test of the tracer's cost (BENCHMARKS.md measures that): an exporter that waited on
        # the collector would take its timeout, a second, per request here.
        assert timings[node.url] < 30 * 0.5, timings

        def lost() -> float:
            text = httpx2.get(node.url + "/metrics").text
            return sum(float(line.split()[1]) for line in text.splitlines()
                       if line.startswith("smg_trace_spans_total{") and 'outcome="exported"' not in line)

        eventually(lambda: lost() > 0, 20, "no span counted as failed or dropped", interval_s=0.2)
    finally:
        node.stop()
        plain.stop()


def traced_pair(engine, endpoint: str, log_dir, name: str, extra: "list[str]") -> list:
    """Two meshed nodes (t0, t1) tracing to ``endpoint``, once each sees the other."""
    return start_pair(lambda i, ports: ["--worker-urls", engine.url, "--enable-trace", "--otlp-traces-endpoint",
                                        endpoint, *mesh_args(i, ports, "t"), *extra], log_dir, name)


def cross_node(receiver: Receiver, trace_id: str, served: str, timeout_s: float = 15.0):
    """(a ``served`` span of one node, the peer.request span of the other node that is its parent), once
    both arrived; each with its node's name as ``.node``."""
    def pair():
        with receiver._lock:
            spans = [(s, res["service.instance.id"]) for s, res in zip(receiver.spans, receiver.resources)
                     if s.trace_id.hex() == trace_id]
        callers = {s.span_id: (s, node) for s, node in spans if s.name == "peer.request"}
        for s, node in spans:
            caller = callers.get(s.parent_span_id) if s.name == served else None
            if caller is not None and caller[1] != node:
                return _Noded(s, node), _Noded(*caller)
        raise AssertionError(f"{sorted((s.name, node) for s, node in spans)}")

    return eventually(pair, timeout_s, f"no {served} span under another node's peer.request")


class _Noded:
    def __init__(self, span, node: str) -> None:
        self.span, self.node = span, node

    def __getattr__(self, name):
        return getattr(self.span, name)


def test_a_history_write_replicated_to_the_other_node_is_in_the_same_trace(grpc_collector, engine, log_dir):
    """The trace context travels in the peer-request frame: the stored response's replica, written by the
    other node, is a server span there, the child of this node's peer.request."""
    receiver, endpoint = grpc_collector
    nodes = traced_pair(engine, endpoint, log_dir, "trace-mesh", [])
    try:
        trace_id = "5" * 32
        r = httpx2.post(nodes[0].url + "/v1/responses", json={"model": MODEL, "input": "hello", "max_output_tokens": 4},
                        headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN_ID}-01"}, timeout=30)
        assert r.status_code == 200
        spans = receiver.trace(trace_id, {"POST /v1/responses", "history.put_response", "peer.request", "peer.history"})
        assert spans["history.put_response"].parent_span_id == spans["POST /v1/responses"].span_id
        # Whichever node holds the response first (its id's place on the ring), the other one served a peer
        # request in this trace: its server span's parent is the caller's client span.
        remote, caller = cross_node(receiver, trace_id, "peer.history")
        assert remote.kind == remote.SPAN_KIND_SERVER and caller.kind == caller.SPAN_KIND_CLIENT
    finally:
        for n in nodes:
            n.stop()


def test_a_rate_limit_decided_by_the_keys_owner_is_in_the_same_trace(grpc_collector, engine, log_dir, tmp_path):
    from gateway.ratelimit.limits import Identity
    from mesh.ring import HashRing

    receiver, endpoint = grpc_collector
    limits = tmp_path / "limits.toml"
    limits.write_text('[[limits]]\nname = "per-key"\nscope = "api_key"\nlimit = 100\nburst = 10\n')
    ring = HashRing.build(["t0", "t1"])
    key = next(k for k in (f"sk-trace-{i}" for i in range(100))
               if ring.owner(f"per-key:{Identity.hash_api_key('Bearer ' + k)}") == "t1")  # owned by the other node
    nodes = traced_pair(engine, endpoint, log_dir, "trace-limits", ["--rate-limits", str(limits)])
    try:
        trace_id = "6" * 32
        r = httpx2.post(nodes[0].url + "/v1/chat/completions", json=CHAT, timeout=30, headers={
            "traceparent": f"00-{trace_id}-{CLIENT_SPAN_ID}-01", "authorization": f"Bearer {key}"})
        assert r.status_code == 200
        remote, caller = cross_node(receiver, trace_id, "peer.rate_limit")
        assert (remote.node, caller.node) == ("t1", "t0")  # the key's owner decided, in the caller's trace
    finally:
        for n in nodes:
            n.stop()


def test_an_http_worker_gets_the_attempts_context_and_the_clients_tracestate(grpc_collector, engine, log_dir):
    """The HTTP worker here is another node (an OpenAI-compatible worker), tracing into the same collector: its
    request is the child of the front node's attempt on it, with the client's tracestate carried along."""
    receiver, endpoint = grpc_collector
    back = NodeProcess(["--worker-urls", engine.url, "--enable-trace", "--otlp-traces-endpoint", endpoint,
                        "--node-name", "back"], log_dir, "trace-back")
    front = NodeProcess(["--worker-urls", back.url, "--enable-trace", "--otlp-traces-endpoint", endpoint],
                        log_dir, "trace-front")
    try:
        trace_id = TRACE_ID[:-2] + "e1"
        r = httpx2.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30, headers={
            "traceparent": f"00-{trace_id}-{CLIENT_SPAN_ID}-01", "tracestate": "vendor=abc,other=1"})
        assert r.status_code == 200, r.text
        def both_requests():  # both nodes' request spans (each node exports its own batches)
            with receiver._lock:
                found = [s for s in receiver.spans if s.trace_id.hex() == trace_id
                         and s.name == "POST /v1/chat/completions"]
            assert len(found) == 2, f"request spans of {trace_id}: {len(found)}"
            return found

        requests = eventually(both_requests, 15, "both nodes' request spans")
        by_parent = {s.parent_span_id.hex(): s for s in requests}
        outer = by_parent[CLIENT_SPAN_ID]  # the front node's, under the client's span
        inner = next(s for s in requests if s is not outer)  # the back node's
        with receiver._lock:
            parent = next(s for s in receiver.spans if s.span_id == inner.parent_span_id)
        assert (parent.name, parent.kind, parent.parent_span_id) == \
            ("engine.generate", parent.SPAN_KIND_CLIENT, outer.span_id)  # the front's attempt on its HTTP worker
        assert inner.trace_state == "vendor=abc,other=1" and outer.trace_state == "vendor=abc,other=1"
    finally:
        front.stop()
        back.stop()


def test_a_provider_attempt_is_a_client_span_with_its_target_and_usage(grpc_collector, log_dir, tmp_path):
    receiver, endpoint = grpc_collector
    with FakeOpenAI("traced") as provider:
        config = tmp_path / "models.toml"
        config.write_text(f'[targets.t]\nprovider = "openai"\nmodel = "gpt-traced"\nbase_url = "{provider.url}/v1"\n'
                          'credential = "env:TRACED_KEY"\n[models.routed]\ntargets = ["t"]\n')
        node = NodeProcess(["--models-config", str(config), "--enable-trace", "--otlp-traces-endpoint", endpoint],
                           log_dir, "trace-provider-node", env={"TRACED_KEY": "sk-traced"})
        try:
            for stream in (False, True):
                trace_id = TRACE_ID[:-2] + ("a1" if stream else "a0")
                r = httpx2.post(node.url + "/v1/chat/completions", json={**CHAT, "model": "routed", "stream": stream},
                                headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN_ID}-01"}, timeout=30)
                assert r.status_code == 200
                spans = receiver.trace(trace_id, {"POST /v1/chat/completions", "provider.call"})
                call = spans["provider.call"]
                attributes = {a.key: a.value for a in call.attributes}
                assert call.kind == call.SPAN_KIND_CLIENT
                assert call.parent_span_id == spans["POST /v1/chat/completions"].span_id
                assert attributes["smg.target"].string_value == "t" and attributes["smg.provider"].string_value == \
                    "openai" and attributes["gen_ai.request.model"].string_value == "gpt-traced"
                assert attributes["gen_ai.usage.output_tokens"].int_value == 7
            # The access log names the target that answered.
            assert "POST /v1/chat/completions 200" in node.log_text() and "target=t" in node.log_text()
            assert "sk-traced" not in node.log_text()
        finally:
            node.stop()

"""Kubernetes service discovery (issue 35), against a local API server that lists and watches as the real one
documents (tests/support/kube_api_server.py: TLS, bearer tokens, resourceVersion, bookmarks, 410, chunked watches), with
simulated engines behind the pod IPs (127.0.0.x, one port) and real smg-node processes."""

from __future__ import annotations

import base64
import json
import re
import threading
import urllib.parse

import httpx2
import pytest

from chaos.processes import EngineProcess, NodeProcess

from tests.support.kube_api_server import FakeKubeApi
from tests.support.certs import CertAuthority
from tests.support.node_pairs import mesh_args
from tests.support.waiting import eventually

TOKEN = "node-token-1"
OTHER_TOKEN = "node-token-2"
WAIT_S = 30.0


def _urls(node: NodeProcess) -> "dict[str, dict]":
    r = httpx2.get(node.url + "/workers", headers=node.admin_headers, timeout=10)
    assert r.status_code == 200, r.text
    return {w["url"]: w for w in r.json()["workers"] if not w.get("draining")}


def _metric(node: NodeProcess, name: str) -> float:
    text = httpx2.get(node.url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _chat(node: NodeProcess, model: str = "qwen3-sim", **extra) -> httpx2.Response:
    return httpx2.post(node.url + "/v1/chat/completions", timeout=30, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra})


@pytest.fixture(scope="module")
def port():
    from gateway.node.supervisor import free_udp_tcp_port
    return free_udp_tcp_port("127.0.0.1")


@pytest.fixture(scope="module")
def engines(log_dir, port):
    """Simulated engines on three 'pod IPs', all on the same port, as pods of one Deployment are."""
    started = [EngineProcess(["--host", f"127.0.0.{i}", "--port", str(port), "--itl-base-s", "0.02",
                              "--itl-per-running-s", "0"], log_dir, f"pod-engine-{i}") for i in (2, 3, 4)]
    yield started
    for e in started:
        e.stop()


@pytest.fixture()
def api(tmp_path):
    server = FakeKubeApi(tmp_path, {TOKEN, OTHER_TOKEN})
    yield server
    server.close()


def _ready_pod(api: FakeKubeApi, name: str, ip: str, labels: "dict | None" = None, **kw) -> None:
    api.create(name, labels or {"app": "sim"}, **kw)
    api.schedule(name, ip)
    api.set_ready(name, True)


def _node(api, tmp_path, log_dir, port, name, *extra, token=TOKEN, env=None) -> NodeProcess:
    kubeconfig = api.kubeconfig(tmp_path / f"{name}.kubeconfig", token)
    return NodeProcess(["--service-discovery", "--selector", "app=sim", "--service-discovery-namespace", "default",
                        "--service-discovery-port", str(port), "--health-check-interval-secs", "1", *extra],
                       log_dir, name, env={"KUBECONFIG": str(kubeconfig), **(env or {})})


def test_pods_become_workers_when_ready_and_are_drained_when_they_go(api, engines, tmp_path, log_dir, port):
    url = {i: f"grpc://127.0.0.{i}:{port}" for i in (2, 3, 4)}
    api.create("sim-0", {"app": "sim"})  # Pending, no IP: not a worker
    _ready_pod(api, "other", "127.0.0.4", {"app": "something-else"})  # another selector's pod
    node = _node(api, tmp_path, log_dir, port, "disc-alone")
    try:
        eventually(lambda: _metric(node, "smg_discovery_watch_live") == 1, WAIT_S, "the watch is live")
        assert _urls(node) == {}
        api.schedule("sim-0", "127.0.0.2")  # Running with an IP, not Ready yet
        api.set_ready("sim-0", True)
        eventually(lambda: url[2] in _urls(node), WAIT_S, "a Ready pod is a worker")
        assert _chat(node).status_code == 200
        _ready_pod(api, "sim-1", "127.0.0.3")
        eventually(lambda: set(_urls(node)) == {url[2], url[3]}, WAIT_S, "a second pod")

        api.set_ready("sim-1", False)  # NotReady: drained
        eventually(lambda: set(_urls(node)) == {url[2]}, WAIT_S, "a NotReady pod is drained")
        api.set_ready("sim-1", True)
        eventually(lambda: set(_urls(node)) == {url[2], url[3]}, WAIT_S, "Ready again")

        # Relabelled into the selector and out of it.
        api.relabel("other", {"app": "sim"})
        eventually(lambda: url[4] in _urls(node), WAIT_S, "a pod relabelled into the selector")
        api.relabel("other", {"app": "something-else"})
        eventually(lambda: url[4] not in _urls(node), WAIT_S, "and out of it")

        # A pod deleted while a stream runs on it: drained, the stream finishes whole.
        api.set_ready("sim-1", False)
        eventually(lambda: set(_urls(node)) == {url[2]}, WAIT_S, "one pod left")
        answer = {}

        def stream() -> None:
            with httpx2.stream("POST", node.url + "/v1/chat/completions", timeout=60, json={
                    "model": "qwen3-sim", "messages": [{"role": "user", "content": "go"}], "max_tokens": 60,
                    "ignore_eos": True, "stream": True}) as r:
                answer["body"] = b"".join(r.iter_bytes())

        first_tokens = _metric(node, "smg_time_to_first_token_seconds_count")
        reader = threading.Thread(target=stream)
        reader.start()
        eventually(lambda: _metric(node, "smg_time_to_first_token_seconds_count") > first_tokens, WAIT_S,
                   "the stream runs")
        api.delete("sim-0")  # 60 tokens at 20 ms: the stream has over a second to go
        reader.join(60)
        assert b'"finish_reason":"length"' in answer["body"] and answer["body"].endswith(b"data: [DONE]\n\n")
        eventually(lambda: _urls(node) == {}, WAIT_S, "the deleted pod's worker is gone")
        assert _metric(node, "smg_discovery_deregistrations_total") >= 4
    finally:
        node.stop()


def test_watch_resumes_from_bookmarks_relists_after_410_and_keeps_engines_while_the_api_is_away(
        api, engines, tmp_path, log_dir, port):
    url2, url3 = f"grpc://127.0.0.2:{port}", f"grpc://127.0.0.3:{port}"
    _ready_pod(api, "sim-0", "127.0.0.2")
    node = _node(api, tmp_path, log_dir, port, "disc-watch")
    try:
        eventually(lambda: url2 in _urls(node), WAIT_S, "listed")
        list_version = int(api.version)
        for _ in range(3):  # the version moves on elsewhere (another selector's pods): only bookmarks say so
            api.create(f"noise-{_}", {"app": "noise"})
        bookmarks = api.bookmarks_sent
        eventually(lambda: api.bookmarks_sent >= bookmarks + 2, WAIT_S, "bookmarks sent past the noise")
        api.end_watches()  # as at its timeoutSeconds: resumed from the bookmark's version, not listed again
        watches = lambda: [q for t, q in api.requests if "watch=1" in q]  # noqa: E731
        eventually(lambda: len(watches()) >= 2, WAIT_S, "the watch resumed")
        resumed_from = int(re.search(r"resourceVersion=(\d+)", watches()[-1]).group(1))
        assert resumed_from > list_version, (resumed_from, list_version)
        assert _metric(node, 'smg_discovery_lists_total{reason="listed"}') == 1
        api.drop_watches()  # cut mid-stream: events may have been missed, so it lists again
        eventually(lambda: _metric(node, 'smg_discovery_lists_total{reason="listed"}') == 2, WAIT_S, "listed again")

        # Compacted while the watch is down: the resume is 410 Gone, the node lists again, and sees what changed.
        api.compact()
        api.block(TOKEN)
        eventually(lambda: _metric(node, "smg_discovery_watch_live") == 0, WAIT_S, "the watch is down")
        _ready_pod(api, "sim-1", "127.0.0.3")
        assert set(_urls(node)) == {url2}  # the engines found so far stay while the API server is away
        assert _chat(node).status_code == 200
        api.unblock(TOKEN)
        eventually(lambda: set(_urls(node)) == {url2, url3}, WAIT_S, "relisted after the API came back")
        api.compact()
        api.end_watches()  # resumed from a compacted version: an ERROR 410 event, then a list
        eventually(lambda: _metric(node, 'smg_discovery_lists_total{reason="gone"}') >= 1, WAIT_S, "relisted on 410")
        eventually(lambda: _metric(node, "smg_discovery_watch_live") == 1, WAIT_S, "live again")
        api.delete("sim-1")
        eventually(lambda: set(_urls(node)) == {url2}, WAIT_S, "the watch after the relist works")
    finally:
        node.stop()


def test_the_model_label_names_the_model_and_a_refused_token_is_said(api, engines, tmp_path, log_dir, port):
    _ready_pod(api, "sim-0", "127.0.0.2", annotations={"smg.ai/model": "org/tiny-model"})
    _ready_pod(api, "sim-legacy", "127.0.0.3", {"app": "sim", "legacy": "yes"})  # the set-based term keeps it out
    node = _node(api, tmp_path, log_dir, port, "disc-model", "--selector", "app in (sim, sim-next)", "!legacy")
    try:
        eventually(lambda: f"grpc://127.0.0.2:{port}" in _urls(node), WAIT_S, "the pod")
        assert set(_urls(node)) == {f"grpc://127.0.0.2:{port}"}
        assert _urls(node)[f"grpc://127.0.0.2:{port}"]["models"] == ["org/tiny-model"]
        sent = [urllib.parse.unquote_plus(q) for _, q in api.requests]
        assert any("labelSelector=app in (sim,sim-next),!legacy&" in q for q in sent), sent[-1]  # the API's syntax
        assert _chat(node, "org/tiny-model").status_code == 200
    finally:
        node.stop()
    refused = _node(api, tmp_path, log_dir, port, "disc-refused", token="wrong-token")
    try:
        eventually(lambda: _metric(refused, "smg_discovery_watch_failures_total") >= 1, WAIT_S, "the refusal counted")
        assert "HTTP 401" in refused.log_text() and "get/list/watch on pods" in refused.log_text()
        assert _urls(refused) == {} and refused.alive
    finally:
        refused.stop()
    # An API server whose certificate the kubeconfig's CA did not sign (someone in the middle): not believed.
    (tmp_path / "other").mkdir()
    other_ca = CertAuthority(tmp_path / "other", "another CA")
    kubeconfig = json.loads(api.kubeconfig(tmp_path / "mitm.kubeconfig", TOKEN).read_text())
    kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"] = \
        base64.b64encode(other_ca.path.read_bytes()).decode()
    (tmp_path / "mitm.kubeconfig").write_text(json.dumps(kubeconfig))
    requests_before = len(api.requests)
    mitm = NodeProcess(["--service-discovery", "--selector", "app=sim", "--service-discovery-port", str(port)],
                       log_dir, "disc-mitm", env={"KUBECONFIG": str(tmp_path / "mitm.kubeconfig")})
    try:
        eventually(lambda: _metric(mitm, "smg_discovery_watch_failures_total") >= 1, WAIT_S, "the certificate refused")
        assert "CERTIFICATE_VERIFY_FAILED" in mitm.log_text() and _urls(mitm) == {}
        assert len(api.requests) == requests_before  # no request (and no token) went past the handshake
    finally:
        mitm.stop()


def _partition(fault_files, between: bool) -> None:
    for mine, theirs in ((0, 1), (1, 0)):
        rules = {"peers": {fault_files[theirs][1]: {"drop": 1.0}}} if between else {}
        fault_files[mine][0].write_text(json.dumps(rules))


def test_every_node_watches_and_the_cluster_keeps_one_entry_per_pod_through_a_partition(
        api, engines, tmp_path, log_dir, port):
    from gateway.node.supervisor import free_udp_tcp_port
    ports = []
    while len(ports) < 4:
        p = free_udp_tcp_port("127.0.0.1")
        if p not in ports:
            ports.append(p)
    faults = [(tmp_path / f"faults-{i}.json", f"127.0.0.1:{ports[i]}") for i in range(2)]
    _partition(faults, between=False)
    for i in (0, 1):
        _ready_pod(api, f"sim-{i}", f"127.0.0.{2 + i}")
    urls = {f"grpc://127.0.0.{2 + i}:{port}" for i in (0, 1)}
    nodes = []
    try:
        for i, token in ((0, TOKEN), (1, OTHER_TOKEN)):
            nodes.append(_node(api, tmp_path, log_dir, port, f"disc-c{i}", *mesh_args(i, ports, "k"), token=token,
                               env={"SMG_NODE_CHAOS_FAULTS": str(faults[i][0])}))
        for n in nodes:
            eventually(lambda n=n: set(_urls(n)) == urls, WAIT_S, "both nodes serve both pods")
        for n in nodes:  # one entry per pod in the document both hold
            entries = httpx2.get(n.url + "/workers", headers=n.admin_headers, timeout=10).json()["workers"]
            assert sorted(w["url"] for w in entries) == sorted(urls)

        # Node 1 is cut off from the mesh and from the API server; a pod is deleted meanwhile.
        api.block(OTHER_TOKEN)
        _partition(faults, between=True)
        eventually(lambda: _metric(nodes[0], 'smg_mesh_members{state="alive"}') == 1, 60, "the partition seen")
        api.delete("sim-1")
        eventually(lambda: set(_urls(nodes[0])) == {f"grpc://127.0.0.2:{port}"}, WAIT_S,
                   "node 0 drains the deleted pod")
        assert f"grpc://127.0.0.3:{port}" in _urls(nodes[1])  # node 1 knows nothing yet

        _partition(faults, between=False)  # healed; node 1's watch is still cut off: the mesh tells it
        eventually(lambda: set(_urls(nodes[1])) == {f"grpc://127.0.0.2:{port}"}, 60, "gone from node 1 after the heal")
        api.unblock(OTHER_TOKEN)
        eventually(lambda: _metric(nodes[1], "smg_discovery_watch_live") == 1, WAIT_S, "node 1's watch is back")
        for n in nodes:  # and it stays gone: node 1's old view wrote nothing back
            assert set(_urls(n)) == {f"grpc://127.0.0.2:{port}"}
        registrations = sum(_metric(n, "smg_discovery_registrations_total") for n in nodes)
        assert registrations == 2, f"one write per pod, no flapping: {registrations}"
    finally:
        for n in nodes:
            n.stop()


def test_pd_roles_from_selectors_and_a_mesh_formed_from_router_pods(api, tmp_path, log_dir, port):
    """Prefill and decode engines found by their selectors (the bootstrap port from the pod's annotation) and two
    nodes started with no seed list that find each other as the router selector's pods."""
    from gateway.node.supervisor import free_udp_tcp_port
    bootstrap = free_udp_tcp_port("127.0.0.1")
    prefill = EngineProcess(["--host", "127.0.0.5", "--port", str(port), "--role", "prefill", "--bootstrap-port",
                             str(bootstrap)], log_dir, "pod-prefill")
    decode = EngineProcess(["--host", "127.0.0.6", "--port", str(port), "--role", "decode"], log_dir, "pod-decode")
    mesh_port = free_udp_tcp_port("127.0.0.1")
    _ready_pod(api, "sim-prefill", "127.0.0.5", {"app": "sim", "role": "prefill"},
               annotations={"sglang.ai/bootstrap-port": str(bootstrap)})
    _ready_pod(api, "sim-decode", "127.0.0.6", {"app": "sim", "role": "decode"})
    nodes = []
    try:
        for i, ip in enumerate(("127.0.0.7", "127.0.0.8")):
            api.create(f"smg-node-{i}", {"app": "smg-node"})
            api.schedule(f"smg-node-{i}", ip)  # Running, not Ready: a node is Ready only once it joined
            kubeconfig = api.kubeconfig(tmp_path / f"pd{i}.kubeconfig", TOKEN)
            nodes.append(NodeProcess([
                "--service-discovery", "--pd-disaggregation", "--prefill-selector", "app=sim", "role=prefill",
                "--decode-selector", "app=sim,role=decode", "--router-selector", "app=smg-node",
                "--service-discovery-namespace", "default", "--service-discovery-port", str(port),
                "--mesh-bind", f"{ip}:{mesh_port}", "--mesh-preset", "local", "--node-name", f"pd{i}",
                "--rpc-addr", f"{ip}:0"], log_dir, f"disc-pd{i}", env={"KUBECONFIG": str(kubeconfig)}))
        for n in nodes:
            eventually(lambda n=n: _metric(n, 'smg_mesh_members{state="alive"}') == 2, WAIT_S,
                       "the mesh formed from router pods")
            workers = eventually(lambda n=n: len(_urls(n)) == 2 and _urls(n), WAIT_S, "both halves of the pair")
            assert workers[f"grpc://127.0.0.5:{port}"]["worker_type"] == "prefill"
            assert workers[f"grpc://127.0.0.5:{port}"]["bootstrap_port"] == bootstrap
            assert workers[f"grpc://127.0.0.6:{port}"]["worker_type"] == "decode"
            r = _chat(n)
            assert r.status_code == 200, r.text
        assert sum(_metric(n, "smg_pd_pair_selections_total") for n in nodes) >= 2
        # A node whose process dies is held failed (it may be cut off) until its pod is deleted: then it is gone
        # for good, and the other forces it to leave (it no longer counts against rate limits and history).
        nodes[1].kill()
        eventually(lambda: _metric(nodes[0], 'smg_mesh_members{state="dead"}') == 1, WAIT_S, "pd1 held dead")
        assert _metric(nodes[0], 'smg_mesh_members{state="left"}') == 0
        api.delete("smg-node-1", graceful=False)
        eventually(lambda: _metric(nodes[0], 'smg_mesh_members{state="left"}') == 1, WAIT_S, "pd1 forced to leave")
        assert _metric(nodes[0], 'smg_mesh_members{state="dead"}') == 0
        assert _metric(nodes[0], "smg_mesh_forced_leaves_total") == 1
    finally:
        for n in nodes:
            n.stop()
        prefill.stop()
        decode.stop()

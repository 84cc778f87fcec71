"""Kubernetes discovery's pure parts: selectors, what a pod says, the watch cache, roles and URLs, credentials,
the document writes of the node that owns an entry, mesh seeds, and the flags' checks."""

from __future__ import annotations

import argparse
import base64
import os

import pytest

from gateway.discovery.config import DiscoveryConfig, SelectorError, parse_selector, selector_matches, selector_text
from gateway.discovery.credentials import CredentialsError, TokenFile, from_kubeconfig, load_credentials
from gateway.discovery.pods import PodCache, PodInvalid, desired_workers, parse_pod
from gateway.discovery.seeds import MeshSeeds, seed_of
from mesh.agent import ForceLeaveError
from mesh.members import MemberSnapshot, MemberStatus


def pod(name="p", ip="10.0.0.5", ready=True, phase="Running", labels=None, annotations=None, deleting=False,
        version="7"):
    meta = {"name": name, "namespace": "ns", "uid": "u-" + name, "resourceVersion": version,
            "labels": labels if labels is not None else {"app": "sim"}, "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    status = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


def test_a_pod_keeps_only_the_labels_and_annotations_discovery_reads():
    # Issue 59: 2,000 pods of 250 KB of annotations were +477 MiB held, and the bounds allowed ~5 GB.
    config = DiscoveryConfig()
    cache = PodCache(config.pod_keys_read())
    filler = {f"note-{i}": "x" * 1000 for i in range(240)}
    items = [pod(name=f"p{i}", labels={"app": "sim", config.model_label: "m", "team": "x" * 1000},
                 annotations={**filler, config.bootstrap_port_annotation: "9000"}) for i in range(50)]
    assert cache.replace(items, "1")
    held = sum(len(k) + len(v) for p in cache.pods.values() for k, v in (*p.labels, *p.annotations))
    assert held < 50 * 100  # was 50 x ~241 KB
    first = cache.pods["ns/p0"]
    assert first.label(config.model_label) == "m" and first.annotation(config.bootstrap_port_annotation) == "9000"
    assert first.label("team") is None and first.annotation("note-1") is None
    # The whole map is still checked: a flood past the bound is no pod at all.
    with pytest.raises(PodInvalid, match="annotations too large"):
        parse_pod(pod(annotations={"a": "x" * (300 * 1024)}), config.pod_keys_read())


def test_selectors_are_kubernetes_equality_and_set_based_terms_in_any_of_their_spellings():
    assert parse_selector(["app=sglang", "role==prefill"]) == (("app", "=", ("sglang",)), ("role", "=", ("prefill",)))
    assert parse_selector(["app=sglang,role=prefill"]) == parse_selector(["role=prefill", "app=sglang"]) == \
        parse_selector(["app=sglang role=prefill"])  # smg's space-separated terms, as one flag value
    assert parse_selector(["example.com/tier=gpu"]) == (("example.com/tier", "=", ("gpu",)),)
    assert selector_text(parse_selector(["b=2", "a=1"])) == "a=1,b=2"
    both = parse_selector(["app in (sglang, vllm),tier!=cpu", "!legacy", "gpu", "zone notin (a)"])
    assert selector_text(both) == "app in (sglang,vllm),gpu,!legacy,tier!=cpu,zone notin (a)"
    assert selector_matches(both, {"app": "vllm", "gpu": "1", "zone": "b"})
    for labels in ({"app": "other", "gpu": "1"}, {"app": "vllm"}, {"app": "vllm", "gpu": "1", "legacy": "y"},
                   {"app": "vllm", "gpu": "1", "tier": "cpu"}, {"app": "vllm", "gpu": "1", "zone": "a"}):
        assert not selector_matches(both, labels), labels
    for bad in (["app in ()"], ["a=1", "a=2"], ["b@d=1"], ["a=" + "x" * 64], ["a in (b"], ["=x"]):
        with pytest.raises(SelectorError):
            parse_selector(bad)


def test_a_pod_serves_only_running_ready_with_an_ip_and_not_terminating():
    assert parse_pod(pod()).serving
    assert not parse_pod(pod(ready=False)).serving
    assert not parse_pod(pod(ip=None)).serving
    assert not parse_pod(pod(phase="Pending")).serving
    assert not parse_pod(pod(deleting=True)).serving
    assert parse_pod(pod(ip="fd00::5")).ip == "fd00::5"
    for bad in (pod(ip="evil.example.com"), pod(ip="http://x/"), {"metadata": {}}, [], pod(labels={"a": 1})):
        with pytest.raises(PodInvalid):
            parse_pod(bad)


def test_the_cache_follows_a_list_then_events_and_bookmarks_move_only_the_version():
    cache = PodCache()
    assert not cache.synced
    assert cache.replace([pod("a"), {"not": "a pod"}], "10") and cache.synced and cache.invalid == 1
    assert not cache.replace([pod("a")], "11")  # the same pods: nothing changed
    assert cache.apply("ADDED", pod("b", version="12")) and set(cache.pods) == {"ns/a", "ns/b"}
    assert not cache.apply("MODIFIED", pod("b", version="13"))  # only the version moved
    assert cache.apply("MODIFIED", pod("b", ready=False, version="14")) and not cache.pods["ns/b"].serving
    assert not cache.apply("BOOKMARK", {"metadata": {"resourceVersion": "20"}}) and cache.resource_version == "20"
    assert cache.apply("DELETED", pod("a", version="21")) and set(cache.pods) == {"ns/b"}
    assert not cache.apply("DELETED", pod("a", version="22"))  # already gone
    assert cache.resource_version == "22"


def test_a_selector_holds_a_bounded_number_of_pods_and_floods_are_ignored():
    cache = PodCache()
    cache.pods_max = 2
    cache.replace([pod("a"), pod("b"), pod("c")], "1")
    assert set(cache.pods) == {"ns/a", "ns/b"} and cache.over_limit == 1
    assert not cache.apply("ADDED", pod("d")) and cache.over_limit == 2
    assert cache.apply("MODIFIED", pod("a", ready=False))  # the pods it holds still change
    assert not cache.apply("ADDED", pod("e", annotations={"x": "y" * 300_000})) and cache.invalid == 1


def test_workers_from_pods_carry_role_url_bootstrap_port_and_model():
    config = DiscoveryConfig(enabled=True, port=30000)
    regular, prefill, decode = PodCache(), PodCache(), PodCache()
    regular.replace([pod("r", "10.0.0.1", labels={"smg.ai/model": "tiny"}), pod("nr", "10.0.0.9", ready=False)], "1")
    prefill.replace([pod("p", "fd00::2", annotations={"sglang.ai/bootstrap-port": "9000"}),
                     pod("p2", "10.0.0.3", annotations={"sglang.ai/bootstrap-port": "99999"})], "1")
    decode.replace([pod("d", "10.0.0.4", annotations={"smg.ai/model": "org/model"}),
                    pod("r", "10.0.0.1")], "1")  # also matched as regular first: stays regular
    workers = desired_workers([("regular", regular), ("prefill", prefill), ("decode", decode)], config)
    assert set(workers) == {"grpc://10.0.0.1:30000", "grpc://[fd00::2]:30000", "grpc://10.0.0.3:30000",
                            "grpc://10.0.0.4:30000"}
    assert workers["grpc://10.0.0.1:30000"].role == "regular" and workers["grpc://10.0.0.1:30000"].model == "tiny"
    assert workers["grpc://[fd00::2]:30000"].bootstrap_port == 9000
    assert workers["grpc://10.0.0.3:30000"].bootstrap_port is None  # not a port: the default applies
    assert workers["grpc://10.0.0.4:30000"].model == "org/model" and workers["grpc://10.0.0.4:30000"].pod == "ns/d"


def test_in_cluster_credentials_read_the_token_again_when_it_rotates(tmp_path):
    (tmp_path / "token").write_text("first\n")
    (tmp_path / "namespace").write_text("inference")
    from tests.support.certs import CertAuthority
    ca = CertAuthority(tmp_path)
    (tmp_path / "ca.crt").write_bytes(ca.path.read_bytes())
    creds = load_credentials({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
                             service_account_dir=tmp_path)
    assert creds.server == "https://10.96.0.1:443" and creds.namespace == "inference"
    assert creds.headers() == {"authorization": "Bearer first"}
    (tmp_path / "token").write_text("second, rotated by the kubelet\n")
    os.utime(tmp_path / "token", ns=(1, 1))  # a different mtime whatever the clock's resolution
    assert creds.headers() == {"authorization": "Bearer second, rotated by the kubelet"}


def test_a_kubeconfig_gives_server_ca_token_and_client_certificate(tmp_path):
    from tests.support.certs import CertAuthority
    ca = CertAuthority(tmp_path)
    cert, key, _ = ca.issue("client", "node", server=False, client=True)
    (tmp_path / "tok").write_text("from-a-file")
    config = tmp_path / "config"
    config.write_text(f"""
apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:6443", certificate-authority: {ca.path.name}}}
users:
- name: u
  user:
    tokenFile: tok
    client-certificate-data: {base64.b64encode(cert.read_bytes()).decode()}
    client-key: {key.name}
contexts:
- name: other
  context: {{cluster: nope, user: nope}}
- name: prod
  context: {{cluster: c, user: u, namespace: inference}}
""")
    creds = from_kubeconfig(config)
    assert creds.server == "https://127.0.0.1:6443" and creds.namespace == "inference"
    assert creds.headers() == {"authorization": "Bearer from-a-file"}
    assert "context prod" in creds.source
    # KUBECONFIG's first file is the one read; without any, a clear error.
    assert load_credentials({"KUBECONFIG": f"{config}{os.pathsep}/nowhere"}).server == creds.server
    with pytest.raises(CredentialsError, match="no kubeconfig"):
        load_credentials({}, home=tmp_path / "empty")


def test_a_kubeconfig_that_runs_a_plugin_or_names_nothing_is_refused(tmp_path):
    config = tmp_path / "config"
    config.write_text("""{"current-context": "x", "clusters": [{"name": "c", "cluster": {"server": "https://h",
        "insecure-skip-tls-verify": true}}], "users": [{"name": "u", "user": {"exec": {"command": "aws"}}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}""")
    with pytest.raises(CredentialsError, match="plugin"):
        from_kubeconfig(config)
    config.write_text('{"current-context": "missing", "contexts": []}')
    with pytest.raises(CredentialsError, match="no context named 'missing'"):
        from_kubeconfig(config)


def test_token_file_errors_are_credentials_errors(tmp_path):
    with pytest.raises(CredentialsError):
        TokenFile(tmp_path / "absent").token()


def test_router_pods_are_seeds_once_running_with_an_ip_ready_or_not():
    config = DiscoveryConfig()
    assert seed_of(parse_pod(pod(ready=False)), 7946, config) == "10.0.0.5:7946"
    assert seed_of(parse_pod(pod(ip="fd00::7", annotations={"sglang.ai/mesh-port": "8000"})), 7946, config) == \
        "[fd00::7]:8000"
    assert seed_of(parse_pod(pod(ip=None)), 7946, config) is None
    assert seed_of(parse_pod(pod(phase="Pending")), 7946, config) is None
    assert seed_of(parse_pod(pod(deleting=True)), 7946, config) is None


class _Members:
    """The agent's side MeshSeeds reads and calls: its members, and force_leave as the agent refuses it."""

    name = "me"

    def __init__(self) -> None:
        self.states: dict[str, tuple[str, MemberStatus, dict]] = {}
        self.forced: list[str] = []

    def set(self, name: str, addr: str, status: MemberStatus, tags: "dict | None" = None) -> None:
        self.states[name] = (addr, status, tags or {})

    def members(self) -> list[MemberSnapshot]:
        return [MemberSnapshot(n, a, 1, s, t, 0.0) for n, (a, s, t) in self.states.items()]

    def force_leave(self, name: str) -> list[str]:
        if self.states[name][1] is not MemberStatus.DEAD:
            raise ForceLeaveError(f"{name} is not failed")
        self.states[name] = (self.states[name][0], MemberStatus.LEFT, self.states[name][2])
        self.forced.append(name)
        return [name]


class _Watcher:
    def __init__(self) -> None:
        self.live = True
        self.cache = PodCache()

    def pods(self, *pods: dict) -> None:
        self.cache.replace([dict(p) for p in pods], "9")


def test_a_failed_member_is_forced_to_leave_only_once_its_router_pod_is_deleted():
    """A member seen alive as a router pod (by name or mesh address) and failed since: kept while the pod is in
    the API (it may be cut off), forced to leave once the pod is gone or terminating; never while the watch is
    not live, and never for a member no router pod was seen to run."""
    agent, watcher = _Members(), _Watcher()
    seeds = MeshSeeds(watcher, agent, 7946, DiscoveryConfig(), own_name="me")
    watcher.pods(pod("a", ip="10.0.0.1"), pod("b", ip="10.0.0.2"), pod("c", ip="10.0.0.3"))
    agent.set("a", "10.0.0.1:7946", MemberStatus.ALIVE)  # by its name
    agent.set("b-w1", "10.0.0.2:7946", MemberStatus.ALIVE, {"node": "b"})  # a process of pod b, by its node tag
    agent.set("x", "10.0.0.3:7946", MemberStatus.ALIVE)  # named otherwise, by its address
    agent.set("outside", "10.9.9.9:7946", MemberStatus.ALIVE)  # joined by --join, no pod of ours
    assert seeds.force_leave_deleted() == []
    for name in ("a", "b-w1", "x", "outside"):
        agent.set(name, agent.states[name][0], MemberStatus.DEAD)
    assert seeds.force_leave_deleted() == []  # every pod still there: maybe cut off
    watcher.pods(pod("b", ip="10.0.0.2", deleting=True), pod("c", ip="10.0.0.3"))
    watcher.live = False
    assert seeds.force_leave_deleted() == []  # the cache may miss events
    watcher.live = True
    assert sorted(seeds.force_leave_deleted()) == ["a", "b-w1"]  # a gone, b terminating
    watcher.pods()
    assert seeds.force_leave_deleted() == ["x"] and seeds.forced_leaves == 3
    assert agent.states["outside"][1] is MemberStatus.DEAD  # left to the operator


def test_a_member_that_joins_and_crashes_between_two_passes_is_still_forced_out_with_its_pod():
    """Found by CI: a member alive for three seconds, held dead a tenth of a second after its crash (its port
    refused), was never seen alive by the every-5-s pass, so its deleted pod never forced it out. The mesh's
    listener matches it to its pod as it joins."""
    agent, watcher = _Members(), _Watcher()
    seeds = MeshSeeds(watcher, agent, 7946, DiscoveryConfig(), own_name="me")
    watcher.pods(pod("a", ip="10.0.0.1"))
    agent.set("a", "10.0.0.1:7946", MemberStatus.ALIVE)
    seeds.member_changed(agent.members()[0], None)  # joined; no pass ran while it was alive
    agent.set("a", "10.0.0.1:7946", MemberStatus.DEAD)
    seeds.member_changed(agent.members()[0], MemberStatus.ALIVE)
    assert seeds.force_leave_deleted() == []  # its pod is still there
    watcher.pods()
    assert seeds.force_leave_deleted() == ["a"]


async def test_only_the_owner_writes_and_only_discovered_entries_are_removed():
    from gateway.cluster import ClusterState
    from gateway.discovery.reconcile import DiscoveredWorkers
    from gateway.discovery.watch import PodWatcher
    from gateway.workers.worker import worker_id_for
    config = DiscoveryConfig(enabled=True, selector=parse_selector(["app=sim"]), port=1)
    cluster = ClusterState("n1")
    watcher = PodWatcher(None, config.selector, config, None, lambda: None)
    discovered = DiscoveredWorkers(config, None, [("regular", watcher)], cluster)
    await discovered.reconcile()
    assert cluster.doc.workers() == {}  # not listed yet: nothing concluded
    cluster.register(worker_id_for("grpc://10.9.9.9:1"), {"url": "grpc://10.9.9.9:1"})  # by hand
    watcher.cache.replace([pod("a", "10.0.0.1"), pod("b", "10.0.0.2")], "5")
    watcher.live = True
    await discovered.reconcile()
    assert len(cluster.doc.workers()) == 1  # not before the node holds the cluster's document
    cluster.mark_joined()  # (alone: nobody to join)
    await discovered.reconcile()
    entries = cluster.doc.workers()
    assert {e["url"] for e in entries.values()} == {"grpc://10.0.0.1:1", "grpc://10.0.0.2:1", "grpc://10.9.9.9:1"}
    assert entries[worker_id_for("grpc://10.0.0.1:1")]["discovered"] == "ns/a"
    await discovered.reconcile()
    assert discovered.registrations == 2  # the same view writes nothing again
    watcher.cache.apply("DELETED", pod("a", "10.0.0.1", version="6"))
    watcher.live = False
    await discovered.reconcile()
    assert len(cluster.doc.workers()) == 3  # a stale view writes nothing
    watcher.live = True
    await discovered.reconcile()
    assert {e["url"] for e in cluster.doc.workers().values()} == {"grpc://10.0.0.2:1", "grpc://10.9.9.9:1"}


def _validated(argv):
    from gateway.node.config import add_serve_arguments, build_config, validate
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    config = build_config(parser.parse_args(argv), environ={})
    validate(config)
    return config


def test_the_flags_are_checked_at_start():
    from gateway.node.config import ConfigError
    config = _validated(["--service-discovery", "--selector", "app=sglang", "tier=gpu", "--service-discovery-port",
                         "30000", "--service-discovery-namespace", "inference"])
    assert selector_text(config.discovery.selector) == "app=sglang,tier=gpu" and config.discovery.port == 30000
    for argv, said in ((["--selector", "app=x"], "needs --service-discovery"),
                       (["--service-discovery"], "an empty selector would take every pod"),
                       (["--service-discovery", "--selector", "app in ()"], "not a label selector term"),
                       (["--service-discovery", "--prefill-selector", "a=b"], "need --pd-disaggregation"),
                       (["--service-discovery", "--router-selector", "a=b"], "needs --mesh-bind"),
                       (["--service-discovery", "--selector", "a=b", "--service-discovery-protocol", "udp"], "grpc or"),
                       (["--service-discovery", "--selector", "a=b", "--service-discovery-port", "0"], "not a port")):
        with pytest.raises(ConfigError, match=said):
            _validated(argv)

"""deploy/ files that no container engine or init system runs here: parsed, schema-checked, and
kept in step with the CLI (every smg-node command line in them goes through smg-node's own parser)."""

from __future__ import annotations

import argparse
import configparser
import pathlib
import re
import shlex
import shutil
import subprocess
import tomllib

import pytest
import yaml
from kubernetes import client as k8s

from gateway.node.config import build_config
from gateway.discovery.config import selector_matches
from chaos.sim_engine.server import add_arguments as add_sim_engine_arguments
from gateway.cli.command import parse_args
from mesh.crypto import generate_key

DEPLOY = pathlib.Path(__file__).resolve().parents[2] / "deploy"
K8S_MODELS = {("v1", "ConfigMap"): "V1ConfigMap", ("v1", "Service"): "V1Service",
              ("v1", "ServiceAccount"): "V1ServiceAccount", ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
              ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
              ("apps/v1", "StatefulSet"): "V1StatefulSet",
              ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget"}
ENV = {"SMG_NODE_ENCRYPT": generate_key()}


def parse_cli(argv: list[str]) -> argparse.Namespace:
    try:
        return parse_args(argv)
    except SystemExit:
        raise AssertionError(f"smg-node does not accept: {shlex.join(argv)}") from None


def serve_config(argv: list[str], config_text: str | None, tmp_path: pathlib.Path):
    """The GatewayConfig a `smg-node serve` command line (and its --config file) would run with."""
    if config_text is not None:
        path = tmp_path / "smg-node.toml"
        path.write_text(config_text)
        argv = [path.as_posix() if i and argv[i - 1] == "--config" else a for i, a in enumerate(argv)]
    args = parse_cli(argv)
    assert args.command == "serve"
    return build_config(args, ENV)


# -- Kubernetes ------------------------------------------------------------

def check_against_model(value, type_name: str, where: str) -> None:
    """Every key known to the official client's model, every scalar of the declared type."""
    if type_name.startswith("List["):
        assert isinstance(value, list), f"{where}: expected a list"
        for i, item in enumerate(value):
            check_against_model(item, type_name[5:-1], f"{where}[{i}]")
        return
    if type_name.startswith("Dict["):
        assert isinstance(value, dict), f"{where}: expected a mapping"
        inner = type_name[5:-1].split(", ", 1)[1]
        for k, v in value.items():
            check_against_model(v, inner, f"{where}.{k}")
        return
    scalars = {"str": str, "int": int, "bool": bool, "float": (int, float)}
    if type_name in scalars:
        assert isinstance(value, scalars[type_name]) and not (type_name == "int" and isinstance(value, bool)), \
            f"{where}: expected {type_name}, got {value!r}"
        return
    if type_name == "object":  # int-or-string and free-form fields
        return
    model = getattr(k8s, type_name)
    assert isinstance(value, dict), f"{where}: expected an object ({type_name})"
    by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, item in value.items():
        assert key in by_json, f"{where}: {type_name} has no field {key!r}"
        check_against_model(item, model.openapi_types[by_json[key]], f"{where}.{key}")


def k8s_objects() -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "smg-node.yaml").read_text()) if d]


def test_kubernetes_manifests_match_the_official_schema():
    objects = k8s_objects()
    assert {(o["apiVersion"], o["kind"]) for o in objects} == set(K8S_MODELS)
    api = k8s.ApiClient()
    for obj in objects:
        model = K8S_MODELS[(obj["apiVersion"], obj["kind"])]
        check_against_model(obj, model, f"{obj['kind']}/{obj['metadata']['name']}")
        api._ApiClient__deserialize(obj, model)  # required fields: the models raise when one is missing


def test_kubernetes_manifests_agree_with_each_other_and_with_the_cli(tmp_path):
    objects = {(o["kind"], o["metadata"]["name"]): o for o in k8s_objects()}
    nodes = objects[("StatefulSet", "smg-node")]
    pod = nodes["spec"]["template"]
    # The data directory is a claim of each pod's own (it outlives the pod), mounted where --data-dir points.
    (claim,) = nodes["spec"]["volumeClaimTemplates"]
    (container,) = pod["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert container["args"][container["args"].index("--data-dir") + 1] == mounts[claim["metadata"]["name"]]
    assert nodes["spec"]["serviceName"] in {name for kind, name in objects if kind == "Service"}
    labels = pod["metadata"]["labels"]
    for kind, name in objects:
        selector = objects[(kind, name)].get("spec", {}).get("selector")
        if selector is not None:
            wanted = selector.get("matchLabels", selector)
            assert wanted.items() <= labels.items(), f"{kind}/{name} selects no pod"
    (container,) = pod["spec"]["containers"]
    args = [re.sub(r"\$\((POD_IP)\)", "10.1.2.3", re.sub(r"\$\((POD_NAME)\)", "smg-node-0", a))
            for a in container["args"]]
    config_text = objects[("ConfigMap", "smg-node-config")]["data"]["smg-node.toml"]
    config = serve_config(args, config_text, tmp_path)
    # No seed list: the mesh forms from the router selector's pods, which are these pods; engines by discovery.
    assert config.mesh.join == () and config.worker_urls == ()
    discovery = config.discovery
    assert discovery.enabled and discovery.selector and selector_matches(discovery.router_selector, labels)
    assert discovery.namespace == "default"
    # The service account the pods run as may get, list and watch pods in that namespace, and nothing more.
    account = pod["spec"]["serviceAccountName"]
    assert ("ServiceAccount", account) in objects
    (binding,) = [o for (kind, _), o in objects.items() if kind == "RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": discovery.namespace}]
    role = objects[("Role", binding["roleRef"]["name"])]
    assert binding["roleRef"]["kind"] == "Role"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["gossip-udp"] == int(config.mesh.bind.rpartition(":")[2])
    assert ports["http"] == config.port and ports["metrics"] == config.prometheus_port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert container["livenessProbe"]["httpGet"]["path"] == "/liveness"
    assert pod["spec"]["terminationGracePeriodSeconds"] > config.shutdown_grace_period_s
    env = {e["name"] for e in container["env"]}
    assert "SMG_NODE_ENCRYPT" in env  # the gossip key comes from a Secret, never from the manifest
    assert "SMG_NODE_ADMIN_TOKEN" in env  # so does the admin credential
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "smg-node" and parse_cli(pre_stop[1:]).command == "leave"
    assert config.mesh.rpc_bind == parse_cli(pre_stop[1:]).rpc_addr
    assert config.limit_set().limits  # the example's global limit parses


# -- compose ---------------------------------------------------------------

def test_compose_file_structure_and_command_lines(tmp_path):
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    nodes = {n: s for n, s in services.items() if s.get("command", [None])[0] == "serve"}
    engines = {n: s for n, s in services.items() if s.get("command", [None])[0] == "sim-engine"}
    assert len(nodes) == 3 and len(engines) == 2
    names = set(services)
    for name, service in {**nodes, **engines}.items():
        assert service["image"] == "smg-node:0.1.0"
        for dependency in service.get("depends_on", []):
            assert dependency in names, f"{name} depends on a service that does not exist: {dependency}"
    for name, engine in engines.items():
        # `smg-node sim-engine ARGS` runs the simulated engine's own program with ARGS.
        sim_parser = argparse.ArgumentParser(exit_on_error=False)
        add_sim_engine_arguments(sim_parser)
        sim_parser.parse_args(engine["command"][1:])
    registered = set()
    for name, node in nodes.items():
        config = serve_config(node["command"], None, tmp_path)
        assert config.mesh.node_name == name and config.mesh.advertise == f"{name}:7946"
        assert all(seed.partition(":")[0] in nodes for seed in config.mesh.join)
        registered |= {url.removeprefix("grpc://").partition(":")[0] for url in config.worker_urls}
        assert "/readiness" in " ".join(node["healthcheck"]["test"])
        assert float(node["stop_grace_period"].rstrip("s")) > config.shutdown_grace_period_s
        assert "SMG_NODE_ENCRYPT" in node["environment"] and "SMG_NODE_ADMIN_TOKEN" in node["environment"]
    assert registered == set(engines)  # every engine is used
    nginx = (DEPLOY / "compose" / "nginx.conf").read_text()
    assert "location ~ ^/(workers|admin)(/|$) { return 403; }" in nginx  # the control plane stays inside
    upstreams = set(re.findall(r"server (\w+):30000", nginx))
    assert upstreams == set(nodes)
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in services["nginx"]["volumes"]


def test_dockerfile_installs_every_package_the_project_ships():
    dockerfile = (DEPLOY / "compose" / "Dockerfile").read_text()
    pyproject = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile, re.M))
    assert copied == packages
    assert re.search(r'^ENTRYPOINT \["smg-node"\]$', dockerfile, re.M)


# -- systemd ---------------------------------------------------------------

def test_systemd_unit_runs_a_valid_command_and_waits_for_the_drain(tmp_path):
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read(DEPLOY / "systemd" / "smg-node.service")
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/smg-node")
    config = serve_config(argv[1:], (DEPLOY / "systemd" / "smg-node.toml").read_text(), tmp_path)
    assert config.mesh.enabled and config.worker_urls
    stop_s = float(service["TimeoutStopSec"])
    assert service["KillSignal"] == "SIGTERM" and stop_s > config.shutdown_grace_period_s
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit():
    result = subprocess.run(["systemd-analyze", "verify", str(DEPLOY / "systemd" / "smg-node.service")],
                            capture_output=True, text=True)
    # The binary and the user exist only on a real install; anything else is a real problem.
    problems = [line for line in result.stderr.splitlines()
                if line and "/opt/smg-node/bin/smg-node" not in line and "smg-node.service" in line]
    assert not problems, result.stderr


def test_the_schema_check_catches_misspelt_fields_wrong_types_and_missing_ones():
    import copy
    statefulset = next(o for o in k8s_objects() if o["kind"] == "StatefulSet")
    misspelt = copy.deepcopy(statefulset)
    container = misspelt["spec"]["template"]["spec"]["containers"][0]
    container["readynessProbe"] = container.pop("readinessProbe")
    with pytest.raises(AssertionError, match="V1Container has no field 'readynessProbe'"):
        check_against_model(misspelt, "V1StatefulSet", "statefulset")
    wrong_type = copy.deepcopy(statefulset)
    wrong_type["spec"]["replicas"] = "3"
    with pytest.raises(AssertionError, match="expected int"):
        check_against_model(wrong_type, "V1StatefulSet", "statefulset")
    missing = copy.deepcopy(statefulset)
    del missing["spec"]["template"]["spec"]["containers"]
    with pytest.raises(ValueError, match="containers"):
        k8s.ApiClient()._ApiClient__deserialize(missing, "V1StatefulSet")


# -- Prometheus alert rules and the Grafana dashboard ------------------------------------------------------------------

_GATEWAY = DEPLOY.parent / "gateway"
_MESH_METRICS = re.compile(r"\bsmg_[a-z0-9_]+")
# What the Prometheus client adds to a family's name on the wire: counters' _total, histograms' series.
_WIRE_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def _exported_metric_names() -> set[str]:
    """Every metric family name the node's code declares (each literal ``smg_...`` in gateway/), as exported."""
    names = set()
    for path in _GATEWAY.rglob("*.py"):
        for name in _MESH_METRICS.findall(path.read_text()):
            names.add(name)
            names.update(name + suffix for suffix in _WIRE_SUFFIXES)
    return names


def _named_metrics(expr: str) -> set[str]:
    return set(_MESH_METRICS.findall(expr))


def test_alert_rules_are_well_formed_and_name_only_exported_metrics():
    rules_file = yaml.safe_load((DEPLOY / "prometheus" / "smg-node-alerts.yaml").read_text())
    exported = _exported_metric_names()
    rules = [rule for group in rules_file["groups"] for rule in group["rules"]]
    assert len(rules) >= 8 and len({r["alert"] for r in rules}) == len(rules)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]
        unknown = _named_metrics(rule["expr"]) - exported
        assert not unknown, f"{rule['alert']} names metrics no node exports: {unknown}"
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
    # The node's own alerts: a member held dead, no healthy worker, inference refused for lost keys.
    assert {"SmgNodeMemberDead", "SmgNodeNoHealthyWorker", "SmgNodeInferenceRefusedKeysUnknown"} <= \
        {r["alert"] for r in rules}


def test_the_dashboard_is_grafana_json_on_exported_metrics():
    import json
    dashboard = json.loads((DEPLOY / "grafana" / "smg-node-dashboard.json").read_text())
    assert dashboard["uid"] == "smg-node" and dashboard["schemaVersion"] >= 36
    assert [v["type"] for v in dashboard["templating"]["list"]] == ["datasource"]
    exported = _exported_metric_names()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for panel in dashboard["panels"]:
        assert panel["type"] in ("timeseries", "stat") and panel["targets"], panel["title"]
        for target in panel["targets"]:
            unknown = _named_metrics(target["expr"]) - exported
            assert not unknown, f"panel {panel['title']!r} names metrics no node exports: {unknown}"
            assert target["datasource"]["uid"] == "${datasource}"

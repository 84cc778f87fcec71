"""One chaos run: start the cluster, drive the workload, strike the faults on time, observe, check.

Progress goes to ``progress`` (a line every couple of seconds: requests by
outcome, what each node sees, the last fault). The run's data is a ``RunData``
the checkers and the report read.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2

from .checkers import CheckResult, all_checkers
from .checkers.kv_index import signature as kv_signature
from .checkers.membership import CONVERGE_BOUND_S, converged_at
from .cluster import ChaosCluster, ClusterSpec, PortsTaken
from .observer import Observer, ViewSample
from .scenarios import SCENARIO_SPECS, SCENARIOS, Plan
from .workload import RequestRecord, StoredRecord, Workload

PROGRESS_INTERVAL_S = 2.0
START_TIMEOUT_S = 60.0
KV_SETTLE_TIMEOUT_S = 15.0


@dataclasses.dataclass
class ExecutedEvent:
    t: float  # time.monotonic() when it was done
    at_s: float  # planned, seconds into the run
    label: str
    kind: str
    nodes: tuple[int, ...]
    model: str | None = None


@dataclasses.dataclass
class RunData:
    scenario: str
    seed: int
    nodes: int
    engines: int
    duration_s: float
    plan: Plan
    node_names: list[str]
    t0: float = 0.0
    t_end: float = 0.0
    heal_t: float = 0.0
    events: list[ExecutedEvent] = dataclasses.field(default_factory=list)
    records: list[RequestRecord] = dataclasses.field(default_factory=list)
    samples: list[ViewSample] = dataclasses.field(default_factory=list)
    final_running: list[int] = dataclasses.field(default_factory=list)
    final_state: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    final_kv: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    kv_wait_s: float = 0.0
    per_key_limit: float = 0.0
    per_key_burst: float = 0.0
    results: list[CheckResult] = dataclasses.field(default_factory=list)
    # Stored responses the cluster acknowledged, and what reading each back after the run gave: its
    # output text, or None when it was not found (or could not be read).
    stored: list[StoredRecord] = dataclasses.field(default_factory=list)
    stored_read: dict[str, str | None] = dataclasses.field(default_factory=dict)
    models: list[str] = dataclasses.field(default_factory=list)  # what the workload asked for

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)


def _wait_ready(cluster: ChaosCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx2.Client(timeout=2, headers=cluster.admin_headers) as client:
        while time.monotonic() < deadline:
            try:
                if not all(client.get(cluster.node_url(i) + "/readiness").status_code == 200
                           for i in range(cluster.spec.nodes)):
                    time.sleep(0.2)
                    continue
                listed = [client.get(cluster.node_url(i) + "/workers") for i in range(cluster.spec.nodes)]
                refused = [r for r in listed if r.status_code in (401, 403)]
                if refused:
                    raise RuntimeError(f"the nodes refuse the harness's admin token ({refused[0].status_code}): it "
                                       "reads the token the nodes take (--admin-token, SMG_NODE_ADMIN_TOKEN, the "
                                       "token file), so they disagree about it")
                if all(r.status_code == 200 and len(r.json().get("workers", ())) == cluster.spec.engines
                       for r in listed):
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.2)
    raise RuntimeError("the cluster did not become ready (every node ready, every engine everywhere)")


def _kv_views(cluster: ChaosCluster, client: httpx2.Client) -> dict[int, dict[str, Any]]:
    views = {}
    for i in cluster.running():
        workers = client.get(cluster.node_url(i) + "/workers").json()["workers"]
        # next sequence, blocks, fingerprint, and orphans (stores dropped for an unknown parent: a diagnosis)
        views[i] = {w["id"]: [w["kv_index"]["next_sequence"], w["kv_index"]["blocks"], w["kv_index"]["fingerprint"],
                              w["kv_index"].get("orphans", 0)] for w in workers if "kv_index" in w}
    return views


def _final_snapshots(cluster: ChaosCluster, run: RunData) -> None:
    with httpx2.Client(timeout=5, headers=cluster.admin_headers) as client:
        started = time.monotonic()
        while True:  # the last KV batches and replays settle once the load is gone
            try:
                views = _kv_views(cluster, client)
            except (httpx2.HTTPError, ValueError, KeyError):
                views = {}
            settled = views and len({kv_signature(v) for v in views.values()}) == 1
            if settled or time.monotonic() - started > KV_SETTLE_TIMEOUT_S:
                break
            time.sleep(0.5)
        run.final_kv, run.kv_wait_s = views, time.monotonic() - started
        for i in cluster.running():
            try:
                workers = client.get(cluster.node_url(i) + "/workers").json()["workers"]
                limits = client.get(cluster.node_url(i) + "/admin/rate-limits").json()
                limits.pop("node", None)
                run.final_state[i] = {"workers": workers, "limits": limits}
            except (httpx2.HTTPError, ValueError) as e:
                run.final_state[i] = {"workers": [], "limits": {"error": str(e)}}
    _read_stored(cluster, run)


def _read_stored(cluster: ChaosCluster, run: RunData) -> None:
    """Reads back every acknowledged stored response, each from the next running node in turn."""
    nodes = [i for i in cluster.running() if i not in cluster.paused]
    with httpx2.Client(timeout=10) as client:
        for k, record in enumerate(run.stored):
            url = f"{cluster.node_url(nodes[k % len(nodes)])}/v1/responses/{record.response_id}"
            try:
                r = client.get(url, headers={"authorization": f"Bearer {record.api_key}"})
                body = r.json() if r.status_code == 200 else None
            except (httpx2.HTTPError, ValueError):
                body = None
            run.stored_read[record.response_id] = _output_text(body) if body is not None else None


def _output_text(response: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for item in response.get("output", []) if item.get("type") == "message"
                   for part in item.get("content", []) if part.get("type") == "output_text")


# A block of fixed ports taken (a run that was killed, another program): the next blocks are tried, this far.
PORT_BLOCK_STEP = 400
PORT_BLOCKS_TRIED = 20


def _cluster_on_free_ports(spec: ClusterSpec, log_dir: Path, progress: Callable[[str], None]) -> ChaosCluster:
    """A cluster whose fixed ports (HTTP, gossip, admin, balancer: base to base + 300) are all free now."""
    for attempt in range(PORT_BLOCKS_TRIED):
        cluster = ChaosCluster(dataclasses.replace(spec, base_port=spec.base_port + attempt * PORT_BLOCK_STEP),
                               log_dir)
        taken = cluster.taken_ports()
        if not taken:
            return cluster
        progress(f"ports from {cluster.spec.base_port} are taken ({taken[0]}...): trying the next block")
    raise PortsTaken(f"no free block of ports from {spec.base_port} (tried {PORT_BLOCKS_TRIED} blocks)")


def run_scenario(name: str, nodes: int, seed: int, duration_s: float, out_dir: Path, lb: str = "nginx",
                 base_port: int = 21000, progress: Callable[[str], None] = print) -> RunData:
    scenario, _ = SCENARIOS[name]
    cluster = _cluster_on_free_ports(ClusterSpec(nodes=nodes, seed=seed, lb=lb, base_port=base_port,
                                                 **SCENARIO_SPECS.get(name, {})), out_dir / "logs", progress)
    spec = cluster.spec
    plan = scenario(cluster, random.Random(seed), duration_s)
    run = RunData(name, seed, nodes, spec.engines, duration_s, plan, [cluster.name(i) for i in range(nodes)],
                  per_key_limit=spec.per_key_limit, per_key_burst=spec.per_key_burst, models=cluster.models)
    progress(f"[{name}] starting {nodes} nodes, {spec.engines} engines and {lb} (seed {seed}, ports from "
             f"{spec.base_port}, logs in {cluster.dir})")
    observer = workload = None
    try:  # whatever fails, from the start on, everything started is stopped
        cluster.start()
        observer = Observer(cluster, spec.observe_interval_s)
        workload = Workload(cluster.lb_url, seed, models=cluster.models)
        _wait_ready(cluster)
        observer.start()
        workload.start()
        run.t0 = time.monotonic()
        pending = sorted(plan.events, key=lambda e: e.at_s)
        next_progress = run.t0
        last_label = "-"
        end = run.t0 + duration_s
        while True:
            now = time.monotonic()
            if pending and now >= run.t0 + pending[0].at_s:
                event = pending.pop(0)
                progress(f"[{name}] t={now - run.t0:5.1f}s  {event.label}")
                event.action()
                run.events.append(ExecutedEvent(now, event.at_s, event.label, event.kind, event.nodes, event.model))
                last_label = event.label
                continue
            if now >= end and not pending:
                break
            if now >= next_progress:
                next_progress = now + PROGRESS_INTERVAL_S
                progress(_progress_line(name, run.t0, workload, observer, cluster, last_label))
            wake = min([end, next_progress] + [run.t0 + e.at_s for e in pending[:1]])
            time.sleep(max(0.0, min(0.2, wake - time.monotonic())))
        run.heal_t = run.t0 + plan.heal_at_s
        run.t_end = time.monotonic()
        workload.stop()
        run.stored = workload.stored_snapshot()
        run.final_running = [i for i in cluster.running() if i not in cluster.paused]
        # Membership may still be settling if the heal came late in the run: give it its bound.
        deadline = run.heal_t + CONVERGE_BOUND_S
        while time.monotonic() < deadline:
            run.samples = observer.snapshot()
            if converged_at(run) is not None:
                break
            time.sleep(0.5)
        _final_snapshots(cluster, run)
    finally:
        if observer is not None:
            observer.stop()
            run.samples = observer.snapshot()
        if workload is not None:
            workload.stop()
            run.records = workload.snapshot()
        cluster.stop()
    run.results = [checker.check(run) for checker in all_checkers()]
    return run


def _progress_line(name: str, t0: float, workload: Workload, observer: Observer, cluster: ChaosCluster,
                   last: str) -> str:
    records = workload.snapshot()
    counts = {o: sum(1 for r in records if r.outcome == o) for o in ("ok", "rate_limited", "error")}
    views = []
    for i, sample in sorted(observer.latest().items()):
        if sample.members is None:
            views.append(f"{cluster.name(i)}:down")
        else:
            alive = sum(1 for s in sample.members.values() if s == "alive")
            views.append(f"{cluster.name(i)}:{alive}{'' if sample.ready else '!'}")
    return (f"[{name}] t={time.monotonic() - t0:5.1f}s  ok {counts['ok']}  429 {counts['rate_limited']}  "
            f"errors {counts['error']}  | alive seen {' '.join(views)}  | last: {last}")

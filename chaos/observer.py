"""Each node's view of the cluster over time, polled from its admin endpoint and readiness.

A sample every ``interval_s`` per node: the members it lists and their states,
and whether it is ready. A node that does not answer (killed, paused,
restarting) is recorded as ``down``: the timeline shows that as a gap.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2

from .cluster import ChaosCluster


@dataclasses.dataclass
class ViewSample:
    t: float  # time.monotonic()
    node: int
    members: dict[str, str] | None  # name -> state; None: did not answer
    ready: bool


class Observer:
    def __init__(self, cluster: ChaosCluster, interval_s: float = 0.5) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self.samples: list[ViewSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="observer")
        self._pool = ThreadPoolExecutor(max_workers=cluster.spec.nodes)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._pool.shutdown(wait=False)

    def snapshot(self) -> list[ViewSample]:
        with self._lock:
            return list(self.samples)

    def latest(self) -> dict[int, ViewSample]:
        out: dict[int, ViewSample] = {}
        for sample in self.snapshot():
            out[sample.node] = sample
        return out

    def _loop(self) -> None:
        with httpx2.Client(timeout=0.4, headers=self.cluster.admin_headers) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                for sample in self._pool.map(lambda i: self.sample(client, i), range(self.cluster.spec.nodes)):
                    with self._lock:
                        self.samples.append(sample)
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def sample(self, client: httpx2.Client, i: int) -> ViewSample:
        now = time.monotonic()
        if i in self.cluster.paused:
            return ViewSample(now, i, None, False)
        try:
            r = client.get(f"http://{self.cluster.admin_addr(i)}/v1/members")
            members = {m["name"]: m["state"] for m in r.json()["members"]}
        except (httpx2.HTTPError, ValueError, KeyError):
            return ViewSample(now, i, None, False)
        try:
            ready = client.get(self.cluster.node_url(i) + "/readiness").status_code == 200
        except httpx2.HTTPError:
            ready = False
        return ViewSample(now, i, members, ready)

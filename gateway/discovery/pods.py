"""What a pod says, read from the API's JSON, and the set of pods one watch keeps (no I/O).

A pod is a worker only while it runs, has an IP, is Ready (its readiness probe passes: the engine answers)
and is not being deleted (``deletionTimestamp``): a pod on its way out is drained while it finishes what it
has, not handed new requests.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from .config import DiscoveryConfig

# A pod's labels and annotations beyond this many characters are not an engine's (a flood): the pod is ignored,
# counted. Of what is under it, a pod keeps only the keys discovery reads (``PodCache.kept``): 2,000 pods of
# 250 KB of annotations each were +477 MiB held, and the bounds allowed ~5 GB.
POD_FIELD_CHARS_MAX = 256 * 1024
# Pods one selector may hold: a selector matching a whole large cluster by mistake (or by someone who may
# create pods) costs this much memory at most; the pods beyond it are ignored, counted.
PODS_MAX = 10_000


class PodInvalid(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    ip: str | None
    phase: str
    ready: bool
    terminating: bool
    labels: "tuple[tuple[str, str], ...]"
    annotations: "tuple[tuple[str, str], ...]"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def serving(self) -> bool:
        """Ready to take requests: running, with an IP, Ready, not terminating."""
        return self.phase == "Running" and self.ip is not None and self.ready and not self.terminating

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)

    def annotation(self, key: str) -> str | None:
        return dict(self.annotations).get(key)



def _strings(value: Any, what: str, kept: "frozenset[str] | None") -> "tuple[tuple[str, str], ...]":
    """A map of strings, checked whole, of which the ``kept`` keys are kept (None: all)."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise PodInvalid(f"{what} is not a map of strings")
    if sum(len(k) + len(v) for k, v in value.items()) > POD_FIELD_CHARS_MAX:
        raise PodInvalid(f"{what} too large")
    return tuple(sorted(item for item in value.items() if kept is None or item[0] in kept))


def parse_pod(obj: Any, kept: "frozenset[str] | None" = None) -> Pod:
    """A Pod from the API's JSON object; PodInvalid when it is not one. ``kept``: the label and annotation keys
    kept (None: all)."""
    if not isinstance(obj, dict):
        raise PodInvalid("not an object")
    meta, status = obj.get("metadata"), obj.get("status") or {}
    if not isinstance(meta, dict) or not isinstance(status, dict):
        raise PodInvalid("no metadata")
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name or not isinstance(namespace, str) or len(name) + len(namespace) > 320:
        raise PodInvalid("no name")
    ip = status.get("podIP") or None
    if ip is not None:
        try:
            ip = str(ipaddress.ip_address(ip))  # an address, never a host name or a URL someone wrote there
        except (ValueError, TypeError):
            raise PodInvalid(f"pod {namespace}/{name}: podIP {ip!r} is not an address") from None
    conditions = status.get("conditions") or []
    ready = isinstance(conditions, list) and any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    phase = status.get("phase")
    return Pod(namespace, name, str(meta.get("uid") or ""), ip, phase if isinstance(phase, str) else "Unknown",
               ready, meta.get("deletionTimestamp") is not None, _strings(meta.get("labels"), "labels", kept),
               _strings(meta.get("annotations"), "annotations", kept))


class PodCache:
    """The pods one list-and-watch knows, and the resourceVersion to resume from.

    ``replace`` takes a list's items (the whole truth at that version); ``apply`` a watch event. Both say
    whether what the pods are changed (a BOOKMARK only moves the version).
    """

    def __init__(self, kept: "frozenset[str] | None" = None) -> None:
        self.kept = kept  # the label and annotation keys discovery reads (None: all)
        self.pods: dict[str, Pod] = {}
        self.resource_version = ""
        self.synced = False  # listed at least once: until then nothing may be concluded from absence
        self.invalid = 0  # objects that were not pods (counted, ignored)
        self.over_limit = 0  # pods beyond PODS_MAX (counted, ignored)
        self.pods_max = PODS_MAX

    def replace(self, items: "list[Any]", resource_version: str) -> bool:
        pods = {}
        for obj in items:
            try:
                pod = parse_pod(obj, self.kept)
            except PodInvalid:
                self.invalid += 1
                continue
            if len(pods) >= self.pods_max and pod.key not in pods:
                self.over_limit += 1
                continue
            pods[pod.key] = pod
        changed = pods != self.pods or not self.synced
        self.pods, self.resource_version, self.synced = pods, resource_version, True
        return changed

    def apply(self, kind: str, obj: Any) -> bool:
        """One watch event (ADDED, MODIFIED, DELETED, BOOKMARK); ERROR events are the watcher's to handle."""
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if isinstance(version, str) and version:
            self.resource_version = version
        if kind == "BOOKMARK":
            return False
        try:
            pod = parse_pod(obj, self.kept)
        except PodInvalid:
            self.invalid += 1
            return False
        if kind == "DELETED":
            return self.pods.pop(pod.key, None) is not None
        if kind in ("ADDED", "MODIFIED"):
            if pod.key not in self.pods and len(self.pods) >= self.pods_max:
                self.over_limit += 1
                return False
            changed = self.pods.get(pod.key) != pod
            self.pods[pod.key] = pod
            return changed
        self.invalid += 1
        return False


@dataclasses.dataclass(frozen=True)
class DiscoveredWorker:
    url: str
    role: str  # regular, prefill, decode
    pod: str  # namespace/name
    bootstrap_port: int | None = None
    model: str | None = None


def annotated_port(text: str | None) -> int | None:
    """A port an annotation gives (bootstrap, mesh); None when it is absent or not a port."""
    if text is None or not text.strip().isdigit():
        return None
    port = int(text)
    return port if 0 < port < 65536 else None


def host_in_url(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def worker_of(pod: Pod, role: str, config: DiscoveryConfig) -> DiscoveredWorker:
    model = pod.label(config.model_label) or pod.annotation(config.model_label)
    return DiscoveredWorker(f"{config.protocol}://{host_in_url(pod.ip or '')}:{config.port}", role, pod.key,
                            annotated_port(pod.annotation(config.bootstrap_port_annotation)) if role == "prefill" else None,
                            model or None)


def desired_workers(caches: "list[tuple[str, PodCache]]", config: DiscoveryConfig) -> "dict[str, DiscoveredWorker]":
    """URL -> worker, from each role's cache: serving pods only. A pod that two role selectors match keeps the
    first of them in ``caches`` (DiscoveryConfig.role_selectors' order: regular, prefill, decode)."""
    out: dict[str, DiscoveredWorker] = {}
    for role, cache in caches:
        for pod in cache.pods.values():
            if pod.serving:
                worker = worker_of(pod, role, config)
                out.setdefault(worker.url, worker)
    return out

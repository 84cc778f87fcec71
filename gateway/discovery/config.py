"""The settings of Kubernetes discovery (``--service-discovery`` and its flags) and their label selectors."""

from __future__ import annotations

import dataclasses
import re

# Kubernetes' own syntax for label keys (an optional DNS prefix, then a name) and values (at most 63 of
# alphanumerics, '-', '_', '.'): a selector that could never match a pod is refused at start.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")

Selector = tuple[tuple[str, str], ...]


class SelectorError(ValueError):
    pass


def parse_selector(terms: "tuple[str, ...] | list[str]") -> Selector:
    """``app=sglang role=prefill`` (or one comma-separated term, as kubectl takes it) -> sorted (key, value)
    pairs. Equality only: what smg's selectors are."""
    pairs: dict[str, str] = {}
    for term in (t.strip() for chunk in terms for t in chunk.split(",")):
        if not term:
            continue
        key, eq, value = term.replace("==", "=").partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise SelectorError(f"{term!r} is not a label selector term KEY=VALUE")
        if pairs.get(key, value) != value:
            raise SelectorError(f"label {key} asked to be both {pairs[key]!r} and {value!r}")
        pairs[key] = value
    return tuple(sorted(pairs.items()))


def selector_text(selector: Selector) -> str:
    """The ``labelSelector`` query parameter."""
    return ",".join(f"{k}={v}" for k, v in selector)


@dataclasses.dataclass(frozen=True)
class DiscoveryConfig:
    # --service-discovery: engines are the Ready pods the selectors match, added and drained as pods come
    # and go (smg's flag). Off: engines come from --worker-urls, --prefill/--decode and POST /workers.
    enabled: bool = False
    selector: Selector = ()  # --selector: regular engines
    prefill_selector: Selector = ()  # --prefill-selector: prefill engines (with --pd-disaggregation)
    decode_selector: Selector = ()  # --decode-selector: decode engines
    # --router-selector: the pods of smg-node itself; their IPs (and the mesh port) are the mesh's seeds.
    router_selector: Selector = ()
    # --service-discovery-namespace: one namespace (a Role suffices); None: every namespace (a ClusterRole).
    namespace: str | None = None
    # --service-discovery-port: the engines' port on their pod IP. 80 is smg's default; engines' gRPC ports
    # are usually set (SGLang and vLLM take --port).
    port: int = 80
    # --service-discovery-protocol: grpc (token ids, the gateway's own path) or http (OpenAI-compatible, proxied).
    protocol: str = "grpc"
    # The annotation with a prefill pod's bootstrap port (SGLang's; smg reads the same), else 8998.
    bootstrap_port_annotation: str = "sglang.ai/bootstrap-port"
    # The annotation with a router pod's mesh port (smg's name), else this node's own mesh port.
    mesh_port_annotation: str = "sglang.ai/mesh-port"
    # --service-discovery-model-label: the label (or annotation: model ids often hold a '/', which label values
    # may not) naming a pod's model; absent, the engine says (GetModelInfo).
    model_label: str = "smg.ai/model"
    # A list is read in pages of this many pods (limit/continue), so a large namespace is no single answer.
    list_page_size: int = 500
    # A watch asks the server to end it after this long (timeoutSeconds) and is then resumed from the last
    # resourceVersion: a connection silently lost is noticed within this plus READ_GRACE_S.
    watch_timeout_s: float = 290.0
    # A watch that drops (or a list that fails) is retried after this, doubled on each failure up to the most,
    # with jitter, so a restarted API server is not met by every node at once.
    backoff_first_s: float = 0.5
    backoff_max_s: float = 30.0
    # A discovered engine that could not be added (not answering yet) is tried again at this interval.
    retry_add_interval_s: float = 5.0

    def role_selectors(self) -> "list[tuple[str, Selector]]":
        """(role, selector) of every engine selector given."""
        return [(role, sel) for role, sel in (("regular", self.selector), ("prefill", self.prefill_selector),
                                              ("decode", self.decode_selector)) if sel]

"""The settings of Kubernetes discovery (``--service-discovery`` and its flags) and their label selectors."""

from __future__ import annotations

import dataclasses
import re
from ..base.options import Option

# Kubernetes' own syntax for label keys (an optional DNS prefix, then a name) and values (at most 63 of
# alphanumerics, '-', '_', '.'): a selector that could never match a pod is refused at start.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")

# One requirement of a selector: (key, operator, values), the operator one of =, !=, in, notin, exists, !exists
# (Kubernetes' equality- and set-based label selectors).
Requirement = tuple[str, str, tuple[str, ...]]
Selector = tuple[Requirement, ...]

_SET_TERM = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")
_EQUALITY_TERM = re.compile(r"^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$")


class SelectorError(ValueError):
    pass


def _terms(text: str) -> "list[str]":
    """A selector's terms: split at commas outside parentheses; an equality-only text may also separate its terms
    by spaces (``app=sglang role=prefill``, as smg takes them)."""
    terms, depth, current = [], 0, ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    out = []
    for term in (t.strip() for t in terms):
        if term and "(" not in term and re.search(r"\s", term) and not re.search(r"\s(in|notin)\s", term):
            out.extend(term.split())
        elif term:
            out.append(term)
    return out


def _requirement(term: str) -> Requirement:
    if match := _SET_TERM.match(term):
        values = tuple(sorted({v.strip() for v in match.group(3).split(",") if v.strip()}))
        key, op = match.group(1), match.group(2)
    elif match := _EQUALITY_TERM.match(term):
        key, op, values = match.group(1), "!=" if match.group(2) == "!=" else "=", (match.group(3),)
    elif term.startswith("!"):
        key, op, values = term[1:].strip(), "!exists", ()
    else:
        key, op, values = term, "exists", ()
    if not _LABEL_KEY.match(key) or not all(_LABEL_VALUE.match(v) for v in values) or (op in ("in", "notin")
                                                                                       and not values):
        raise SelectorError(f"{term!r} is not a label selector term (KEY=VALUE, KEY!=VALUE, KEY in (A,B), "
                            "KEY notin (A,B), KEY or !KEY)")
    return key, op, values


def parse_selector(terms: "tuple[str, ...] | list[str]") -> Selector:
    """Kubernetes' label selectors, equality- and set-based, given as flags (``app=sglang role=prefill``,
    ``"app in (sglang, vllm),tier=gpu"``) -> the requirements, sorted."""
    requirements = {_requirement(term) for chunk in terms for term in _terms(chunk)}
    equal: dict[str, str] = {}
    for key, op, values in requirements:
        if op == "=" and equal.setdefault(key, values[0]) != values[0]:
            raise SelectorError(f"label {key} asked to be both {equal[key]!r} and {values[0]!r}")
    return tuple(sorted(requirements))


def selector_text(selector: Selector) -> str:
    """The ``labelSelector`` query parameter."""
    def one(key: str, op: str, values: "tuple[str, ...]") -> str:
        if op in ("=", "!="):
            return f"{key}{op}{values[0]}"
        if op in ("in", "notin"):
            return f"{key} {op} ({','.join(values)})"
        return key if op == "exists" else f"!{key}"
    return ",".join(one(*requirement) for requirement in selector)


def selector_matches(selector: Selector, labels: "dict[str, str]") -> bool:
    """Whether labels satisfy every requirement (the API server's rule, for what is checked here)."""
    for key, op, values in selector:
        value = labels.get(key)
        if not {"=": value is not None and value in values, "!=": value not in values,
                "in": value in values, "notin": value not in values,
                "exists": value is not None, "!exists": value is None}[op]:
            return False
    return True


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

    def pod_keys_read(self) -> "frozenset[str]":
        """The label and annotation keys discovery reads of a pod (all that a pod keeps: gateway/discovery/pods.py)."""
        return frozenset({self.model_label, self.bootstrap_port_annotation, self.mesh_port_annotation})

    def role_selectors(self) -> "list[tuple[str, Selector]]":
        """(role, selector) of every engine selector given."""
        return [(role, sel) for role, sel in (("regular", self.selector), ("prefill", self.prefill_selector),
                                              ("decode", self.decode_selector)) if sel]


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--service-discovery", "discovery.enabled", "bool", "find engines as Kubernetes pods by label: added "
           "once Ready with an IP, drained when they go (credentials: the pod's service account, else KUBECONFIG or "
           "~/.kube/config)", "discovery"),
    Option("--selector", "discovery.selector", "selector", "labels of the engines' pods: KEY=VALUE ... (Kubernetes' "
           "selectors: also KEY!=VALUE, 'KEY in (A,B)', 'KEY notin (A,B)', KEY, !KEY)", "discovery"),
    Option("--prefill-selector", "discovery.prefill_selector", "selector", "labels of prefill engines' pods (with "
           "--pd-disaggregation; bootstrap port from the sglang.ai/bootstrap-port annotation)", "discovery"),
    Option("--decode-selector", "discovery.decode_selector", "selector", "labels of decode engines' pods", "discovery"),
    Option("--router-selector", "discovery.router_selector", "selector", "labels of smg-node's own pods: the mesh "
           "joins them (port from the sglang.ai/mesh-port annotation, else this node's), no seed list needed",
           "discovery"),
    Option("--service-discovery-namespace", "discovery.namespace", str, "namespace to watch (default: every "
           "namespace, which needs a ClusterRole)", "discovery"),
    Option("--service-discovery-port", "discovery.port", int, "the engines' port on their pod IP (default 80)",
           "discovery"),
    Option("--service-discovery-protocol", "discovery.protocol", str, "grpc (default: token ids over gRPC) or http "
           "(OpenAI-compatible engines, proxied)", "discovery"),
    Option("--service-discovery-model-label", "discovery.model_label", str, "label (or annotation) naming a pod's "
           "model (default smg.ai/model); without it the engine says (GetModelInfo)", "discovery"),
)

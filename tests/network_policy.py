"""NetworkPolicy (networking.k8s.io/v1) ingress semantics, evaluated in Python for the tests.

What a conforming engine decides for a new TCP connection to a pod, from the
API reference (k8s.io/api networking/v1 types.go, NetworkPolicySpec,
NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort):

- A pod is isolated for ingress when a NetworkPolicy of its namespace selects
  it (podSelector) and has "Ingress" in policyTypes; policyTypes left out
  means Ingress (plus Egress when egress rules exist).
- An isolated pod admits a connection when any rule of any such policy admits
  it (policies add up); an unisolated pod admits everything, and so does any
  pod for traffic from its own node.
- A rule with no `from` admits every source; otherwise a peer must match:
  podSelector alone = pods of the policy's namespace; namespaceSelector alone
  = every pod of the selected namespaces; both = the selected pods of the
  selected namespaces; ipBlock = addresses (not modelled: corral's policies
  use none, and the helper refuses one).
- A rule with no `ports` admits every port; otherwise the protocol (default
  TCP) and port (number, or a named container port of the destination) match.
- Label selectors: matchLabels and matchExpressions ANDed; NotIn and
  DoesNotExist match a pod without the key (k8s.io/apimachinery labels).
  Namespaces carry `kubernetes.io/metadata.name` (set by the API server).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    namespace_labels: dict[str, str] = field(default_factory=dict)
    named_ports: dict[str, int] = field(default_factory=dict)
    host_network: bool = False
    node: str = "node-a"


def selector_matches(selector: dict, labels: dict[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In":
            ok = present and labels[key] in values
        elif operator == "NotIn":
            ok = not present or labels[key] not in values
        elif operator == "Exists":
            ok = present
        elif operator == "DoesNotExist":
            ok = not present
        else:
            raise ValueError(f"unknown selector operator {operator!r}")
        if not ok:
            return False
    return True


def _namespace_labels(pod: Pod) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": pod.namespace, **pod.namespace_labels}


def policy_types(policy: dict) -> list[str]:
    spec = policy["spec"]
    if "policyTypes" in spec:
        return spec["policyTypes"]
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


def selects(policy: dict, pod: Pod) -> bool:
    return policy["metadata"]["namespace"] == pod.namespace and selector_matches(policy["spec"]["podSelector"], pod.labels)


def isolating_policies(policies: list[dict], pod: Pod) -> list[dict]:
    return [p for p in policies if selects(p, pod) and "Ingress" in policy_types(p)]


def _peer_matches(peer: dict, policy_namespace: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        raise NotImplementedError("ipBlock peers are not modelled")
    pod_selector, namespace_selector = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespace_selector is None:
        namespace_ok = source.namespace == policy_namespace
    else:
        namespace_ok = selector_matches(namespace_selector, _namespace_labels(source))
    return namespace_ok and (pod_selector is None or selector_matches(pod_selector, source.labels))


def _port_matches(rule_port: dict, port: int, protocol: str, destination: Pod) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    wanted = rule_port.get("port")
    if wanted is None:
        return True
    if isinstance(wanted, str):
        wanted = destination.named_ports.get(wanted)
        if wanted is None:
            return False
    return wanted <= port <= rule_port.get("endPort", wanted)


def admits(policies: list[dict], source: Pod, destination: Pod, port: int, protocol: str = "TCP") -> bool:
    """Whether a connection from `source` to `destination`:`port` is admitted on ingress."""
    if source.host_network and source.node == destination.node:
        return True  # the pod's own node
    isolating = isolating_policies(policies, destination)
    if not isolating:
        return True
    for policy in isolating:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            if peers and not any(_peer_matches(p, policy["metadata"]["namespace"], source) for p in peers):
                continue
            ports = rule.get("ports")
            if ports and not any(_port_matches(p, port, protocol, destination) for p in ports):
                continue
            return True
    return False

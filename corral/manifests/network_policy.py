"""NetworkPolicy for corral's own services: the engine that enforces it, and monitoring's policies.

flannel moves packets and enforces no NetworkPolicy: without an engine a
NetworkPolicy object is stored and ignored. corral runs kubernetes-sigs'
kube-network-policies beside flannel (docs/addons.md, "NetworkPolicy", says
why this engine), and isolates the monitoring namespace with it: Prometheus,
kube-state-metrics, dcgm-exporter and Grafana show every team's pods and usage,
so a team's pod must not reach them.

The policies admit, per monitoring component, only the monitoring pods that
talk to it (MONITORING_INGRESS). What else reaches these services does not
cross the pod network, so no policy applies to it and none is needed:

- `kubectl port-forward` (how operators, `corral usage` and Grafana's users
  reach Prometheus and Grafana): the container runtime enters the pod's
  network namespace and dials localhost there (containerd
  pkg/cri/server/sandbox_portforward_linux.go: `netNSDo` ... `net.Dial("tcp4",
  "localhost:<port>")`), so the connection never passes the pod's interface
  or the node's forwarding path the engine hooks.
- The kubelet's readiness probes: from the pod's own node, which NetworkPolicy
  always admits ("OR if the traffic source is the pod's local node",
  NetworkPolicySpec.ingress in the API reference) and the engine leaves alone
  (root's traffic on the node is accepted before the queue: `meta skuid 0
  accept`, pkg/dataplane/controller.go).

Nothing in corral reads these services through the API server's service proxy
(`/api/v1/namespaces/corral-monitoring/services/.../proxy`), which comes from an
API server's address and is refused; there is no HPA metrics adapter.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import monitoring, versions
from .policy import MONITORING_NAMESPACE

ENGINE = "kube-network-policies"
ENGINE_NAMESPACE = "kube-system"
# Flags of kube-network-policies v1.1.1 (pkg/cmd/cmd.go, Options.AddFlags).
ENGINE_ARGS = (
    # The node its pods are looked up for (the DaemonSet's env, from spec.nodeName).
    "--hostname-override=$(MY_NODE_NAME)",
    # Level 2 turns on its LoggingPolicy: a log line for every connection it
    # decides (pkg/networkpolicy/logging.go). Level 1 logs only its own state.
    "--v=1",
    # NRI (the runtime telling it a new pod's address before the pod runs) is
    # off in containerd 1.7, which corral's nodes run; without it the engine
    # learns addresses from the API server, as its log says it falls back to.
    "--disable-nri",
    # Its metrics port on a hostNetwork pod would listen on every node
    # address (default ":9080"); nothing scrapes it.
    "--metrics-bind-address=127.0.0.1:9080",
)
# --fail-open stays at its default (true): when the engine is not running on a
# node, the nfqueue rule's bypass flag lets that node's pods' packets through,
# and on a clean shutdown it removes its rules either way (Controller.Shutdown).
# So a policy holds while the engine runs: Grafana has its own login besides.

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
# hostNetwork pods of the namespace: their address is the node's. No policy
# selects them (NetworkPolicy's behaviour for them is undefined, and engines
# before kube-network-policies v1.1.1 put the node's address under the policy).
HOST_NETWORK_COMPONENTS = ("node-exporter",)


@dataclass(frozen=True)
class Ingress:
    """Who may open connections to one monitoring component, on which port, and why."""

    component: str                        # app.kubernetes.io/name of the pods admitted to
    port: int
    peers: tuple[dict[str, str], ...]     # label sets of the monitoring pods admitted
    why: str


PROMETHEUS = {NAME_LABEL: "prometheus"}
PROMETHEUS_GLOBAL = {NAME_LABEL: "prometheus", INSTANCE_LABEL: monitoring.GLOBAL_NAME}
GRAFANA = {NAME_LABEL: "grafana"}


def monitoring_ingress(gpu: bool) -> list[Ingress]:
    """Every connection inside corral-monitoring the scrape configs and datasources make."""
    allowed = [
        Ingress("prometheus", monitoring.PORT, (PROMETHEUS_GLOBAL, GRAFANA),
                "the global pair federates each shard; Grafana queries the global pair and every shard"),
        Ingress("kube-state-metrics", monitoring.KSM_PORT, (PROMETHEUS_GLOBAL,),
                "the global pair scrapes kube-state-metrics (job kube-state-metrics)"),
    ]
    if gpu:
        allowed.append(Ingress("dcgm-exporter", monitoring.DCGM_EXPORTER_PORT, (PROMETHEUS,),
                               "the shards scrape dcgm-exporter (job dcgm-exporter)"))
    # Grafana: nothing in the cluster opens it; people reach it by port-forward.
    return allowed


def _not_host_network() -> dict:
    return {"matchExpressions": [{"key": NAME_LABEL, "operator": "NotIn", "values": list(HOST_NETWORK_COMPONENTS)}]}


def monitoring_policies(gpu: bool) -> list[dict]:
    """corral-monitoring's NetworkPolicies: deny every ingress, then admit MONITORING_INGRESS."""
    meta = {"namespace": MONITORING_NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "corral"}}
    policies = [{
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "default-deny-ingress", **meta},
        # Every pod on the pod network, labelled or not (NotIn matches a pod
        # without the label), present and future: isolated for ingress.
        "spec": {"podSelector": _not_host_network(), "policyTypes": ["Ingress"]},
    }]
    for allowed in monitoring_ingress(gpu):
        policies.append({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": f"{allowed.component}-ingress", **meta,
                         "annotations": {"corral.dev/why": allowed.why}},
            "spec": {
                "podSelector": {"matchLabels": {NAME_LABEL: allowed.component}},
                "policyTypes": ["Ingress"],
                "ingress": [{
                    # A podSelector without a namespaceSelector: pods of this namespace only.
                    "from": [{"podSelector": {"matchLabels": dict(peer)}} for peer in allowed.peers],
                    "ports": [{"protocol": "TCP", "port": allowed.port}],
                }],
            },
        })
    return policies


def engine_context() -> dict:
    return {"engine": ENGINE, "namespace": ENGINE_NAMESPACE, "image": versions.KUBE_NETWORK_POLICIES,
            "args": list(ENGINE_ARGS)}

"""The ordered upgrade plan: control plane machines, cloud pools, on-prem batches.

`corral upgrade --check` prints it without acting. The cluster's state comes
from the API server (`kubectl version`, `kubectl get nodes`) through the
caller's `ClusterAccess`; nothing here changes anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from corral.model import Cluster
from corral.model.layout import layout, node_group_name
from corral.nodes import inventory as inv

from .versions import KubeVersion, UpgradeError, check_control_plane_target, check_node_target

# The annotation node_drain puts on a node it cordons (ansible/roles/node_drain).
CORDON_ANNOTATION = "corral.dev/cordoned-by"
_BATCH = re.compile(r"([1-9]\d*)(%?)\Z")


@dataclass(frozen=True)
class NodeState:
    name: str
    kubelet: KubeVersion | None
    unschedulable: bool = False
    cordoned_by_corral: bool = False
    ready: bool = True


@dataclass(frozen=True)
class ClusterState:
    api_server: KubeVersion
    nodes: dict[str, NodeState]

    @property
    def kubelets(self) -> dict[str, KubeVersion]:
        return {n.name: n.kubelet for n in self.nodes.values() if n.kubelet is not None}


def _kubectl_json(access, args: list[str]) -> dict:
    result = access.kubectl(args)
    if result.returncode != 0:
        raise UpgradeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        raise UpgradeError(f"kubectl {' '.join(args)} did not print JSON") from None


def read_cluster_state(access) -> ClusterState:
    """The API server's version and every node's kubelet version and cordon."""
    version = _kubectl_json(access, ["version", "-o", "json"])
    server = (version.get("serverVersion") or {}).get("gitVersion")
    if not server:
        raise UpgradeError("kubectl version -o json: no serverVersion (is the API server reachable?)")
    nodes = {}
    for item in _kubectl_json(access, ["get", "nodes", "-o", "json"]).get("items", []):
        name = item["metadata"]["name"]
        raw = (item.get("status", {}).get("nodeInfo") or {}).get("kubeletVersion")
        conditions = item.get("status", {}).get("conditions") or []
        nodes[name] = NodeState(
            name=name,
            kubelet=KubeVersion.parse(raw, f"node {name} kubeletVersion") if raw else None,
            unschedulable=bool(item.get("spec", {}).get("unschedulable")),
            cordoned_by_corral=CORDON_ANNOTATION in (item["metadata"].get("annotations") or {}),
            ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        )
    return ClusterState(KubeVersion.parse(server, "API server version"), nodes)


def parse_batch(text: str) -> str:
    """`--batch`: a host count (`5`) or a percentage of the hosts to upgrade (`10%`)."""
    match = _BATCH.match(str(text).strip())
    if match is None or (match.group(2) and int(match.group(1)) > 100):
        raise UpgradeError(f"--batch {text}: expected a host count like 5 or a percentage like 10% (1-100%)")
    return match.group(0)


def serial_batches(hosts: list[str], batch: str) -> list[list[str]]:
    """Hosts split as Ansible's `serial` splits them (a percentage rounds down, at least 1)."""
    number, percent = _BATCH.match(batch).groups()
    size = max(1, int(int(number) / 100.0 * len(hosts))) if percent else int(number)
    return [hosts[i:i + size] for i in range(0, len(hosts), size)]


def node_for_host(host: str, nodes: dict[str, NodeState]) -> NodeState | None:
    """The Node of an inventory host: kubeadm names a node after the host's
    hostname, which is the inventory name or its first label."""
    return nodes.get(host.lower()) or nodes.get(host.split(".")[0].lower())


@dataclass
class Step:
    phase: str      # control-plane | cloud-pool | on-prem
    what: str
    action: str


@dataclass
class UpgradePlan:
    cluster: str
    target: KubeVersion
    api_server: KubeVersion
    steps: list[Step] = field(default_factory=list)
    onprem_batches: list[list[str]] = field(default_factory=list)
    onprem_current: list[str] = field(default_factory=list)
    onprem_not_nodes: list[str] = field(default_factory=list)


def build_plan(cluster: Cluster, target: KubeVersion, state: ClusterState, batch: str,
               hosts: list[str] | None = None) -> UpgradePlan:
    """Everything the upgrade to `target` does, in order; raises on a skew violation."""
    plan = UpgradePlan(cluster.name, target, state.api_server)
    if state.api_server < target:
        check_control_plane_target(target, state.api_server, state.kubelets)
        for machine in layout(cluster).api_servers:
            plan.steps.append(Step("control-plane", machine.name,
                                   f"replace (pulumi up --replace), then gates: etcd healthy, /readyz, "
                                   f"node Ready at {target}"))
    else:
        check_node_target(target, state.api_server, state.kubelets)
    for pool in cluster.cloud_pools:
        if pool.gpu is None:
            plan.steps.append(Step("cloud-pool", node_group_name(cluster, pool),
                                   f"rolling replacement by the {pool.provider} node group (new launch "
                                   f"configuration at {target}; surge, health-checked)"))
        else:
            plan.steps.append(Step("cloud-gpu-pool", node_group_name(cluster, pool),
                                   f"nodes not at {target}, a batch at a time: cordon, drain (PDBs), replace the "
                                   "instance through the group, wait for the replacements Ready"))
    owners = inv.host_pool(cluster)
    for host in hosts if hosts is not None else list(owners):
        node = node_for_host(host, state.nodes)
        if node is None:
            plan.onprem_not_nodes.append(host)
        elif node.kubelet != target or node.cordoned_by_corral:
            plan.onprem_batches.append(host)  # flattened; batched below
        else:
            plan.onprem_current.append(host)
    pending = sorted(plan.onprem_batches)  # the playbook's `order: sorted`
    plan.onprem_batches = serial_batches(pending, batch) if pending else []
    for number, hosts_in_batch in enumerate(plan.onprem_batches, 1):
        plan.steps.append(Step("on-prem", f"batch {number}: {', '.join(hosts_in_batch)}",
                               "cordon, drain (PDBs), packages + kubeadm upgrade node (+ driver), "
                               "restart kubelet, wait Ready, uncordon"))
    return plan

"""The decisions behind the add-on manifests, as plain data derived from the cluster.

The templates in corral/templates/manifests/ only lay these values out; the
tests check the policy here and in the rendered objects. Labels and taints
always come from `Cluster.node_labels` / `Cluster.node_taints`, the same
functions the join configuration and the cloud node pools use, so a
selector here can never disagree with what nodes register with.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from corral.model.layout import node_group_name
from corral.model.schema import TEAM_TAINT_KEY, CloudPool, Cluster, OnPremPool, Taint, Team

FLANNEL_NAMESPACE = "kube-flannel"
MONITORING_NAMESPACE = "corral-monitoring"
# Namespaces whose pods are node agents that must run on every node, reserved
# ones included. Only cluster admins create pods there; the team policy
# exempts them.
SYSTEM_NAMESPACES = ("kube-system", FLANNEL_NAMESPACE, MONITORING_NAMESPACE)

GPU_TAINT_KEY = "nvidia.com/gpu"
# The label every GPU pool's nodes register with (Cluster.node_labels).
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"

# PodTolerationRestriction namespace annotations.
DEFAULT_TOLERATIONS_ANNOTATION = "scheduler.alpha.kubernetes.io/defaultTolerations"
TOLERATIONS_WHITELIST_ANNOTATION = "scheduler.alpha.kubernetes.io/tolerationsWhitelist"
RESERVED_POOLS_ANNOTATION = "corral.dev/reserved-pools"

# Taints the node lifecycle controller and the DaemonSet controller put on or
# tolerate for nodes in trouble. A team namespace's whitelist must allow them,
# or the defaults Kubernetes itself adds to pods (not-ready/unreachable for
# 300 s, the conditions for DaemonSet pods) would be rejected.
NODE_CONDITION_TAINTS = (
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/not-ready", "NoSchedule"),
    ("node.kubernetes.io/unreachable", "NoSchedule"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ("node.kubernetes.io/network-unavailable", "NoSchedule"),
)


class ManifestError(ValueError):
    """The cluster cannot be rendered into add-on manifests; the message says why."""


def toleration(key: str, effect: str | None = None, value: str | None = None) -> dict[str, str]:
    """A Kubernetes toleration: `Equal` when a value is given, else `Exists`."""
    out: dict[str, str] = {"key": key, "operator": "Equal" if value is not None else "Exists"}
    if value is not None:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


def tolerates(tolerations: list[dict], taint: Taint) -> bool:
    """Whether any of `tolerations` tolerates `taint`, by the scheduler's rules."""
    for t in tolerations:
        key, operator = t.get("key", ""), t.get("operator", "Equal")
        if t.get("effect") and t["effect"] != taint.effect:
            continue
        if key == "" and operator == "Exists":
            return True
        if key != taint.key:
            continue
        if operator == "Exists" or t.get("value", "") == taint.value:
            return True
    return False


# --- GPU node agents (device plugin, dcgm-exporter) -------------------------


def gpu_pools(cluster: Cluster) -> list[OnPremPool | CloudPool]:
    return [p for p in cluster.node_pools if p.gpu]


def gpu_node_selector() -> dict[str, str]:
    return {GPU_PRESENT_LABEL: "true"}


def gpu_tolerations(cluster: Cluster) -> list[dict[str, str]]:
    """What the GPU node agents tolerate: the GPU taint, every team's taint, and
    every other taint a GPU pool's nodes carry (e.g. a spot pool's), so they run
    on every GPU node. Team reservations are tolerated by key (any team), so
    reserving or moving a pool does not change the DaemonSets."""
    wanted = [(GPU_TAINT_KEY, "NoSchedule"), (TEAM_TAINT_KEY, "NoSchedule")]
    for pool in gpu_pools(cluster):
        for taint in cluster.node_taints(pool):
            if (taint.key, taint.effect) not in wanted:
                wanted.append((taint.key, taint.effect))
    return [toleration(key, effect) for key, effect in wanted]


# --- Teams ---------------------------------------------------------------


def team_toleration(team_name: str) -> dict[str, str]:
    return toleration(TEAM_TAINT_KEY, "NoSchedule", value=team_name)


def tolerations_whitelist(cluster: Cluster, team: Team) -> list[dict[str, str]]:
    """The tolerations pods of `team`'s namespaces may carry (PodTolerationRestriction).

    Node conditions, the GPU taint, every non-team taint a pool declares (a
    team may use shared spot or preemptible pools), and its own team's taint:
    never another team's, and no wildcard.
    """
    allowed = [toleration(key, effect) for key, effect in NODE_CONDITION_TAINTS]
    allowed.append(toleration(GPU_TAINT_KEY))
    seen = set()
    for pool in cluster.node_pools:
        for taint in pool.taints:
            if taint.key != TEAM_TAINT_KEY and (taint.key, taint.effect) not in seen:
                seen.add((taint.key, taint.effect))
                allowed.append(toleration(taint.key, taint.effect))
    allowed.append(team_toleration(team.name))
    return allowed


def _compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def namespace_annotations(cluster: Cluster, team: Team) -> dict[str, str]:
    """PodTolerationRestriction annotations of one of `team`'s namespaces.

    The default toleration is granted only while the team reserves pools: a
    toleration of a taint no node carries would only confuse readers of pod
    specs. The whitelist is always set, so a team namespace can never
    tolerate another team's machines, with or without the admission policy.
    """
    annotations = {TOLERATIONS_WHITELIST_ANNOTATION: _compact_json(tolerations_whitelist(cluster, team))}
    if team.reserved_pools:
        annotations[DEFAULT_TOLERATIONS_ANNOTATION] = _compact_json([team_toleration(team.name)])
        # For people: `kubectl get ns <ns> -o yaml` says which machines are theirs
        # (nodes carry corral.dev/team=<team> for a nodeSelector).
        annotations[RESERVED_POOLS_ANNOTATION] = ",".join(team.reserved_pools)
    return annotations


def team_namespaces(cluster: Cluster) -> list[dict]:
    """Each team with its namespaces and their annotations, for the template."""
    teams = []
    for team in cluster.scheduling.teams:
        for namespace in team.namespaces:
            if namespace in SYSTEM_NAMESPACES or namespace.startswith("kube-"):
                raise ManifestError(
                    f"team '{team.name}' lists namespace '{namespace}', a system namespace "
                    "corral's add-ons use: pick a namespace of the team's own"
                )
        teams.append({
            "name": team.name,
            "namespaces": [
                {"name": ns, "annotations": namespace_annotations(cluster, team)} for ns in team.namespaces
            ],
        })
    return teams


# The admission policy that makes "other namespaces cannot tolerate it" true.
# PodTolerationRestriction only checks whitelists, which can allow but never
# forbid one key: a namespace without a whitelist may tolerate anything. This
# CEL rule forbids, everywhere but the system namespaces, any toleration that
# would tolerate a team taint unless it is exactly `corral.dev/team=<the
# namespace's team>:NoSchedule`. "Would tolerate" includes the wildcard
# (no key, operator Exists) with no effect or NoSchedule.
TEAM_POLICY_EXPRESSION = (
    "!has(object.spec.tolerations) || object.spec.tolerations.all(t, "
    "!((!has(t.key) || t.key == '' || t.key == '{key}') "
    "&& (!has(t.effect) || t.effect == '' || t.effect == 'NoSchedule')) "
    "|| (has(t.key) && t.key == '{key}' && (!has(t.operator) || t.operator == 'Equal') "
    "&& has(t.value) && variables.namespaceTeam != '' && t.value == variables.namespaceTeam))"
).format(key=TEAM_TAINT_KEY)

TEAM_POLICY_MESSAGE = (
    "'namespace ' + request.namespace + ' may not tolerate ' + "
    "(variables.namespaceTeam == '' ? 'any team taint ({key}) or all NoSchedule taints' : "
    "'a taint of another team: only {key}=' + variables.namespaceTeam + ':NoSchedule')"
).format(key=TEAM_TAINT_KEY)


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def team_policy(cluster: Cluster) -> dict | None:
    """The ValidatingAdmissionPolicy's variable parts; None without teams."""
    if not cluster.scheduling.teams:
        return None
    pairs = [
        f"{_cel_string(ns)}: {_cel_string(team.name)}"
        for team in cluster.scheduling.teams
        for ns in team.namespaces
    ]
    return {
        "exempt_namespaces": list(SYSTEM_NAMESPACES),
        "team_of_namespace": "{" + ", ".join(pairs) + "}",
        "expression": TEAM_POLICY_EXPRESSION,
        "message_expression": TEAM_POLICY_MESSAGE,
    }


# --- cluster-autoscaler -----------------------------------------------------

# At most this fraction of the cluster's cloud capacity is removed in one
# scale-down round, so a mistaken "everything is idle" (metrics gap, a
# scheduling bug) cannot drain the fleet at once.
SCALE_DOWN_FRACTION = 0.10
# A node is a scale-down candidate below this share of requested CPU/memory
# (the upstream default, written out so reviewers see it).
SCALE_DOWN_UTILIZATION = 0.5


@dataclass(frozen=True)
class NodeGroup:
    """One group the autoscaler sizes: a pool's ASG/VMSS, or one zonal MIG of it."""

    pool: str
    name: str
    min_size: int
    max_size: int
    zone: str | None = None


def gcp_zonal_group_name(cluster: Cluster, pool: CloudPool, zone: str) -> str:
    """A GCP pool's MIG in one zone (cluster-autoscaler only drives zonal MIGs):
    `node_group_name` plus the zone's letter, as corral/infra/gcp/nodepools.py
    names them (`ibis-gpu-a100-a`); tests/manifests checks the two agree."""
    return f"{node_group_name(cluster, pool)}-{zone.rsplit('-', 1)[-1]}"


def _split(total: int, parts: int) -> list[int]:
    """`total` in `parts` near-equal shares, larger ones first; they sum to `total`."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def autoscaler_node_groups(cluster: Cluster) -> list[NodeGroup]:
    """Exactly the groups of the cluster's cloud pools, with their bounds.

    AWS and Azure: one group per pool (`node_group_name`). GCP: one zonal MIG
    per pool and zone, the pool's min/max split across its zones (they add up
    to the pool's), because cluster-autoscaler's GCE provider accepts only
    zonal MIG URLs.
    """
    groups = []
    for pool in cluster.cloud_pools:
        if pool.provider == "gcp":
            zones = pool.zones or cluster.control_plane.zones
            for zone, low, high in zip(zones, _split(pool.min_size, len(zones)), _split(pool.max_size, len(zones))):
                groups.append(NodeGroup(pool.name, gcp_zonal_group_name(cluster, pool, zone), low, high, zone))
        else:
            groups.append(NodeGroup(pool.name, node_group_name(cluster, pool), pool.min_size, pool.max_size))
    return groups


def scale_down_parallelism(cluster: Cluster) -> int:
    """Most nodes removed at once: SCALE_DOWN_FRACTION of the cloud pools' capacity."""
    capacity = sum(p.max_size for p in cluster.cloud_pools)
    return max(1, math.ceil(capacity * SCALE_DOWN_FRACTION))


def gpu_scale_down_threshold(cluster: Cluster) -> float:
    """GPU nodes are removed only when no GPU on them is requested.

    cluster-autoscaler judges GPU nodes by GPU requests alone; the default
    0.5 would evict a training job holding 3 of 8 GPUs to consolidate. Half a
    GPU on the largest GPU machine is below any running GPU pod's share.
    """
    counts = [p.gpu.count for p in cluster.cloud_pools if p.gpu]
    return round(0.5 / max(counts), 4) if counts else SCALE_DOWN_UTILIZATION


def _number(value: float) -> str:
    return f"{value:g}"


# AWS ASG auto-discovery: the tags corral's AWS node pools carry
# (corral/infra/aws/nodepools.py autoscaler_tags).
def aws_discovery_tags(cluster: Cluster) -> list[str]:
    return ["k8s.io/cluster-autoscaler/enabled", f"k8s.io/cluster-autoscaler/{cluster.name}"]


GCP_MIG_URL = "https://www.googleapis.com/compute/v1/projects/$(GCP_PROJECT)/zones/{zone}/instanceGroups/{name}"
# Values only the Pulumi program knows (subscription, resource group,
# project): a ConfigMap that `corral.infra.addons.Addons` creates next to the
# manifests. The keys each cloud needs:
CLOUD_SETTINGS_CONFIGMAP = "cluster-autoscaler-cloud"
CLOUD_SETTINGS_KEYS = {
    "aws": (),
    "azure": ("ARM_SUBSCRIPTION_ID", "ARM_RESOURCE_GROUP"),
    "gcp": ("GCP_PROJECT",),
}


def autoscaler_args(cluster: Cluster) -> list[str]:
    cloud = cluster.control_plane.cloud
    parallelism = scale_down_parallelism(cluster)
    args = [f"--cloud-provider={'gce' if cloud == 'gcp' else cloud}"]
    if cloud == "aws":
        # ASGs tagged by corral's AWS node pools; min/max are the ASGs' own.
        args.append(f"--node-group-auto-discovery=asg:tag={','.join(aws_discovery_tags(cluster))}")
    else:
        # Explicit groups: the manifest says which groups and bounds, no tag
        # can add a stray group, and a reviewer sees a pool's max change here.
        for group in autoscaler_node_groups(cluster):
            target = GCP_MIG_URL.format(zone=group.zone, name=group.name) if cloud == "gcp" else group.name
            args.append(f"--nodes={group.min_size}:{group.max_size}:{target}")
    if cloud == "gcp":
        # Keep a pool's zonal MIGs the same size, as one pool.
        args.append("--balance-similar-node-groups=true")
    args += [
        # least-waste: the group that leaves the least idle CPU/memory after
        # the pending pods land: the cheapest fit for a bin-packed cluster, and
        # it works on every cloud (`price` is GCE-only and knows list prices).
        "--expander=least-waste",
        "--scale-down-enabled=true",
        f"--scale-down-utilization-threshold={_number(SCALE_DOWN_UTILIZATION)}",
        f"--scale-down-gpu-utilization-threshold={_number(gpu_scale_down_threshold(cluster))}",
        "--scale-down-unneeded-time=10m",
        "--scale-down-delay-after-add=10m",
        # The guard: at most `parallelism` nodes (10% of the cloud capacity)
        # leave in one round, empty or drained.
        f"--max-scale-down-parallelism={parallelism}",
        f"--max-empty-bulk-delete={parallelism}",
        "--max-node-provision-time=20m",
        "--skip-nodes-with-local-storage=false",
        "--skip-nodes-with-system-pods=true",
        "--stderrthreshold=info",
        "--v=2",
    ]
    return args


def autoscaler_env(cluster: Cluster) -> list[dict]:
    cloud = cluster.control_plane.cloud
    if cloud == "aws":
        return [{"name": "AWS_REGION", "value": cluster.control_plane.region}]
    env = [
        {"name": key, "valueFrom": {"configMapKeyRef": {"name": CLOUD_SETTINGS_CONFIGMAP, "key": key}}}
        for key in CLOUD_SETTINGS_KEYS[cloud]
    ]
    if cloud == "azure":
        # The scale sets are driven with the identity of the VM the autoscaler
        # runs on (managed identity): no secret in the cluster.
        env += [
            {"name": "ARM_USE_MANAGED_IDENTITY_EXTENSION", "value": "true"},
            {"name": "ARM_VM_TYPE", "value": "vmss"},
        ]
    return env


CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


def autoscaler_affinity() -> dict:
    """cluster-autoscaler runs on the API servers, never elsewhere: they hold
    the cloud identity it scales the pools with (an Azure managed identity,
    an AWS instance profile, a GCP service account; corral/infra/<cloud>/
    apiservers.py), so no cloud credential is stored in the cluster."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists"}]}
                ]
            }
        }
    }


def autoscaler_host_network(cluster: Cluster) -> bool:
    """AWS only: instance credentials come from IMDSv2, whose hop limit of 1
    (corral/infra/aws/common.py metadata_options) keeps pod networks out; a
    host-network pod is on the instance's own interface."""
    return cluster.control_plane.cloud == "aws"


def off_gpu_affinity() -> dict:
    """Control-plane services stay off GPU machines (they would pin them awake)."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": GPU_PRESENT_LABEL, "operator": "DoesNotExist"}]}
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists"}]
                    },
                }
            ],
        }
    }

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

from corral.health.repair_protocol import REPAIR_NAMESPACE
from corral.model.layout import layout, node_group_name
from corral.model.namespaces import (
    FLANNEL_NAMESPACE,
    KUBERNETES_NAMESPACES,
    MONITORING_NAMESPACE,
    reserved_namespace,
)
from corral.model.schema import (
    LABEL_DOMAIN,
    PODS_PER_NODE,
    PREFLIGHT_TAINT_KEY,
    TEAM_TAINT_KEY,
    UNHEALTHY_TAINT_KEY,
    CloudPool,
    Cluster,
    OnPremPool,
    Taint,
    Team,
)

# Namespaces whose pods are node agents that must run on every node, reserved
# ones included. Only cluster admins create pods there; the team policy
# exempts them.
SYSTEM_NAMESPACES = ("kube-system", FLANNEL_NAMESPACE, MONITORING_NAMESPACE)

GPU_TAINT_KEY = "nvidia.com/gpu"
# The label every GPU pool's nodes register with (Cluster.node_labels).
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
# Every pool's nodes name their pool (Cluster.node_labels).
POOL_LABEL = f"{LABEL_DOMAIN}/pool"
# What a node's own kubelet says of it (its --node-labels, corral.dev/team and
# corral.dev/pool among them) it can change at any time: NodeRestriction only
# keeps kubelets off `node-restriction.kubernetes.io/` labels (and most
# kubernetes.io/k8s.io ones) (kubernetes/website, admission-controllers.md,
# NodeRestriction). So placement by team or pool keys on labels under that
# prefix, which only corral-node-approver (corral/certs/node_approver.py) and
# admins set, from the cluster file: a compromised shared node cannot label
# itself into a team's pool and attract the team's pods.
NODE_RESTRICTION_PREFIX = "node-restriction.kubernetes.io"
TEAM_NODE_LABEL = f"{NODE_RESTRICTION_PREFIX}/corral-team"
POOL_NODE_LABEL = f"{NODE_RESTRICTION_PREFIX}/corral-pool"
# The kubelet-set labels pods may not select nodes by (placement policy, rule 5).
KUBELET_SET_PLACEMENT_LABELS = (TEAM_TAINT_KEY, POOL_LABEL)

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
    # The GPU health agent's taint, any effect: its NoExecute form must not
    # evict the device plugin or dcgm-exporter from the very node whose GPUs
    # need watching (docs/gpu-health.md).
    return [toleration(key, effect) for key, effect in wanted] + [toleration(UNHEALTHY_TAINT_KEY)]


# --- Which containers see GPUs (docs/addons.md, "Which pods see GPUs") -------
#
# The NVIDIA runtime is containerd's default on GPU nodes, and the NVIDIA
# container toolkit gives a container the GPUs it is asked for. It can be asked
# three ways (github.com/NVIDIA/nvidia-container-toolkit,
# internal/config/image/cuda_image.go, CUDA.VisibleDevices): CDI annotations;
# mounts of the host's /dev/null under /var/run/nvidia-container-devices/
# (`<id>` or `all`), when accept-nvidia-visible-devices-as-volume-mounts is
# on; and $NVIDIA_VISIBLE_DEVICES, which every CUDA image sets to `all`,
# honoured for an unprivileged container only while
# accept-nvidia-visible-devices-envvar-when-unprivileged is on. "Privileged"
# there means CAP_SYS_ADMIN in the bounding set (internal/config/image/privileged.go).
#
# So the nodes refuse the variable from unprivileged containers
# (NODE_RUNTIME_SETTINGS, written into /etc/nvidia-container-runtime/config.toml
# by the node side), the device plugin hands out GPUs as /dev/null mounts
# (DEVICE_LIST_STRATEGY), and team namespaces enforce Pod Security `baseline`,
# which refuses privileged containers, added SYS_ADMIN and hostPath volumes:
# a team's container cannot ask by variable or by mount, and gets only the
# GPUs its pod was allocated. The GPU monitors in the system namespaces
# (device plugin, dcgm-exporter, health agent) ask for every GPU by mount
# (all_gpus_volume/all_gpus_mount), which those namespaces' `privileged`
# level allows and which needs no capability.
NODE_RUNTIME_SETTINGS = {
    "accept-nvidia-visible-devices-envvar-when-unprivileged": False,
    "accept-nvidia-visible-devices-as-volume-mounts": True,
}
# k8s-device-plugin's $DEVICE_LIST_STRATEGY (README, "Configuration Option Details").
DEVICE_LIST_STRATEGY = "volume-mounts"
DEVICE_LIST_MOUNT_ROOT = "/var/run/nvidia-container-devices"
ALL_GPUS_VOLUME = "nvidia-all-gpus"


def all_gpus_volume() -> dict:
    """The pod volume behind a request for every GPU: the host's /dev/null."""
    return {"name": ALL_GPUS_VOLUME, "hostPath": {"path": "/dev/null", "type": "CharDevice"}}


def all_gpus_mount() -> dict:
    """The container's request for every GPU, read by the NVIDIA toolkit."""
    return {"name": ALL_GPUS_VOLUME, "mountPath": f"{DEVICE_LIST_MOUNT_ROOT}/all", "readOnly": True}


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
        # (nodes carry TEAM_NODE_LABEL=<team> for a nodeSelector, set by
        # corral-node-approver; never the kubelet-set corral.dev/team).
        annotations[RESERVED_POOLS_ANNOTATION] = ",".join(team.reserved_pools)
    return annotations


def team_namespaces(cluster: Cluster) -> list[dict]:
    """Each team with its namespaces and their annotations, for the template."""
    teams = []
    for team in cluster.scheduling.teams:
        for namespace in team.namespaces:
            # Every add-on's namespace, not only the exempt ones (corral/model/namespaces.py): the
            # cluster file's rule says the same with file and line; this holds for clusters built
            # without the loader.
            why = reserved_namespace(namespace)
            if why:
                raise ManifestError(
                    f"team '{team.name}' lists namespace '{namespace}', {why}: "
                    "pick a namespace of the team's own"
                )
        teams.append({
            "name": team.name,
            "namespaces": [
                {
                    "name": ns,
                    "annotations": namespace_annotations(cluster, team),
                    "pod_security": pod_security_labels(cluster, TEAM_POD_SECURITY),
                }
                for ns in team.namespaces
            ],
        })
    return teams


# --- Pod Security Admission -------------------------------------------------

PSA_PREFIX = "pod-security.kubernetes.io"
# KUBERNETES_NAMESPACES (corral/model/namespaces.py): the namespaces every cluster has from the
# start. corral does not create them; it patches their labels (server-side apply of the labels
# only, see `Addon.patches`), and never deletes them.
# Nothing of ours runs in these; a careless `kubectl run` lands in `default`.
RESTRICTED_NAMESPACES = ("default", "kube-public", "kube-node-lease")
# Node agents that need the host (kube-proxy and the static control-plane
# pods, the NVIDIA device plugin's hostPath; flannel's own namespace says so
# in flannel's manifest; node-exporter and dcgm-exporter in monitoring).
PRIVILEGED_NAMESPACES = ("kube-system", FLANNEL_NAMESPACE, MONITORING_NAMESPACE)
# Team namespaces: `baseline` is enforced, `restricted` audited and warned
# about. baseline forbids everything that reaches the node (privileged, host
# namespaces, hostPath, hostPort, added capabilities beyond the default set,
# unmasked /proc, unsafe sysctls); restricted also insists on non-root and on
# dropping every capability, which the GPU training images teams run (NGC
# images run as root) do not meet. docs/addons.md has the argument.
TEAM_POD_SECURITY = "baseline"
# The add-on namespace whose pods act with the API servers' cloud identity when the cluster has
# cloud GPU pools: the repair controller replaces their instances, and only a pod on an API
# server's host network is the instance's own process at its metadata service
# (autoscaler_host_network, corral/manifests/api_server_host.py). It then joins the namespaces the
# placement policy exempts (its pods tolerate the control-plane taint) and those enforcing
# `privileged` (hostNetwork is a host namespace, which baseline forbids). On-prem-only clusters
# replace nothing from the cluster: it stays `restricted`, off the API servers.
API_SERVER_ADDON_NAMESPACES = (REPAIR_NAMESPACE,)


def repair_on_api_servers(cluster: Cluster) -> bool:
    """The repair controller runs (`health.autoRepair.enabled`), some GPU pool is a cloud's (the
    control plane's cloud: schema.ControlPlane.cloud), and the cluster file lets it replace their
    instances (`health.remediation.cloud: replace`), which it does with the API servers' identity.
    With `cloud: none` it replaces nothing (a cloud node's ladder ends at rma after a failed reboot,
    as an on-prem node's), so it needs no cloud identity and stays off the API servers, restricted."""
    gpu = gpu_pools(cluster)
    return (cluster.health.auto_repair.enabled and cluster.health.remediation.cloud == "replace"
            and any(pool.provider != "onprem" for pool in gpu))


def system_namespaces(cluster: Cluster) -> tuple[str, ...]:
    """SYSTEM_NAMESPACES, and the API-server add-on namespaces where the cluster runs them there."""
    return SYSTEM_NAMESPACES + (API_SERVER_ADDON_NAMESPACES if repair_on_api_servers(cluster) else ())


def privileged_namespaces(cluster: Cluster) -> tuple[str, ...]:
    """PRIVILEGED_NAMESPACES, and the API-server add-on namespaces where the cluster runs them there."""
    return PRIVILEGED_NAMESPACES + (API_SERVER_ADDON_NAMESPACES if repair_on_api_servers(cluster) else ())


def pod_security_labels(cluster: Cluster, enforce: str) -> dict[str, str]:
    """The Pod Security Admission labels of a namespace enforcing `enforce`.

    Versions are pinned to the cluster's minor, so a Kubernetes upgrade does
    not silently change what a level means. audit and warn are one level
    stricter than enforce where that is useful: `restricted` over `baseline`
    (users see what keeps them from `restricted`), `baseline` over
    `privileged` in the audit log only (the node agents there need more, and
    a warning on every rollout would be noise). A privileged namespace says
    `warn: privileged` out loud: a namespace without a `warn` label takes the
    cluster's default (`restricted`, admission-configuration.yaml.j2), as the
    real API server showed on every apply of flannel and the node exporters.
    """
    version = f"v{cluster.kubernetes.minor}"
    audit = {"restricted": "restricted", "baseline": "restricted", "privileged": "baseline"}[enforce]
    labels = {
        f"{PSA_PREFIX}/enforce": enforce,
        f"{PSA_PREFIX}/enforce-version": version,
        f"{PSA_PREFIX}/audit": audit,
        f"{PSA_PREFIX}/audit-version": version,
    }
    labels[f"{PSA_PREFIX}/warn"] = audit if enforce != "privileged" else "privileged"
    labels[f"{PSA_PREFIX}/warn-version"] = version
    return labels


def kubernetes_namespaces(cluster: Cluster) -> list[dict]:
    """The namespaces Kubernetes creates, with the Pod Security labels corral sets on them."""
    return [
        {"name": ns, "labels": pod_security_labels(cluster, "restricted" if ns in RESTRICTED_NAMESPACES else "privileged")}
        for ns in KUBERNETES_NAMESPACES
    ]


# --- The pod placement policy (ValidatingAdmissionPolicy) -------------------
#
# What taints and the scheduler cannot enforce on their own, checked at
# admission for every pod outside the node-agent namespaces
# (SYSTEM_NAMESPACES, exempt through the binding's namespace selector):
#
# 1. No `spec.nodeName` on CREATE. A pod created with nodeName skips the
#    scheduler, and the kubelet checks only NoExecute taints at admission,
#    so nodeName walks past every NoSchedule taint: a team's reserved GPU
#    node, an API server. The scheduler binds pods through the `binding`
#    subresource, which this policy does not match, and the DaemonSet
#    controller creates pods without nodeName (node affinity on the node's
#    name, bound by the scheduler), so nothing legitimate outside the
#    exempt namespaces sets it. On UPDATE nodeName is immutable.
# 2. No wildcard toleration (no key, operator Exists) of NoSchedule taints:
#    it tolerates every taint, the control plane's and every team's.
# 3. No toleration of the control-plane taint: only kube-system and the
#    add-on namespaces run on the API servers.
# 4. Team taints: only `corral.dev/team=<the namespace's team>:NoSchedule`,
#    and only in that team's namespaces. PodTolerationRestriction whitelists
#    can allow but never forbid a key, and a namespace without a whitelist
#    may tolerate anything; this rule forbids.
# 5. No node selection (nodeSelector, required or preferred node affinity) by
#    the kubelet-set `corral.dev/team` or `corral.dev/pool`: a node's own
#    kubelet can put them on itself. The message names TEAM_NODE_LABEL and
#    POOL_NODE_LABEL, which only corral-node-approver sets.

CONTROL_PLANE_TAINT_KEY = "node-role.kubernetes.io/control-plane"
PLACEMENT_POLICY_NAME = "corral-pod-placement"

_NO_SCHEDULE_EFFECT = "(!has(t.effect) || t.effect == '' || t.effect == 'NoSchedule')"
_NO_KEY = "(!has(t.key) || t.key == '')"


def _all_tolerations(condition: str) -> str:
    return f"!has(object.spec.tolerations) || object.spec.tolerations.all(t, {condition})"


NODE_NAME_EXPRESSION = (
    "request.operation != 'CREATE' || !has(object.spec.nodeName) || object.spec.nodeName == ''"
)
NODE_NAME_MESSAGE = (
    "'pods in namespace ' + request.namespace + ' may not set spec.nodeName (' + object.spec.nodeName + '): "
    "it skips the scheduler and every NoSchedule taint; select nodes with a nodeSelector or node affinity'"
)

WILDCARD_EXPRESSION = _all_tolerations(f"!({_NO_KEY} && {_NO_SCHEDULE_EFFECT})")
WILDCARD_MESSAGE = (
    "'namespace ' + request.namespace + ' may not tolerate every taint: a toleration without a key "
    "(operator Exists) tolerates the control plane and every team; name the taint it is for'"
)

CONTROL_PLANE_EXPRESSION = _all_tolerations(f"!has(t.key) || t.key != '{CONTROL_PLANE_TAINT_KEY}'")
CONTROL_PLANE_MESSAGE = (
    f"'namespace ' + request.namespace + ' may not tolerate {CONTROL_PLANE_TAINT_KEY}: "
    "only kube-system and the add-on namespaces run on the API servers'"
)

# "Would tolerate a team taint" includes the wildcard; the only toleration of
# the team key allowed is exactly `corral.dev/team=<namespace's team>:NoSchedule`.
TEAM_POLICY_EXPRESSION = _all_tolerations(
    f"!(({_NO_KEY} || t.key == '{TEAM_TAINT_KEY}') && {_NO_SCHEDULE_EFFECT}) "
    f"|| (has(t.key) && t.key == '{TEAM_TAINT_KEY}' && (!has(t.operator) || t.operator == 'Equal') "
    "&& has(t.value) && variables.namespaceTeam != '' && t.value == variables.namespaceTeam)"
)

TEAM_POLICY_MESSAGE = (
    "'namespace ' + request.namespace + ' may not tolerate ' + "
    "(variables.namespaceTeam == '' ? 'any team taint ({key}) or all NoSchedule taints' : "
    "'a taint of another team: only {key}=' + variables.namespaceTeam + ':NoSchedule')"
).format(key=TEAM_TAINT_KEY)


_KUBELET_SET_KEYS = "[" + ", ".join(f"'{key}'" for key in KUBELET_SET_PLACEMENT_LABELS) + "]"
_NODE_AFFINITY = "object.spec.affinity.nodeAffinity"
_REQUIRED_TERMS = f"{_NODE_AFFINITY}.requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED_TERMS = f"{_NODE_AFFINITY}.preferredDuringSchedulingIgnoredDuringExecution"
_NO_KUBELET_SET_KEY = f"!has(term.matchExpressions) || term.matchExpressions.all(e, !(e.key in {_KUBELET_SET_KEYS}))"
NODE_LABEL_EXPRESSION = (
    f"(!has(object.spec.nodeSelector) || !object.spec.nodeSelector.exists(k, k in {_KUBELET_SET_KEYS})) && "
    f"(!has(object.spec.affinity) || !has(object.spec.affinity.nodeAffinity) || ("
    f"(!has({_REQUIRED_TERMS}) || {_REQUIRED_TERMS}.nodeSelectorTerms.all(term, {_NO_KUBELET_SET_KEY})) && "
    f"(!has({_PREFERRED_TERMS}) || {_PREFERRED_TERMS}.all(p, "
    f"{_NO_KUBELET_SET_KEY.replace('term.', 'p.preference.')}))))"
)
NODE_LABEL_MESSAGE = (
    f"'pods in namespace ' + request.namespace + ' may not select nodes by {TEAM_TAINT_KEY} or {POOL_LABEL}: "
    f"the kubelet of a node can set those on it; select {TEAM_NODE_LABEL} or {POOL_NODE_LABEL}, which only "
    "corral-node-approver sets'"
)


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def placement_policy(cluster: Cluster) -> dict:
    """The ValidatingAdmissionPolicy's variable parts (every cluster has one)."""
    pairs = [
        f"{_cel_string(ns)}: {_cel_string(team.name)}"
        for team in cluster.scheduling.teams
        for ns in team.namespaces
    ]
    if pairs:
        # Compiled from the cluster file, not read from namespace labels someone could edit.
        variables = [
            {"name": "teamOfNamespace", "expression": "{" + ", ".join(pairs) + "}"},
            {"name": "namespaceTeam", "expression": (
                "request.namespace in variables.teamOfNamespace ? variables.teamOfNamespace[request.namespace] : ''")},
        ]
    else:
        variables = [{"name": "namespaceTeam", "expression": "''"}]  # no team: no team taint is anyone's
    return {
        "name": PLACEMENT_POLICY_NAME,
        "exempt_namespaces": list(system_namespaces(cluster)),
        "variables": variables,
        "validations": [
            {"expression": NODE_NAME_EXPRESSION, "messageExpression": NODE_NAME_MESSAGE, "reason": "Forbidden"},
            {"expression": WILDCARD_EXPRESSION, "messageExpression": WILDCARD_MESSAGE, "reason": "Forbidden"},
            {"expression": CONTROL_PLANE_EXPRESSION, "messageExpression": CONTROL_PLANE_MESSAGE, "reason": "Forbidden"},
            {"expression": TEAM_POLICY_EXPRESSION, "messageExpression": TEAM_POLICY_MESSAGE, "reason": "Forbidden"},
            {"expression": NODE_LABEL_EXPRESSION, "messageExpression": NODE_LABEL_MESSAGE, "reason": "Forbidden"},
        ],
    }


# --- RDMA for pods (docs/addons.md, "RDMA for pods") ------------------------
#
# RoCE pools' HCAs reach pods through Mellanox's shared RDMA device plugin
# (github.com/Mellanox/k8s-rdma-shared-dev-plugin, v1.5.3): it advertises an
# extended resource per `configList` entry (`rdma/<resourceName>`, prefix
# `rdma` by default, pkg/resources/resources_manager.go) and hands a container
# that requests one the HCAs' /dev/infiniband devices (uverbs, rdma_cm, umad);
# the HCAs are shared, `rdmaHcaMax` containers per node. A pool's
# `roce.rdmaResource` names its resource (default rdma/roce).
#
# One DaemonSet per resource, on the nodes of the pools behind it (node
# affinity on corral.dev/pool), each with a config of its own resource only:
# the plugin applies every configList entry on every node it runs on, so one
# config with several resources would advertise on a node every resource whose
# interface names the node happens to have.
#
# The traffic class: NCCL sets the RoCE traffic class of its verbs QPs from
# $NCCL_IB_TC (default 0: DSCP 0, not the pools' lossless class; NVIDIA/nccl
# src/transport/net_ib/connect.cc, NCCL_IB_TC_DEFAULT). Upstream kernels have
# no host-wide default for verbs QPs (configfs default_roce_tos covers RDMA-CM
# QPs only; the mlx5 tc/1/traffic_class sysfs knob is MLNX_OFED's), so the
# value has to come with the pod. A ValidatingAdmissionPolicy refuses every
# pod outside the node-agent namespaces with a container that requests an
# RDMA resource without NCCL_IB_TC set to that resource's traffic class
# (Roce.traffic_class: DSCP << 2, plus ECT(0) with ECN), and its message says
# the value to set.

RDMA_DEVICE_PLUGIN = "rdma-shared-dp"
RDMA_CONFIGMAP = "rdma-shared-dp-config"
RDMA_NAMESPACE = "kube-system"
RDMA_RESOURCE_PREFIX = "rdma"
# HCA shares per node and resource: the kubelet's default maxPods (110,
# KubeletConfiguration), so the resource never limits how many pods fit.
RDMA_HCA_MAX = PODS_PER_NODE
# Seconds between the plugin's rescans of the host's devices; 60 is its
# default when unset (README, "periodicUpdateInterval"), written out.
RDMA_PERIODIC_UPDATE_SECONDS = 60
RDMA_TRAFFIC_CLASS_POLICY = "corral-rdma-traffic-class"
NCCL_TRAFFIC_CLASS_ENV = "NCCL_IB_TC"


@dataclass(frozen=True)
class RdmaResource:
    """One extended resource of the shared RDMA device plugin and the pools behind it."""

    name: str                  # rdma/roce
    pools: tuple[str, ...]
    interfaces: tuple[str, ...]  # the pools' RoCE interfaces, the plugin's ifNames selector
    dscp: int
    ecn: bool
    traffic_class: int         # what NCCL_IB_TC must be

    @property
    def resource_name(self) -> str:
        """The plugin's `resourceName` (after the prefix)."""
        return self.name.split("/", 1)[1]

    @property
    def daemonset(self) -> str:
        return f"{RDMA_DEVICE_PLUGIN}-{self.resource_name.replace('_', '-')}"

    @property
    def config_key(self) -> str:
        return f"{self.resource_name}.json"


def rdma_resources(cluster: Cluster) -> list[RdmaResource]:
    """The cluster's RDMA resources, in the order their first pool appears."""
    grouped: dict[str, list[OnPremPool]] = {}
    for pool in cluster.onprem_pools:
        if pool.roce is not None:
            grouped.setdefault(pool.roce.rdma_resource, []).append(pool)
    resources = []
    for name, pools in grouped.items():
        classes = {(p.roce.dscp, p.roce.ecn) for p in pools}
        if len(classes) > 1:  # rules.py refuses this in the cluster file
            raise ManifestError(f"the pools behind {name} ({', '.join(p.name for p in pools)}) differ in DSCP or ECN")
        interfaces: list[str] = []
        for pool in pools:
            interfaces += [i for i in pool.roce.interfaces if i not in interfaces]
        roce = pools[0].roce
        resources.append(RdmaResource(name, tuple(p.name for p in pools), tuple(interfaces),
                                      roce.dscp, roce.ecn, roce.traffic_class))
    return resources


def rdma_plugin_config(resource: RdmaResource) -> dict:
    """The plugin's config.json for one resource (README, "RDMA Shared Device Plugin Configurations")."""
    return {
        "periodicUpdateInterval": RDMA_PERIODIC_UPDATE_SECONDS,
        "configList": [{
            "resourceName": resource.resource_name,
            "resourcePrefix": RDMA_RESOURCE_PREFIX,
            "rdmaHcaMax": RDMA_HCA_MAX,
            "selectors": {"ifNames": list(resource.interfaces)},
        }],
    }


def pool_affinity(pools: tuple[str, ...] | list[str]) -> dict:
    """Required node affinity: the nodes of these pools (corral.dev/pool, Cluster.node_labels)."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": list(pools)}]}]}}}


def pool_tolerations(cluster: Cluster, pools: tuple[str, ...] | list[str]) -> list[dict[str, str]]:
    """What a node agent of these pools tolerates: every taint their nodes carry, by
    key and effect (a team's reservation by key, so moving it changes nothing), and
    the health agent's taint in any effect (as the GPU agents, docs/gpu-health.md)."""
    wanted = [(TEAM_TAINT_KEY, "NoSchedule")]
    for name in pools:
        pool = cluster.pool(name)
        for taint in cluster.node_taints(pool):
            if (taint.key, taint.effect) not in wanted and taint.key != UNHEALTHY_TAINT_KEY:
                wanted.append((taint.key, taint.effect))
    return [toleration(key, effect) for key, effect in wanted] + [toleration(UNHEALTHY_TAINT_KEY)]


def _requests_resource(resource: str) -> str:
    """CEL: container `c` requests `resource` (in limits, or requests, which must equal them)."""
    r = _cel_string(resource)
    return (f"has(c.resources) && ((has(c.resources.limits) && {r} in c.resources.limits) || "
            f"(has(c.resources.requests) && {r} in c.resources.requests))")


def _sets_traffic_class(value: str) -> str:
    """CEL: container `c` sets NCCL_IB_TC to `value` as a literal, in every entry of that name
    (the last one wins in the kubelet; env wins over envFrom, core/v1 Container.envFrom)."""
    name, v = _cel_string(NCCL_TRAFFIC_CLASS_ENV), _cel_string(value)
    return (f"has(c.env) && c.env.exists(e, e.name == {name}) && "
            f"c.env.all(e, e.name != {name} || (has(e.value) && e.value == {v}))")


def rdma_traffic_class_policy(cluster: Cluster) -> dict:
    """The ValidatingAdmissionPolicy's variable parts: per RDMA resource, a variable
    listing the containers that request it without its traffic class, and a
    validation that the list is empty, whose message names the first of them."""
    variables = [{"name": "containers", "expression": (
        "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])")}]
    validations = []
    for resource in rdma_resources(cluster):
        missing = f"withoutTrafficClass_{resource.resource_name}"
        variables.append({"name": missing, "expression": (
            f"variables.containers.filter(c, ({_requests_resource(resource.name)}) "
            f"&& !({_sets_traffic_class(str(resource.traffic_class))}))")})
        ecn = " with ECN" if resource.ecn else ""
        message = f"'container ' + variables.{missing}[0].name + " + _cel_string(
            f" requests {resource.name}: set env {NCCL_TRAFFIC_CLASS_ENV}={resource.traffic_class} in it "
            f"(a value, not valueFrom), the RoCE traffic class of the lossless class the pools behind "
            f"{resource.name} carry (DSCP {resource.dscp}{ecn}); NCCL's default, 0, is not lossless "
            "(docs/addons.md, RDMA for pods)"
        )
        validations.append({"expression": f"size(variables.{missing}) == 0", "messageExpression": message,
                            "reason": "Forbidden"})
    return {
        "name": RDMA_TRAFFIC_CLASS_POLICY,
        "exempt_namespaces": list(SYSTEM_NAMESPACES),
        "variables": variables,
        "validations": validations,
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


def azure_zonal_group_name(cluster: Cluster, pool: CloudPool, zone: str) -> str:
    """An Azure pool's scale set in one zone (each zone's node subnet and NAT
    gateway take their own scale set): `node_group_name` plus the zone
    (`jaguar-cpu-d64-2`), as corral/infra/azure/nodepools.py names them."""
    return f"{node_group_name(cluster, pool)}-{zone}"


def _split(total: int, parts: int) -> list[int]:
    """`total` in `parts` near-equal shares, larger ones first; they sum to `total`."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def autoscaler_node_groups(cluster: Cluster) -> list[NodeGroup]:
    """Exactly the groups of the cluster's cloud pools, with their bounds.

    AWS: one group per pool (`node_group_name`). GCP and Azure: one group
    per pool and zone, the pool's min/max split across its zones (they add up
    to the pool's): cluster-autoscaler's GCE provider accepts only zonal MIG
    URLs, and an Azure scale set's instances all sit on one subnet, so each
    zone's node subnet (and NAT gateway) has its own scale set.
    """
    groups = []
    zonal_name = {"gcp": gcp_zonal_group_name, "azure": azure_zonal_group_name}
    for pool in cluster.cloud_pools:
        if pool.provider in zonal_name:
            zones = pool.zones or cluster.control_plane.zones
            for zone, low, high in zip(zones, _split(pool.min_size, len(zones)), _split(pool.max_size, len(zones))):
                groups.append(NodeGroup(pool.name, zonal_name[pool.provider](cluster, pool, zone), low, high, zone))
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
    if cloud in ("gcp", "azure"):
        # Keep a pool's zonal groups (MIGs, scale sets) the same size, as one pool.
        args.append("--balance-similar-node-groups=true")
    args += [
        # least-waste: the group that leaves the least idle CPU/memory after
        # the pending pods land: the cheapest fit for a bin-packed cluster, and
        # it works on every cloud (`price` is GCE-only and knows list prices).
        "--expander=least-waste",
        # GPU nodes register behind the preflight taint until their checks
        # pass (docs/gpu-health.md): a startup taint, which the autoscaler
        # leaves out of node templates (pending GPU pods still scale a pool
        # up); the unhealthy taint says a node's state, not its shape.
        # Both flags since cluster-autoscaler 1.29.
        f"--startup-taint={PREFLIGHT_TAINT_KEY}",
        f"--status-taint={UNHEALTHY_TAINT_KEY}",
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
    if autoscaler_host_network(cluster):
        # On the host's network: serve metrics on the loopback only (no port on the API servers).
        args.append(f"--address={AUTOSCALER_METRICS_ADDRESS}")
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


# The address cluster-autoscaler serves its metrics and /health-check on (flag `--address`,
# default ":8085": cluster-autoscaler/main.go and FAQ.md "What are the parameters to CA?",
# v1.30 and v1.31). On the host's network that default would listen on the API servers'
# every interface; nothing scrapes it, so it stays on the machine's loopback.
AUTOSCALER_METRICS_ADDRESS = "127.0.0.1:8085"


def autoscaler_host_network(cluster: Cluster) -> bool:
    """Every cloud: cluster-autoscaler scales the pools with the API servers' own
    identity, which it reads from the instance metadata service (169.254.169.254),
    and corral/machine/metadata_block.py drops pod-network traffic to it on every
    kubelet machine. Only a host-network pod is the instance's own process there.

    What each provider reads there (kubernetes/autoscaler, cluster-autoscaler 1.31):
      aws    the instance profile's credentials through IMDSv2, whose hop limit of 1
             (corral/infra/aws/common.py metadata_options) also keeps pods out;
      gcp    cloudprovider/gce/gce_manager.go: `google.ComputeTokenSource("")` (the
             service account's token) and, with no config file, `metadata.Get
             ("instance/zone")` and `metadata.ProjectID()` at start;
      azure  ARM_USE_MANAGED_IDENTITY_EXTENSION=true (autoscaler_env): the managed
             identity's token from IMDS; upstream's own MSI example
             (cloudprovider/azure/examples/cluster-autoscaler-vmss-msi.yaml) runs
             with `hostNetwork: true` for the same reason.
    The node approver (corral/manifests/node_approver.py) and the repair controller
    (corral/manifests/repair.py) reach the same identity the same way."""
    return cluster.control_plane.cloud in ("aws", "gcp", "azure")


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


# --- kubelet serving certificates (kubelet-csr-approver) ----------------------
#
# Kubelets request their serving certificates from the cluster CA
# (`serverTLSBootstrap: true`) and the API server verifies them
# (`--kubelet-certificate-authority`). Nothing in Kubernetes approves those
# requests; kubelet-csr-approver does, only for names and addresses the
# cluster file says are this cluster's nodes. The CSR's user is the node's
# authenticated identity (`system:node:<name>`), and the approver checks that
# the certificate's common name is that user and its DNS name starts with
# the node's name. On top of that, every DNS name must match the node names
# below and every IP address must lie in the node networks below: a node's
# credentials cannot get a certificate for the API servers' load balancer, an
# etcd member, or a name outside the cluster.


def _host_pattern_regex(pattern: str) -> str:
    """A host pattern (`gpu-[001:064].sf1.internal`) as an RE2 regex body.

    Ranges become digit runs of the padded width; the name may be the short
    name (first label) alone, since nodes register with their host name as
    the system reports it, which is often the short one.
    """
    first, _, domain = pattern.partition(".")

    def body(text: str) -> str:
        out, rest = [], text
        while "[" in rest:
            head, _, tail = rest.partition("[")
            bounds, _, rest = tail.partition("]")
            start, _, _end = bounds.partition(":")
            width = len(start) if start.startswith("0") else 0
            out.append(head.replace(".", r"\."))
            out.append(f"[0-9]{{{width}}}" if width else "[0-9]+")
        out.append(rest.replace(".", r"\."))
        return "".join(out)

    return body(first) + (f"(\\.{body(domain)})?" if domain else "")


def _octets() -> str:
    return "-".join(["[0-9]{1,3}"] * 4)


def node_name_patterns(cluster: Cluster) -> list[str]:
    """RE2 regex bodies, one per kind of node, for the names nodes register with.

    Not the API servers: each approves its own kubelet's serving certificate
    (corral/machine/serving_csr.py), so no other node can be approved for an
    API server's name or address.
    - on-prem pools: their host patterns.
    - Azure pools: a scale set's name, '-' and 6 base-36 characters (its
      computer name prefix and instance number).
    - GCP pools: a zonal MIG's name (its base instance name), '-' and 4 characters.
    - AWS pools: the EC2 IP-based host name, short or with the region's domain.
    """
    patterns: list[str] = []
    for pool in cluster.onprem_pools:
        patterns += [_host_pattern_regex(p) for p in pool.hosts]
    groups = autoscaler_node_groups(cluster)
    for pool in cluster.cloud_pools:
        # The pool's scale sets / MIGs, as the autoscaler and the cloud name them.
        names = [re_escape(g.name) for g in groups if g.pool == pool.name]
        if pool.provider == "azure":
            patterns += [f"{name}-[0-9a-z]{{6}}" for name in names]
        elif pool.provider == "gcp":
            patterns += [f"{name}-[0-9a-z]{{4}}" for name in names]
        elif pool.provider == "aws":
            region = re_escape(cluster.control_plane.region)
            patterns.append(f"ip-{_octets()}(\\.({region}\\.compute|ec2)\\.internal)?")
    unique = []
    for pattern in patterns:
        if pattern not in unique:
            unique.append(pattern)
    return unique


def re_escape(text: str) -> str:
    """Host-name text as a regex literal: only '.' is special in [a-z0-9.-]."""
    return text.replace(".", r"\.")


def node_name_regex(cluster: Cluster) -> str:
    """The approver's `--provider-regex`: anchored, one alternative per kind of node."""
    return "^(" + "|".join(f"({p})" for p in node_name_patterns(cluster)) + ")$"


def node_ip_prefixes(cluster: Cluster) -> list[str]:
    """The approver's `--provider-ip-prefixes`: where nodes live, and nothing else.

    Never the control subnet, which holds the API servers, their load
    balancer and the etcd members: the approver cannot tie an address to a
    node name, so an API server's address here would let any node get a
    certificate for it (each API server approves its own: serving_csr.py).
    The node subnets of the control plane's network when the cluster has
    cloud pools; the sites' networks when it has on-prem pools.
    """
    lay = layout(cluster)
    prefixes: list[str] = []
    if cluster.cloud_pools:
        prefixes += [zone.node_subnet for zone in lay.zones]
    sites = {pool.site for pool in cluster.onprem_pools}
    for site in cluster.sites:
        if site.name in sites:
            prefixes += [str(cidr) for cidr in site.cidrs]
    return prefixes


def csr_approver_args(cluster: Cluster) -> list[str]:
    return [
        f"--provider-regex={node_name_regex(cluster)}",
        f"--provider-ip-prefixes={','.join(node_ip_prefixes(cluster))}",
        # The kubelet asks for one DNS name: its host name.
        "--allowed-dns-names=1",
        # Node names are not resolvable from everywhere the approver may run
        # (an on-prem host's name from a cloud API server, without DNS
        # forwarding to the site): the name regex and the address ranges
        # above are the checks instead of a lookup.
        "--bypass-dns-resolution=true",
        "--metrics-bind-address=:8080",
        "--health-probe-bind-address=:8081",
    ]

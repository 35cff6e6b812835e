"""The `node-approver` add-on: who may become which node (issue 25, items 4 and 9).

Three parts, all rendered from the cluster file:

1. The join rights of the pool token groups. Pool tokens (every cloud pool's,
   and each `corral join` run's) authenticate in `system:bootstrappers:corral:
   pool:<pool>` (`corral.nodes.join.pool_token_group`), not in kubeadm's
   default group, so kubeadm's bindings for that group do not reach them. They
   get exactly what kubeadm gives its default group for a join
   (cmd/kubeadm/app/constants/constants.go and the phases that bind them):
   create and read CSRs (ClusterRole `system:node-bootstrapper`,
   `kubeadm:kubelet-bootstrap`'s role), get nodes (`kubeadm:get-nodes`: kubeadm
   join looks for a node of its own name), and read the kubeadm-config and
   kubelet-config ConfigMaps (Roles `kubeadm:nodes-kubeadm-config` and
   `kubeadm:kubelet-config` in kube-system). NOT `kubeadm:node-autoapprove-
   bootstrap` (ClusterRole `system:certificates.k8s.io:certificatesigningrequests:
   nodeclient`): that is what let kube-controller-manager approve any name.
2. corral-node-approver (corral/certs/node_approver.py): approves a pool
   token's kubelet client request only for a machine of that pool (for a
   cloud pool, one its cloud's API says is a running instance of the pool's
   groups: corral/health/cloud_api.py, which ships beside it), denies the
   rest, labels pool nodes with `node-restriction.kubernetes.io/corral-pool`
   and `.../corral-team`, which no kubelet may set, and every node with
   `.../corral-monitoring-shard`, the Prometheus shard that scrapes it.
3. A ValidatingAdmissionPolicy holding the approver's Node updates to those
   three labels: `patch nodes` in RBAC covers every field of every node.
"""

from __future__ import annotations

import json
from pathlib import Path

from corral.certs import kube_watch
from corral.certs import node_approver as controller
from corral.health.addon import IMAGE
from corral.model.layout import layout
from corral.model.schema import Cluster
from corral.nodes.join import pool_token_group

from . import api_server_host, monitoring, policy
from .runner_rbac import FIXED_SPEC_FIELDS, field_or_empty

NAME = "corral-node-approver"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
# It runs on the stock image the GPU health agent runs on (IMAGE): no image of
# corral's own to build, scan and mirror. kube_watch.py (its list-then-watch
# client) ships beside it.
CODE = Path(controller.__file__)
WATCH_CODE = Path(kube_watch.__file__)
# It watches (a joining kubelet's request is decided when its watch event
# arrives, well within kubeadm's 5-minute TLS bootstrap, constants.TLSBootstrapTimeout)
# and relists once per RESYNC_SECONDS, at a jittered point (issue 28, item 2).
RESYNC_SECONDS = 3600
# What kubeadm binds to its default token group for a join, bound here to the
# pool groups instead (module docstring; the Roles exist from `kubeadm init`).
JOIN_CLUSTER_ROLES = ("system:node-bootstrapper", "kubeadm:get-nodes")
JOIN_KUBE_SYSTEM_ROLES = ("kubeadm:nodes-kubeadm-config", "kubeadm:kubelet-config")


def pool_groups(cluster: Cluster) -> list[str]:
    """Every pool's token group, cloud and on-prem."""
    return [pool_token_group(pool.name) for pool in cluster.node_pools]


def cloud_name_patterns(cluster: Cluster, pool) -> list[str]:
    """A cloud pool's node names as anchored-by-fullmatch regexes: its scale sets' or MIGs'
    instance names (Azure: computer name prefix + 6 base-36 characters; GCP: base instance
    name + '-' + 4 characters), on AWS the EC2 IP-based host name (policy.node_name_patterns)."""
    groups = [g.name for g in policy.autoscaler_node_groups(cluster) if g.pool == pool.name]
    if pool.provider == "azure":
        return [f"{policy.re_escape(name)}-[0-9a-z]{{6}}" for name in groups]
    if pool.provider == "gcp":
        return [f"{policy.re_escape(name)}-[0-9a-z]{{4}}" for name in groups]
    region = policy.re_escape(cluster.control_plane.region)
    return ["ip-" + "-".join(["[0-9]{1,3}"] * 4) + f"(\\.({region}\\.compute|ec2)\\.internal)?"]


def cloud_groups(cluster: Cluster, pool) -> list[dict]:
    """A cloud pool's groups as the approver asks its cloud about them: the ASG (every zone
    of the pool), or one MIG / scale set per zone (policy.autoscaler_node_groups names them
    as corral/infra/<cloud>/nodepools.py creates them). The project, subscription and
    resource group are not here: the approver reads them from the API servers' own
    metadata, the machines it runs on being this cluster's."""
    region = cluster.control_plane.region
    zones = list(pool.zones or cluster.control_plane.zones)
    return [{"provider": pool.provider, "name": group.name, "region": region,
             "zones": [group.zone] if group.zone else zones}
            for group in policy.autoscaler_node_groups(cluster) if group.pool == pool.name]


def reserved_names(cluster: Cluster) -> list[str]:
    """Node names no pool token may have: the API servers' and the etcd members'."""
    lay = layout(cluster)
    return sorted(m.name for m in (*lay.api_servers, *lay.etcd_members, *lay.events_members))


def config(cluster: Cluster) -> dict:
    """The controller's configuration (config.json in its ConfigMap)."""
    pools = {}
    for pool in cluster.node_pools:
        teams = cluster.teams_reserving(pool.name)
        entry: dict = {"team": teams[0].name if teams else None}
        if pool.provider == "onprem":
            entry["hosts"] = list(pool.hosts)
        else:
            entry["name_patterns"] = cloud_name_patterns(cluster, pool)
            entry["groups"] = cloud_groups(cluster, pool)
        pools[pool.name] = entry
    return {
        # The cloud whose API confirms a cloud pool's instance (the API servers' own).
        "cloud": cluster.control_plane.cloud,
        "labels": {"pool": policy.POOL_NODE_LABEL, "team": policy.TEAM_NODE_LABEL,
                   "monitoring_shard": monitoring.SHARD_NODE_LABEL},
        # The shards' hashmod modulus: a new shard count changes this file, so the
        # approver restarts and its first node list relabels every node once.
        "monitoring_shards": monitoring.shard_count(cluster),
        "reserved_names": reserved_names(cluster),
        "pools": pools,
        "resync_seconds": RESYNC_SECONDS,
    }


def files(cluster: Cluster) -> dict[str, str]:
    return {
        "node_approver.py": CODE.read_text(),
        "kube_watch.py": WATCH_CODE.read_text(),
        **api_server_host.cloud_api_files(),
        "config.json": json.dumps(config(cluster), indent=2, sort_keys=True) + "\n",
    }


def _label_scope_validations() -> list[dict[str, str]]:
    """CEL: between old and new Node, only the approver's three labels may differ."""
    owned_labels = (policy.POOL_NODE_LABEL, policy.TEAM_NODE_LABEL, monitoring.SHARD_NODE_LABEL)
    owned = json.dumps(list(owned_labels))
    new, old = field_or_empty("object", "metadata.labels", "{}"), field_or_empty("oldObject", "metadata.labels", "{}")
    validations = [
        {"expression": (f"{new}.all(k, k in {owned} || (k in {old} && {old}[k] == {new}[k])) && "
                        f"{old}.all(k, k in {owned} || k in {new})"),
         "message": f"{NAME} may change only the labels {', '.join(owned_labels)}"},
        {"expression": (f"{field_or_empty('object', 'metadata.annotations', '{}')} == "
                        f"{field_or_empty('oldObject', 'metadata.annotations', '{}')}"),
         "message": f"{NAME} may not change a node's annotations"},
    ]
    for name, empty in (*FIXED_SPEC_FIELDS, ("unschedulable", "false")):
        validations.append({
            "expression": f"{field_or_empty('object', f'spec.{name}', empty)} == "
                          f"{field_or_empty('oldObject', f'spec.{name}', empty)}",
            "message": f"{NAME} may not change a node's spec.{name}"})
    return validations


def label_scope_policy() -> dict:
    """The variable parts of the ValidatingAdmissionPolicy on the approver's Node updates."""
    return {"name": NAME, "user": SERVICE_ACCOUNT_USER, "validations": _label_scope_validations()}

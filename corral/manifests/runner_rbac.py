"""The node runner's identity: what `corral upgrade`'s playbook may do in the cluster.

Cordon, drain and uncordon need a cluster credential on the machine running
Ansible. Not the admin's (system:masters can do anything, and its client
certificate cannot be revoked): a ServiceAccount whose ClusterRole allows
exactly what `kubectl cordon/drain/uncordon/annotate` and the Ready wait call,
and for which corral issues a token per run (`kubectl create token`, bound
to a Secret that is deleted when the run ends, which revokes it at once; it
expires after the run's TTL in any case). See corral/upgrade/credential.py.

The rules, by kubectl call:
* `get/list nodes`, `patch nodes` (cordon/uncordon and corral's cordon mark
  are PATCHes of the Node);
* drain: `list pods` (on the node, across namespaces), `get pods` (waits for
  evicted pods to go), `create pods/eviction` (the eviction API, which
  enforces PodDisruptionBudgets), `get daemonsets` (drain skips their pods),
  `get/list poddisruptionbudgets` (the run can say which budget refused).
Nothing else: no delete (no `--disable-eviction`), no secrets, no RBAC.
"""

from __future__ import annotations

from typing import Any

NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "corral-node-runner"
CLUSTER_ROLE = "corral:node-runner"

RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "list"]},
]


def runner_rbac_objects() -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole and ClusterRoleBinding of the node runner."""
    labels = {"app.kubernetes.io/managed-by": "corral", "app.kubernetes.io/component": "node-runner"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE, "labels": labels},
         # Tokens come from the TokenRequest API only, never a long-lived Secret.
         "automountServiceAccountToken": False},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": CLUSTER_ROLE, "labels": labels}, "rules": RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": CLUSTER_ROLE, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
    ]

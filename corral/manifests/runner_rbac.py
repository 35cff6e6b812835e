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

`patch nodes` in RBAC covers every field of every Node; the
ValidatingAdmissionPolicy `corral-node-runner-scope` narrows what the
runner's updates may change to what cordon, uncordon and corral's cordon mark
need: `spec.unschedulable` and the `corral.dev/cordoned-by` annotation. A
stolen runner token cannot relabel a node into a team's pool, add or remove
taints, or rewrite its provider ID (docs/security.md).
"""

from __future__ import annotations

from typing import Any

from corral.health.kube import CORDON_ANNOTATION

NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "corral-node-runner"
CLUSTER_ROLE = "corral:node-runner"
SCOPE_POLICY = "corral-node-runner-scope"
USERNAME = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"

# The Node fields cordon/uncordon leave alone, compared old to new (a typed
# object's fields cannot be iterated in CEL, so they are named).
# (name, its CEL value when unset); also held by corral-node-approver's policy.
FIXED_SPEC_FIELDS = (("taints", "[]"), ("providerID", "''"), ("podCIDR", "''"), ("podCIDRs", "[]"))


def field_or_empty(obj: str, path: str, empty: str) -> str:
    """CEL for `obj.path`, or `empty` where it is not set."""
    parent, _, name = path.rpartition(".")
    return f"(has({obj}.{path}) ? {obj}.{path} : {empty})" if parent else f"{obj}.{path}"


def _scope_validations() -> list[dict[str, str]]:
    same = [
        {"expression": f"{field_or_empty('object', 'metadata.labels', '{}')} == {field_or_empty('oldObject', 'metadata.labels', '{}')}",
         "message": "the node runner may not change a node's labels"},
        {"expression": (f"variables.newAnnotations.all(k, k == '{CORDON_ANNOTATION}' || "
                        "(k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.newAnnotations[k])) && "
                        f"variables.oldAnnotations.all(k, k == '{CORDON_ANNOTATION}' || k in variables.newAnnotations)"),
         "message": f"the node runner may change only the {CORDON_ANNOTATION} annotation of a node"},
    ]
    for name, empty in FIXED_SPEC_FIELDS:
        same.append({"expression": f"{field_or_empty('object', f'spec.{name}', empty)} == {field_or_empty('oldObject', f'spec.{name}', empty)}",
                     "message": f"the node runner may not change a node's spec.{name} (only spec.unschedulable)"})
    return same


def scope_policy_objects(labels: dict[str, str]) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy (and its binding) that holds the runner's Node updates to cordoning."""
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": SCOPE_POLICY, "labels": labels},
         "spec": {
             # Fail closed: an error in evaluation must not let an update through.
             "failurePolicy": "Fail",
             "matchConstraints": {"resourceRules": [
                 {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}]},
             "matchConditions": [{"name": "node-runner", "expression": f"request.userInfo.username == '{USERNAME}'"}],
             "variables": [
                 {"name": "oldAnnotations", "expression": field_or_empty("oldObject", "metadata.annotations", "{}")},
                 {"name": "newAnnotations", "expression": field_or_empty("object", "metadata.annotations", "{}")},
             ],
             "validations": _scope_validations(),
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": SCOPE_POLICY, "labels": labels},
         "spec": {"policyName": SCOPE_POLICY, "validationActions": ["Deny"]}},
    ]

RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "list"]},
]


def runner_rbac_objects() -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole, ClusterRoleBinding and scope policy of the node runner."""
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
        *scope_policy_objects(labels),
    ]

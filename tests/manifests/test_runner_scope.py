"""The node runner's credential may cordon, uncordon and mark nodes, nothing else (issue 25, item 8).

RBAC's `patch nodes` covers every field of every Node. The
ValidatingAdmissionPolicy `corral-node-runner-scope` holds the runner's Node
updates to `spec.unschedulable` and the `corral.dev/cordoned-by` annotation.
Its CEL is evaluated here with cel-python, for the updates kubectl's cordon,
uncordon and annotate make and for the ones a stolen token would try.
"""

from __future__ import annotations

import copy

import pytest

from corral.health.kube import CORDON_ANNOTATION
from corral.manifests.runner_rbac import SCOPE_POLICY, USERNAME, runner_rbac_objects
from tests.admission import evaluate_policy

NODE = {
    "apiVersion": "v1", "kind": "Node",
    "metadata": {"name": "gpu-001.sf1.internal",
                 "labels": {"corral.dev/pool": "gpu-h100-sf1", "kubernetes.io/hostname": "gpu-001"},
                 "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
    "spec": {"podCIDR": "10.128.4.0/24", "podCIDRs": ["10.128.4.0/24"],
             "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
}


def policy() -> dict:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in runner_rbac_objects()}
    binding = objects[("ValidatingAdmissionPolicyBinding", SCOPE_POLICY)]
    assert binding["spec"] == {"policyName": SCOPE_POLICY, "validationActions": ["Deny"]}
    return objects[("ValidatingAdmissionPolicy", SCOPE_POLICY)]["spec"]


def admit(old: dict, new: dict, username: str = USERNAME) -> tuple[bool, list[str]]:
    """(allowed, messages) for an UPDATE of a Node by `username`, as the API server decides."""
    spec = policy()
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
    request = {"operation": "UPDATE", "userInfo": {"username": username}}
    return evaluate_policy(spec, object=new, oldObject=old, request=request)


def changed(**edits) -> dict:
    node = copy.deepcopy(NODE)
    for path, value in edits.items():
        *parents, leaf = path.split("__")
        target = node
        for part in parents:
            target = target.setdefault(part, {})
        if value is None:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return node


def test_cordon_with_corrals_mark_is_allowed():
    marked = changed(metadata__annotations={**NODE["metadata"]["annotations"], CORDON_ANNOTATION: "corral-upgrade"})
    assert admit(NODE, marked) == (True, [])
    cordoned = copy.deepcopy(marked)
    cordoned["spec"]["unschedulable"] = True
    assert admit(marked, cordoned) == (True, [])


def test_uncordon_and_removing_the_mark_are_allowed():
    cordoned = changed(metadata__annotations={**NODE["metadata"]["annotations"], CORDON_ANNOTATION: "x"},
                       spec__unschedulable=True)
    assert admit(cordoned, NODE) == (True, [])


@pytest.mark.parametrize("edit,message", [
    ({"metadata__labels": {**NODE["metadata"]["labels"], "corral.dev/team": "robotics"}}, "labels"),
    # The labels team placement selects (set only by corral-node-approver, issue 25, item 9).
    ({"metadata__labels": {**NODE["metadata"]["labels"], "node-restriction.kubernetes.io/corral-team": "robotics"}},
     "labels"),
    ({"metadata__labels": {**NODE["metadata"]["labels"], "node-restriction.kubernetes.io/corral-pool": "gpu-h100-robotics"}},
     "labels"),
    ({"metadata__labels": None}, "labels"),
    ({"metadata__annotations": {"node.alpha.kubernetes.io/ttl": "30"}}, "annotation"),
    ({"metadata__annotations": {**NODE["metadata"]["annotations"], "other/mark": "x"}}, "annotation"),
    ({"spec__taints": []}, "spec.taints"),
    ({"spec__taints": NODE["spec"]["taints"] + [{"key": "corral.dev/team", "value": "robotics", "effect": "NoSchedule"}]},
     "spec.taints"),
    ({"spec__providerID": "gce://other-project/us-central1-a/db-primary"}, "spec.providerID"),
    ({"spec__podCIDR": "10.128.9.0/24"}, "spec.podCIDR"),
], ids=["add-team-label", "add-node-restriction-team-label", "add-node-restriction-pool-label", "drop-labels", "edit-annotation", "add-annotation", "drop-taints", "add-taint",
        "provider-id", "pod-cidr"])
def test_anything_else_the_runner_changes_is_refused(edit, message):
    allowed, messages = admit(NODE, changed(**edit))
    assert not allowed and any(message in m for m in messages), messages


def test_other_users_are_not_held_by_the_runners_scope():
    relabelled = changed(metadata__labels={"corral.dev/pool": "other"})
    assert admit(NODE, relabelled, username="kubernetes-admin") == (True, [])

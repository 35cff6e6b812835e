"""The API servers' cloud identity holds what corral's in-cluster cloud client calls
(corral/health/cloud_api.py: READ_PERMISSIONS for corral-node-approver's instance check,
REPLACE_PERMISSIONS for the repair controller), with the replacement limited to this
cluster's groups (issue 25, item 4). Read from the mocked plans of the example clusters,
as the clouds' own tests read them; AWS through the IAM policy evaluator (iam_policy.py).
"""

from __future__ import annotations

import json

from corral.health import cloud_api

from .iam_policy import Request, effects
from .test_aws import heron  # noqa: F401  (the module-scoped plan fixtures)
from .test_azure import SCALE_SET_OPERATOR, jaguar  # noqa: F401
from .test_gcp import ibis  # noqa: F401

ROLE = "arn:aws:iam::123456789012:role/heron-apiserver"
ASG_ARN = ("arn:aws:autoscaling:us-west-2:123456789012:autoScalingGroup:1a2b:autoScalingGroupName/"
           "heron-gpu-a10g-inference")


def _aws_allows(policy: dict, action: str, resource: str = "*", **context: str) -> bool:
    found = effects(policy, Request(ROLE, action, resource, dict(context)))
    return "Allow" in found and "Deny" not in found


def test_aws_api_servers_may_find_any_instance_and_replace_only_this_clusters(heron):  # noqa: F811
    policy_resource = heron.one("aws:iam/rolePolicy:RolePolicy", "heron-cluster-autoscaler")
    assert heron.by_id(policy_resource.inputs["role"]).name == "heron-apiserver"
    policy = json.loads(policy_resource.inputs["policy"])
    for action in cloud_api.READ_PERMISSIONS["aws"]:
        assert _aws_allows(policy, action), action
    owned = {"aws:ResourceTag/k8s.io/cluster-autoscaler/heron": "owned"}
    for action in cloud_api.REPLACE_PERMISSIONS["aws"]:
        assert _aws_allows(policy, action, ASG_ARN, **owned), action
        # Another cluster's group (its tag names that cluster), or an untagged one: refused.
        assert not _aws_allows(policy, action, ASG_ARN, **{"aws:ResourceTag/k8s.io/cluster-autoscaler/kite": "owned"})
        assert not _aws_allows(policy, action, ASG_ARN)
    # The instance lookup writes nothing: every EC2 action granted is a Describe or Get.
    granted = [a for statement in policy["Statement"] for a in statement["Action"]]
    assert not [a for a in granted if a.startswith("ec2:") and not a.split(":")[1].startswith(("Describe", "Get"))]


def test_gcp_api_servers_read_the_migs_and_recreate_only_this_clusters(ibis):  # noqa: F811
    _, rec, _ = ibis
    read = rec.named("ibis-autoscaler-read", "IAMCustomRole").inputs
    resize = rec.named("ibis-autoscaler-resize", "IAMCustomRole").inputs
    assert set(cloud_api.READ_PERMISSIONS["gcp"]) <= set(read["permissions"])
    assert set(cloud_api.REPLACE_PERMISSIONS["gcp"]) == set(resize["permissions"])
    # The write role is granted only with the condition naming this cluster's MIGs.
    members = [m.inputs for m in rec.registered if m.type == "gcp:projects/iAMMember:IAMMember"
               and m.inputs.get("role", "").endswith("corral_ibis_autoscaler_resize")]
    assert members and all("ibis-" in m["condition"]["expression"] for m in members)


def test_azure_api_servers_drive_only_the_scale_sets(jaguar):  # noqa: F811
    """The scale-set operator role (its actions hold the VMs' list and the set's delete/action:
    tests/infra/test_azure_role.py) on each scale set, and on nothing wider."""
    grants = [r for r in jaguar.of("authorization:RoleAssignment") if r.inputs["roleDefinitionId"] == SCALE_SET_OPERATOR]
    assert grants
    assert {r.inputs["scope"].rsplit("/", 1)[0] for r in grants} == {
        "/mock/azure-native:compute:VirtualMachineScaleSet"}
    for permission in (*cloud_api.READ_PERMISSIONS["azure"], *cloud_api.REPLACE_PERMISSIONS["azure"]):
        assert permission.startswith("Microsoft.Compute/virtualMachineScaleSets/"), permission

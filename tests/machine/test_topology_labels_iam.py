"""Each AWS pool's node identity may call what the topology-labels boot script calls
(corral/machine/topology_labels.py AWS_PERMISSIONS: ec2:DescribeInstanceTopology), in the
cluster's region only, and nothing more from that policy. Read from heron's mocked plan
through the IAM policy evaluator (tests/infra/iam_policy.py), as tests/infra/test_cloud_api_iam.py.
"""

from __future__ import annotations

import json

from corral.machine import topology_labels
from corral.model.layout import node_group_name
from tests.infra.iam_policy import Request, effects
from tests.infra.test_aws import heron  # noqa: F401  (the module-scoped plan fixture)

ROLE = "arn:aws:iam::123456789012:role/heron-pool"


def _allows(policy: dict, action: str, region: str) -> bool:
    found = effects(policy, Request(ROLE, action, "*", {"ec2:Region": region}))
    return "Allow" in found and "Deny" not in found


def test_every_aws_pool_identity_may_read_its_instance_topology_in_the_clusters_region_only(heron):  # noqa: F811
    region = heron.cluster.control_plane.region
    assert heron.cluster.cloud_pools
    for pool in heron.cluster.cloud_pools:
        group = node_group_name(heron.cluster, pool)
        resource = heron.one("aws:iam/rolePolicy:RolePolicy", f"{group}-topology")
        # Attached to the pool's own role (the one its launch template's profile carries).
        assert heron.by_id(resource.inputs["role"]).name == group
        policy = json.loads(resource.inputs["policy"])
        for action in topology_labels.AWS_PERMISSIONS:
            assert _allows(policy, action, region), action
            assert not _allows(policy, action, "eu-west-1"), action
        # Nothing else: no other Describe, no write.
        for other in ("ec2:DescribeInstances", "ec2:TerminateInstances", "ec2:CreateTags"):
            assert not _allows(policy, other, region), other

"""The stack output nodeGroups: every cloud pool's groups, the same shape on every cloud.

Planned as `corral plan` does (the real cloud package, the stack's settings)
for each example, and read back with the parser remediation and the upgrade
roll use (corral.health.instances.parse_node_groups): the groups are exactly
the ones the cluster-autoscaler is configured with, in this cluster's
project / resource group and region.
"""

from __future__ import annotations

import pytest

from corral.health.instances import parse_node_groups
from corral.infra.outputs import SECRET_OUTPUT_KEYS
from corral.manifests.policy import autoscaler_node_groups
from corral.model import load_fleet

from .conftest import EXAMPLES, real_plan


@pytest.mark.parametrize("name", ["heron", "ibis", "jaguar"])
def test_node_groups_name_each_pools_groups_where_they_live(name):
    cluster = load_fleet([EXAMPLES]).clusters[name]
    plan = real_plan(cluster, EXAMPLES)
    assert "nodeGroups" not in SECRET_OUTPUT_KEYS
    groups = parse_node_groups(plan.outputs["nodeGroups"], f"plan of {name}")
    autoscaled = {pool.name: sorted(g.name for g in autoscaler_node_groups(cluster) if g.pool == pool.name)
                  for pool in cluster.cloud_pools}
    assert {pool: sorted(g.name for g in found) for pool, found in groups.items()} == autoscaled
    for pool, found in groups.items():
        zones = cluster.pool(pool).zones or cluster.control_plane.zones
        assert sorted(z for g in found for z in g.zones) == sorted(zones)
        for group in found:
            assert (group.provider, group.region) == (cluster.control_plane.cloud, cluster.control_plane.region)
            if group.provider == "gcp":
                assert group.project == "corral-ibis"          # stacks/Pulumi.ibis.yaml gcp:project
            if group.provider == "azure":
                assert group.resource_group == f"{name}-rg" and group.subscription


def test_a_cluster_without_cloud_pools_exports_no_groups(cluster_variant):
    jaguar = cluster_variant("jaguar", {
        "  - name: cpu-d64\n    provider: azure\n    machineType: Standard_D64s_v5\n"
        '    zones: ["1", "2", "3"]\n    minSize: 0\n    maxSize: 200\n': "",
    })
    assert real_plan(jaguar).outputs["nodeGroups"] == {}

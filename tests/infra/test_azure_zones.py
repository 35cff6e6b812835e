"""Azure pools use every zone's node subnet and NAT gateway: one scale set per
pool and zone, the groups the cluster-autoscaler add-on lists (Pulumi mocks)."""

from __future__ import annotations

import pytest

from corral.manifests.policy import autoscaler_args, autoscaler_node_groups

from .test_azure import Plan, _vmss_profile, add_pools, plan_of


@pytest.fixture(scope="module")
def zonal() -> Plan:
    """jaguar, plus a pool on two of the three zones."""
    return plan_of("jaguar", pools=add_pools(
        {"name": "cpu-e32", "provider": "azure", "machineType": "Standard_E32s_v5",
         "zones": ["1", "3"], "minSize": 3, "maxSize": 9},
    ))


def _subnet_of(vmss) -> str:
    (nic,) = _vmss_profile(vmss)["networkProfile"]["networkInterfaceConfigurations"]
    (ipconf,) = nic["ipConfigurations"]
    return ipconf["subnet"]["id"]


def test_each_pool_zone_has_its_own_scale_set_on_that_zones_subnet_and_nat(zonal: Plan):
    cluster = zonal.ctx.cluster
    subnets = {r.name: r for r in zonal.of("network:Subnet")}
    nats = {r.name: r for r in zonal.of("network:NatGateway")}
    seen = set()
    for pool in cluster.cloud_pools:
        zones = pool.zones or cluster.control_plane.zones
        for zone in zones:
            vmss = zonal.one("compute:VirtualMachineScaleSet", f"jaguar-{pool.name}-{zone}")
            assert vmss.inputs["zones"] == [zone]
            subnet_id = _subnet_of(vmss)
            assert subnet_id.endswith(f"/jaguar-nodes-{zone}")
            subnet = subnets[subnet_id.rsplit("/", 1)[1]]
            assert subnet.inputs["addressPrefix"] == zonal.ctx.layout.zone(zone).node_subnet
            # That subnet's egress is the same zone's NAT gateway.
            nat_name = subnet.inputs["natGateway"]["id"].rsplit("/", 1)[1]
            assert nats[nat_name].inputs["zones"] == [zone]
            seen.add(zone)
    assert seen == {"1", "2", "3"}  # every zone's subnet carries nodes
    pool_sets = zonal.of("compute:VirtualMachineScaleSet")
    assert len(pool_sets) == sum(len(p.zones or cluster.control_plane.zones) for p in cluster.cloud_pools) == 5


def test_zone_shares_add_up_to_the_pools_bounds(zonal: Plan):
    cluster = zonal.ctx.cluster
    for pool in cluster.cloud_pools:
        sets = [s for s in zonal.of("compute:VirtualMachineScaleSet") if s.inputs["tags"]["corral-pool"] == pool.name]
        assert sum(int(s.inputs["tags"]["min"]) for s in sets) == pool.min_size
        assert sum(int(s.inputs["tags"]["max"]) for s in sets) == pool.max_size
        assert sum(s.inputs["sku"]["capacity"] for s in sets) == pool.min_size
        # Every zone's set of a pool is the same machine, so the autoscaler
        # balances them as one pool.
        assert len({s.inputs["sku"]["name"] for s in sets}) == 1


def test_the_autoscaler_add_on_lists_exactly_the_scale_sets_with_their_bounds(zonal: Plan):
    cluster = zonal.ctx.cluster
    args = autoscaler_args(cluster)
    listed = {}
    for arg in args:
        if arg.startswith("--nodes="):
            low, high, name = arg.removeprefix("--nodes=").split(":", 2)
            listed[name] = (low, high)
    created = {s.inputs["vmScaleSetName"]: (s.inputs["tags"]["min"], s.inputs["tags"]["max"])
               for s in zonal.of("compute:VirtualMachineScaleSet")}
    assert listed == created
    assert "--balance-similar-node-groups=true" in args
    assert "--cloud-provider=azure" in args
    # The scale sets' names are the node groups' names, zone by zone.
    assert {g.name: g.zone for g in autoscaler_node_groups(cluster)} == {
        s.inputs["vmScaleSetName"]: s.inputs["zones"][0] for s in zonal.of("compute:VirtualMachineScaleSet")
    }

"""End to end: the offline plans (corral.infra.plan) of the example clusters, changed and classified.

Per cloud (jaguar: Azure, heron: AWS, ibis: GCP): raising the etcd disk's
IOPS is an in-place update; changing the etcd disk type replaces the disks
where the cloud cannot convert them (Azure Premium SSD v2 -> Ultra, GCP
Hyperdisk types) and is an online Elastic Volumes change on AWS; changing
the etcd machine type restarts every member in one `pulumi up` (no cloud
replaces a VM for its size), which loses etcd quorum: dangerous on each
cloud. A pool resize touches only the pool's autoscaled group (on GCP,
nothing: the cluster autoscaler alone sizes the MIGs).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from corral.diff import planner
from corral.diff.resources import classify
from corral.model import load_fleet

EXAMPLES = Path(__file__).resolve().parents[2] / "clusters"

VARIANTS = {
    "jaguar": {
        "iops": ("iops: 20000,", "iops: 24000,"),  # E16s_v5 sustains 25,600
        "machine": ("machineType: Standard_E16s_v5", "machineType: Standard_E32s_v5"),
        "disk_type": ("type: PremiumV2_LRS", "type: UltraSSD_LRS"),
        "pool": ("maxSize: 200", "maxSize: 300"),
    },
    "heron": {
        "iops": ("iops: 12000", "iops: 10000"),  # r7i.2xlarge sustains 12,000
        "machine": ("machineType: r7i.2xlarge", "machineType: r7i.4xlarge"),
        "disk_type": ("type: io2, sizeGiB: 256, iops: 12000", "type: gp3, sizeGiB: 256, iops: 12000"),
        "pool": ("maxSize: 80", "maxSize: 120"),
        "pool_min": ("minSize: 2\n    maxSize: 40", "minSize: 4\n    maxSize: 40"),
    },
    "ibis": {
        "iops": ("iops: 12000,", "iops: 14000,"),
        "machine": ("machineType: c3-highmem-8", "machineType: c3-highmem-22"),
        # Hyperdisk Extreme attaches to C3 machines of 88+ vCPUs only.
        "disk_type": ("c3-highmem-8      # hyperdisk needs a C3/N4-class machine\n"
                      "    disk: {type: hyperdisk-balanced, sizeGiB: 256, iops: 12000, throughputMBps: 400}",
                      "c3-highmem-88\n    disk: {type: hyperdisk-extreme, sizeGiB: 256, iops: 12000}"),
        "pool": ("maxSize: 64", "maxSize: 96"),
    },
}
DISK = {"jaguar": "azure-native:compute:Disk", "heron": "aws:ebs:Volume", "ibis": "gcp:compute:Disk"}
VM = {"jaguar": "azure-native:compute:VirtualMachine", "heron": "aws:ec2:Instance", "ibis": "gcp:compute:Instance"}
GROUP = {"jaguar": {"azure-native:monitor:AutoscaleSetting", "azure-native:compute:VirtualMachineScaleSet"},
         "heron": {"aws:autoscaling:Group"},
         "ibis": {"gcp:compute:InstanceGroupManager"}}


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[tuple[str, str], list]:
    """Plans of every example cluster and every variant, two at a time."""
    sides = []
    for name, variants in VARIANTS.items():
        for variant, (old, new) in {"base": ("", ""), **variants}.items():
            folder = tmp_path_factory.mktemp(f"{name}-{variant}") / "clusters"
            shutil.copytree(EXAMPLES, folder)
            path = folder / f"{name}.yaml"
            text = path.read_text()
            assert old in text, (name, old)
            path.write_text(text.replace(old, new, 1))
            cluster = load_fleet([folder]).clusters[name]
            sides.append(((name, variant), (cluster, folder)))
    results = planner.plan_pairs([(f"{k}", None, side) for k, side in sides], jobs=2)
    out = {}
    for (key, _), (_, plan, error) in zip(sides, results):
        assert error is None, error
        out[key] = plan
    return out


def changes(plans, name, variant):
    return classify(plans[(name, "base")], plans[(name, variant)])


def etcd_changes(found, type_):
    return [c for c in found if c.type == type_ and c.name.startswith(tuple(f"{n}-etcd" for n in VARIANTS))]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_plan_names_are_real(plans, name):
    names = [r["name"] for r in plans[(name, "base")]]
    assert "[secret]" not in names and len(names) == len(set((r["type"], r["name"]) for r in plans[(name, "base")]))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_etcd_iops_is_an_in_place_update(plans, name):
    found = changes(plans, name, "iops")
    disks = etcd_changes(found, DISK[name])
    assert disks and all(c.action == "update" and c.danger is None for c in disks)
    assert {c.type for c in found} == {DISK[name]}
    assert not any(c.danger for c in found)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_etcd_machine_type_restarts_the_quorum_dangerously(plans, name):
    found = changes(plans, name, "machine")
    vms = etcd_changes(found, VM[name])
    assert vms and all(c.action == "update" and c.restart and c.danger for c in vms)
    assert "restart in one `pulumi up`" in vms[0].danger
    assert found[0].danger  # dangers sort first


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_etcd_disk_type(plans, name):
    found = changes(plans, name, "disk_type")
    disks = etcd_changes(found, DISK[name])
    assert disks
    if name == "heron":
        # EBS Elastic Volumes change io2 -> gp3 online: an update, nothing dangerous.
        assert all(c.action == "update" and c.danger is None for c in disks)
    else:
        assert all(c.action == "replace" and c.danger and c.protect for c in disks)
        assert "etcd data disk replaced" in disks[0].danger


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_pool_resize_touches_only_the_group_and_the_autoscaler(plans, name):
    found = changes(plans, name, "pool")
    # The monitoring add-on is sized from the cluster's capacity in steps: a
    # resize that crosses one resizes Prometheus, and a bigger volume is flagged
    # (a StatefulSet's volumeClaimTemplates cannot change in place).
    monitoring = [c for c in found if c.name == f"{name}-addons-monitoring"]
    for change in monitoring:
        volumes = [e for e in change.changes if "volumeClaimTemplates" in e.path]
        assert all(e.effect == "replace" for e in volumes)
    found = [c for c in found if c not in monitoring]
    # Kueue's quotas follow the GPU pools' sizes (corral/model/kueue.py): a resized GPU pool
    # updates its ClusterQueues' nominal quota in place.
    kueue = [c for c in found if c.name == f"{name}-addons-kueue-queues"]     # the queues, after the Kueue chart
    assert all(e.effect == "update" for c in kueue for e in c.changes)
    found = [c for c in found if c not in kueue]
    # The cluster-autoscaler add-on carries every pool's bounds (--nodes).
    autoscaler = [c for c in found if c.type == "kubernetes:yaml:ConfigGroup"]
    assert [c.name for c in autoscaler] == [f"{name}-addons-cluster-autoscaler"]
    cloud = [c for c in found if c not in autoscaler]
    if name == "ibis":
        # GCP pools are zonal MIGs sized by the cluster autoscaler alone (no
        # GCE autoscaler): a pool's bounds are not cloud resources at all.
        assert cloud == []
    else:
        assert cloud and {c.type for c in cloud} <= GROUP[name]
    assert all(c.action == "update" and c.danger is None and c.verified for c in found)


def test_a_group_size_the_autoscaler_owns_is_not_reported_as_a_change(plans):
    """Raising a pool's minSize also raises its ASG's initial desiredCapacity,
    which the program ignores once the group exists (ignore_changes: the
    autoscaler owns it): the plan records that, and the diff shows only minSize."""
    groups = [c for c in changes(plans, "heron", "pool_min") if c.type == "aws:autoscaling:Group"]
    assert [c.name for c in groups] == ["heron-gpu-a10g-inference"]
    effects = {c.path: c.effect for c in groups[0].changes}
    assert effects["desiredCapacity"] == "ignored"
    assert effects["minSize"] == "update"
    assert "desiredCapacity" not in groups[0].summary()
    group = next(r for r in plans[("heron", "base")] if r["name"] == "heron-gpu-a10g-inference"
                 and r["type"].startswith("aws:autoscaling"))
    assert "desiredCapacity" in group["ignoreChanges"]

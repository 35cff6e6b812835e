"""The plan classifier on hand-made plans: create/update/replace/delete and dangers."""

from __future__ import annotations

import copy

from corral.diff.replacements import RULES, effect
from corral.diff.resources import classify, counts, type_token


def res(type_, name, inputs, protect=False, parent="x-etcd", **extra):
    return {"type": type_, "name": name, "parent": parent, "protect": protect, "inputs": inputs, **extra}


def etcd_members(type_, count, key, value):
    return [res(type_, f"c-etcd-{i}", {key: value, "zone": f"z{i}"}) for i in range(count)]


def by_name(changes):
    return {c.name: c for c in changes}


def test_type_tokens_are_shortened():
    assert type_token("aws:ec2/instance:Instance") == "aws:ec2:Instance"
    assert type_token("tls:index/privateKey:PrivateKey") == "tls:index:PrivateKey"
    assert type_token("azure-native:compute:Disk") == "azure-native:compute:Disk"


def test_ebs_iops_is_in_place_and_not_dangerous():
    old = [res("aws:ebs/volume:Volume", "c-etcd-0-data", {"iops": 16000, "type": "io2", "availabilityZone": "a"}, protect=True)]
    new = copy.deepcopy(old)
    new[0]["inputs"]["iops"] = 20000
    [change] = classify(old, new)
    assert (change.type, change.action, change.danger) == ("aws:ebs:Volume", "update", None)
    assert change.changes[0].path == "iops" and change.changes[0].effect == "update"
    assert change.stateful == "etcd data disk" and change.protect


def test_ebs_zone_is_a_dangerous_replacement():
    old = [res("aws:ebs:Volume", "c-etcd-0-data", {"availabilityZone": "us-west-2a"}, protect=True)]
    new = [res("aws:ebs:Volume", "c-etcd-0-data", {"availabilityZone": "us-west-2b"}, protect=True)]
    [change] = classify(old, new)
    assert change.action == "replace"
    assert "etcd data disk replaced (because of availabilityZone)" in change.danger
    assert "protected" in change.danger


def test_azure_disk_sku_replaces_iops_does_not():
    base = {"sku": {"name": "PremiumV2_LRS"}, "diskIOPSReadWrite": 20000, "zones": ["1"]}
    old = [res("azure-native:compute:Disk", "j-etcd-0-data", base, protect=True)]
    iops = [res("azure-native:compute:Disk", "j-etcd-0-data", {**base, "diskIOPSReadWrite": 30000}, protect=True)]
    sku = [res("azure-native:compute:Disk", "j-etcd-0-data", {**base, "sku": {"name": "UltraSSD_LRS"}}, protect=True)]
    [change] = classify(old, iops)
    assert change.action == "update" and change.danger is None
    [change] = classify(old, sku)
    assert change.action == "replace" and change.danger
    assert change.changes[0].path == "sku.name"


def test_gcp_disk_type_replaces_provisioned_iops_does_not():
    base = {"type": "hyperdisk-balanced", "provisionedIops": 12000, "zone": "us-central1-a", "size": 256}
    old = [res("gcp:compute/disk:Disk", "i-etcd-0-data", base, protect=True)]
    [change] = classify(old, [res("gcp:compute/disk:Disk", "i-etcd-0-data", {**base, "provisionedIops": 14000}, protect=True)])
    assert change.action == "update" and not change.danger
    [change] = classify(old, [res("gcp:compute/disk:Disk", "i-etcd-0-data", {**base, "type": "hyperdisk-extreme"}, protect=True)])
    assert change.action == "replace" and change.danger
    # Shrinking is a new disk too; growing is not.
    [change] = classify(old, [res("gcp:compute/disk:Disk", "i-etcd-0-data", {**base, "size": 128}, protect=True)])
    assert change.action == "replace"
    [change] = classify(old, [res("gcp:compute/disk:Disk", "i-etcd-0-data", {**base, "size": 512}, protect=True)])
    assert change.action == "update"


def test_restarting_the_etcd_quorum_is_dangerous():
    old = etcd_members("aws:ec2:Instance", 3, "instanceType", "r7i.2xlarge")
    new = etcd_members("aws:ec2:Instance", 3, "instanceType", "r7i.4xlarge")
    changes = classify(old, new)
    assert [c.action for c in changes] == ["update"] * 3
    assert all(c.restart and c.danger and "3 of 3 members" in c.danger for c in changes)
    # One member at a time is what the danger message asks for: not dangerous.
    one = copy.deepcopy(old)
    one[0]["inputs"]["instanceType"] = "r7i.4xlarge"
    [change] = classify(old, one)
    assert change.restart and change.danger is None


def test_machine_type_on_each_cloud_restarts():
    for type_, key in (("aws:ec2:Instance", "instanceType"), ("gcp:compute:Instance", "machineType")):
        assert effect(type_, key, "a", "b")[0] == "restart"
    assert effect("azure-native:compute:VirtualMachine", "hardwareProfile.vmSize", "a", "b")[0] == "restart"
    assert effect("gcp:compute:Instance", "bootDisk.initializeParams.type", "a", "b")[0] == "replace"
    assert effect("azure-native:compute:VirtualMachine", "zones", ["1"], ["2"])[0] == "replace"


def test_pool_resize_is_one_group_update():
    old = [res("aws:autoscaling/group:Group", "h-gpu", {"minSize": 0, "maxSize": 80}, parent="h-nodepools"),
           res("aws:ec2/launchTemplate:LaunchTemplate", "h-gpu", {"instanceType": "g5.12xlarge"}, parent="h-nodepools")]
    new = copy.deepcopy(old)
    new[0]["inputs"]["maxSize"] = 120
    [change] = classify(old, new)
    assert (change.type, change.action, change.danger, change.verified) == ("aws:autoscaling:Group", "update", None, True)


def test_create_delete_and_protected_delete():
    a = res("aws:ec2:Subnet", "s1", {"cidrBlock": "10.0.0.0/24"})
    disk = res("aws:ebs:Volume", "c-etcd-0-data", {"availabilityZone": "a"}, protect=True, retainOnDelete=True)
    changes = by_name(classify([disk], [a]))
    assert changes["s1"].action == "create" and not changes["s1"].danger
    assert changes["c-etcd-0-data"].action == "delete"
    assert "etcd data disk deleted" in changes["c-etcd-0-data"].danger
    assert any("retain_on_delete" in n for n in changes["c-etcd-0-data"].notes)
    # Dangers sort first.
    assert classify([disk], [a])[0].name == "c-etcd-0-data"


def test_vpn_gateway_replacement_is_dangerous():
    old = [res("azure-native:network:VirtualNetworkGateway", "j-vpn", {"vpnType": "RouteBased", "gatewayType": "Vpn"})]
    new = [res("azure-native:network:VirtualNetworkGateway", "j-vpn", {"vpnType": "PolicyBased", "gatewayType": "Vpn"})]
    [change] = classify(old, new)
    assert change.action == "replace" and "VPN" in change.danger


def test_parent_change_is_a_replacement():
    old = [res("aws:ec2:Subnet", "s1", {"cidrBlock": "10.0.0.0/24"}, parent="a")]
    new = [res("aws:ec2:Subnet", "s1", {"cidrBlock": "10.0.0.0/24"}, parent="b")]
    [change] = classify(old, new)
    assert change.action == "replace" and change.changes[0].path == "(parent)"


def test_unknown_types_and_properties_are_unverified_updates():
    old = [res("aws:ec2:Thing", "t", {"x": 1}), res("aws:ebs:Volume", "v", {"multiAttachEnabled": False})]
    new = [res("aws:ec2:Thing", "t", {"x": 2}), res("aws:ebs:Volume", "v", {"multiAttachEnabled": True})]
    changes = by_name(classify(old, new))
    assert changes["t"].action == "update" and not changes["t"].verified
    assert changes["v"].action == "update" and not changes["v"].verified


def test_ignore_changes_and_components_and_no_change():
    old = [res("aws:ec2:Instance", "c-etcd-0", {"userData": "a", "instanceType": "m"}, ignore_changes=["userData"]),
           res("corral:aws:Etcd", "c-etcd", {}), res("aws:ec2:Vpc", "v", {"cidrBlock": "10.0.0.0/16"})]
    new = copy.deepcopy(old)
    new[0]["inputs"]["userData"] = "b"
    assert classify(old, new) == []
    assert counts(classify(old, [])) == {"create": 0, "update": 0, "replace": 0, "delete": 2}


def test_nested_list_paths_match_the_table():
    old = [res("gcp:compute:Instance", "i-api-0", {"networkInterfaces": [{"networkIp": "10.0.0.5", "subnetwork": "s"}]})]
    new = [res("gcp:compute:Instance", "i-api-0", {"networkInterfaces": [{"networkIp": "10.0.0.6", "subnetwork": "s"}]})]
    [change] = classify(old, new)
    assert change.action == "replace" and change.changes[0].path == "networkInterfaces[0].networkIp"


def test_every_rule_cites_a_source():
    for token, rule in RULES.items():
        assert rule.source.startswith("https://"), token

"""Racks of on-prem hosts (issue 29, item 2): `racks` beside `hosts`, the
corral.dev/rack node label every joined host registers with.

A pool's `racks` entry j names the racks of hosts entry j in the same range
syntax; each rack holds an equal run of the hosts, in order. A count that does
not divide the hosts evenly is an error naming the file, line and field.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from corral.health import repair_protocol
from corral.model.hosts import (
    RACK_LABEL,
    HostPatternError,
    assign_racks,
    check_racks,
    expand_racks,
)
from corral.nodes.inventory import as_yaml_inventory, build, to_ansible_yaml

from .helpers import example, line_of, variant
from .test_host_addresses import load as load_jaguar

SF1_RACKS = 'racks: ["sf1-r[01:08]"]'


def at(line: int, rest: str) -> str:
    """A problem line at `line` of jaguar.yaml (any column), ending in `rest`."""
    return rf"jaguar\.yaml:{line}:\d+: " + re.escape(rest)


def test_rack_ranges_expand_like_host_ranges():
    assert expand_racks("sf1-r[01:03]") == ["sf1-r01", "sf1-r02", "sf1-r03"]
    assert expand_racks("hall[1:2]-r[1:2]") == ["hall1-r1", "hall1-r2", "hall2-r1", "hall2-r2"]
    assert expand_racks("sf1-r09") == ["sf1-r09"]


@pytest.mark.parametrize(("pattern", "message"), [
    ("sf1.r[01:08]", "'sf1.r01' is not a valid rack name"),       # a label value, a DNS label: no dots
    ("SF1-r01", "'SF1-r01' is not a valid rack name"),
    ("r-[01:08]-", "'r-01-' is not a valid rack name"),
    ("r" * 64, "is not a valid rack name"),                      # label values: at most 63 characters
    ("sf1-r[08:01]", "runs backwards"),
    ("sf1-r[01:08", "unclosed '['"),
])
def test_bad_rack_patterns(pattern, message):
    with pytest.raises(HostPatternError, match=message.replace("[", r"\[")):
        check_racks(pattern)


def test_each_rack_holds_an_equal_run_of_the_hosts_in_order():
    hosts = [f"gpu-{n:03d}" for n in range(1, 17)]
    racks = assign_racks(hosts, ["r1", "r2", "r3", "r4"])
    assert [racks[h] for h in hosts] == ["r1"] * 4 + ["r2"] * 4 + ["r3"] * 4 + ["r4"] * 4
    with pytest.raises(HostPatternError, match="3 racks do not divide 16 hosts evenly"):
        assign_racks(hosts, ["r1", "r2", "r3"])


def test_the_example_pool_maps_each_host_to_its_rack(tmp_path):
    jaguar = load_jaguar(tmp_path, example("jaguar"))
    sf1 = jaguar.pool("gpu-h100-sf1").host_racks
    assert (sf1["gpu-001.sf1.internal"], sf1["gpu-008.sf1.internal"]) == ("sf1-r01", "sf1-r01")
    assert (sf1["gpu-009.sf1.internal"], sf1["gpu-064.sf1.internal"]) == ("sf1-r02", "sf1-r08")
    assert sorted(set(sf1.values())) == [f"sf1-r{n:02d}" for n in range(1, 9)]
    assert set(jaguar.pool("gpu-h100-robotics").host_racks.values()) == {"sf1-r09"}


def test_a_pool_without_racks_or_rack_label_has_none(tmp_path):
    jaguar = load_jaguar(tmp_path, example("jaguar").replace(f"    {SF1_RACKS}\n", "", 1))
    assert jaguar.pool("gpu-h100-sf1").host_racks == {}


def test_a_rack_count_that_does_not_divide_the_hosts_names_file_line_and_field(tmp_path):
    found = variant(tmp_path, "jaguar", SF1_RACKS, 'racks: ["sf1-r[01:07]"]')
    line = line_of("jaguar", SF1_RACKS)
    assert len(found) == 1 and re.fullmatch(at(line, (
        "nodePools[0].racks[0]: 'sf1-r[01:07]' beside hosts entry 'gpu-[001:064].sf1.internal': "
        "7 racks do not divide 64 hosts evenly: each rack holds an equal run of the hosts, in order")), found[0])


def test_one_racks_entry_per_hosts_entry(tmp_path):
    found = variant(tmp_path, "jaguar", SF1_RACKS, 'racks: ["sf1-r[01:04]", "sf1-r[05:08]"]')
    assert len(found) == 1 and re.fullmatch(at(line_of("jaguar", SF1_RACKS), (
        "nodePools[0].racks: 2 racks entries for 1 hosts entries: give one per hosts entry, in the same order")),
        found[0])


def test_a_bad_rack_name_names_file_line_and_field(tmp_path):
    found = variant(tmp_path, "jaguar", SF1_RACKS, 'racks: ["SF1-r[01:08]"]')
    assert len(found) == 1
    assert re.match(at(line_of("jaguar", SF1_RACKS), "nodePools[0].racks[0]: "), found[0]), found
    assert "'SF1-r01' is not a valid rack name" in found[0]


def test_a_pool_with_racks_cannot_also_set_the_rack_label(tmp_path):
    found = variant(tmp_path, "jaguar", "labels: {corral.dev/fabric: sf1-roce}", "labels: {corral.dev/rack: r12}")
    assert len(found) == 1 and re.fullmatch(at(line_of("jaguar", "corral.dev/fabric: sf1-roce"), (
        "nodePools[0].labels.corral.dev/rack: 'corral.dev/rack' comes from the pool's racks; "
        "remove the label (or the racks)")), found[0]), found


def test_a_pool_without_racks_may_put_all_its_hosts_in_one_rack_by_label(tmp_path):
    text = example("jaguar").replace(f"    {SF1_RACKS}\n", "", 1).replace(
        "labels: {corral.dev/fabric: sf1-roce}", "labels: {corral.dev/rack: sf1-r12}")
    jaguar = load_jaguar(tmp_path, text)
    assert set(jaguar.pool("gpu-h100-sf1").host_racks.values()) == {"sf1-r12"}
    assert len(jaguar.pool("gpu-h100-sf1").host_racks) == 64


def test_the_rack_label_is_the_repair_protocols():
    # The health layer's copy (the repair controller reads racks) and the model's agree.
    assert RACK_LABEL == repair_protocol.RACK_LABEL == "corral.dev/rack"


def test_each_joined_host_registers_with_its_rack(tmp_path):
    jaguar = load_jaguar(tmp_path, example("jaguar"))
    inventory = build(jaguar)
    hostvars = inventory["_meta"]["hostvars"]
    pool_labels = inventory["pool_gpu_h100_sf1"]["vars"]["corral_node_labels"]
    assert hostvars["gpu-009.sf1.internal"]["corral_node_labels"] == {**pool_labels, RACK_LABEL: "sf1-r02"}
    assert hostvars["gpu-072.sf1.internal"]["corral_node_labels"][RACK_LABEL] == "sf1-r09"
    # What Ansible gives the kubelet_join role: the host's labels win over its pool group's.
    static = tmp_path / "inventory.yaml"
    static.write_text(to_ansible_yaml(as_yaml_inventory(inventory)))
    result = subprocess.run(["ansible-inventory", "-i", str(static), "--host", "gpu-064.sf1.internal"],
                            capture_output=True, text=True, check=True)
    labels = json.loads(result.stdout)["corral_node_labels"]
    assert labels[RACK_LABEL] == "sf1-r08" and labels["corral.dev/pool"] == "gpu-h100-sf1"


def test_hosts_of_a_pool_without_racks_keep_the_pools_labels(tmp_path):
    jaguar = load_jaguar(tmp_path, example("jaguar").replace(f"    {SF1_RACKS}\n", "", 1))
    assert "corral_node_labels" not in build(jaguar)["_meta"]["hostvars"]["gpu-001.sf1.internal"]

"""The inventory built from a cluster file, and how Ansible reads it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from corral.model import load_cluster
from corral.nodes.inventory import as_yaml_inventory, build, group_name
from tests.conftest import EXAMPLES


@pytest.fixture(scope="module")
def jaguar():
    return load_cluster(EXAMPLES / "jaguar.yaml")


def test_groups_say_what_a_host_is(jaguar):
    inv = build(jaguar)
    assert len(inv["onprem_nodes"]["hosts"]) == 72
    assert inv["gpu_nodes"]["hosts"] == inv["onprem_nodes"]["hosts"]
    assert inv["roce_nodes"]["hosts"] == inv["onprem_nodes"]["hosts"]
    assert len(inv["site_sf1"]["hosts"]) == 72
    assert inv["pool_gpu_h100_robotics"]["hosts"][0] == "gpu-065.sf1.internal"
    assert group_name("pool", "gpu-h100-sf1") == "pool_gpu_h100_sf1"


def test_pool_vars_carry_gpu_roce_labels_and_team_taints(jaguar):
    pool_vars = build(jaguar)["pool_gpu_h100_robotics"]["vars"]
    assert pool_vars["corral_nvidia_driver_version"] == "550.127.05"
    assert pool_vars["corral_nvidia_fabricmanager"] is True
    assert pool_vars["corral_roce_interfaces"] == ["ens1f0np0"]
    assert pool_vars["corral_roce_pfc_priority"] == 3 and pool_vars["corral_roce_dscp"] == 26
    assert pool_vars["corral_node_labels"]["corral.dev/gpu-model"] == "H100"
    assert {"key": "corral.dev/team", "value": "robotics", "effect": "NoSchedule"} in pool_vars["corral_node_taints"]
    # The unreserved pool carries no team taint.
    other = build(jaguar)["pool_gpu_h100_sf1"]["vars"]["corral_node_taints"]
    assert all(t["key"] != "corral.dev/team" for t in other)


def test_cluster_and_site_vars(jaguar):
    inv = build(jaguar)
    assert inv["all"]["vars"]["corral_arp_gc_thresh3"] == 100000
    assert inv["all"]["vars"]["corral_flannel_direct_routing"] is True
    assert inv["site_sf1"]["vars"]["corral_apt_mirror"] == "http://mirror.sf1.internal"


def test_ansible_reads_the_yaml_and_the_dynamic_inventory(jaguar, tmp_path):
    from corral.model.render import dump_yaml

    static = tmp_path / "inventory.yaml"
    static.write_text(dump_yaml(as_yaml_inventory(build(jaguar))))
    script = tmp_path / "dynamic"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m corral inventory jaguar --clusters {EXAMPLES} \"$@\"\n")
    script.chmod(0o755)
    for source in (static, script):
        result = subprocess.run(
            ["ansible-inventory", "-i", str(source), "--host", "gpu-070.sf1.internal"],
            capture_output=True, text=True, check=True,
        )
        host_vars = json.loads(result.stdout)
        assert host_vars["corral_pool"] == "gpu-h100-robotics"
        assert host_vars["corral_site"] == "sf1"
        assert host_vars["corral_cluster_name"] == "jaguar"

"""The inventory built from a cluster file, and how Ansible reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from corral.model import load_cluster
from corral.nodes.inventory import (
    UNSAFE_JSON_KEY,
    Unsafe,
    as_yaml_inventory,
    build,
    group_name,
    to_ansible_json,
    to_ansible_yaml,
)
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
    assert pool_vars["corral_nvidia_driver_version"] == "580.173.02"
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
    arp = jaguar.network.arp_cache
    assert [inv["all"]["vars"][f"corral_arp_gc_thresh{i}"] for i in (1, 2, 3)] == \
        [arp.gc_thresh1, arp.gc_thresh2, arp.gc_thresh3]
    # containerd and its sandbox image come from the model, as on cloud nodes.
    assert inv["all"]["vars"]["corral_containerd_version"] == jaguar.kubernetes.containerd == "2.3.6"
    assert inv["all"]["vars"]["corral_containerd_sandbox_image"] == "registry.k8s.io/pause:3.10.2"
    assert inv["all"]["vars"]["corral_flannel_direct_routing"] is True
    assert inv["site_sf1"]["vars"]["corral_apt_mirror"] == "http://mirror.sf1.internal"


def test_ansible_reads_the_yaml_and_the_dynamic_inventory(jaguar, tmp_path):
    static = tmp_path / "inventory.yaml"
    static.write_text(to_ansible_yaml(as_yaml_inventory(build(jaguar))))
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
        # How Ansible reaches it: the site's ssh user, key file and host key checking,
        # the host's own options (its key looked up under its name).
        assert host_vars["ansible_user"] == "corral" and host_vars["ansible_host_key_checking"] is True
        assert host_vars["ansible_ssh_private_key_file"] == "~/.ssh/corral_sf1"
        assert "-o HostKeyAlias=gpu-070.sf1.internal" in host_vars["ansible_ssh_common_args"]
        assert "StrictHostKeyChecking=yes" in host_vars["ansible_ssh_common_args"]



# --- values are never templated by Ansible -------------------------------------


def _strings(value, path=()):
    """(path, string) for every string value (not key) in `value`."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*path, index))


def test_every_variable_string_is_marked_unsafe(jaguar):
    inv = build(jaguar)
    found = [(group, path, value) for group, body in inv.items() if "vars" in body
             for path, value in _strings(body["vars"])]
    assert len(found) > 20
    assert all(isinstance(value, Unsafe) for _, _, value in found), [
        (g, p) for g, p, v in found if not isinstance(v, Unsafe)]
    # JSON: no plain string is left among the variables; each is Ansible's unsafe mark.
    marked = to_ansible_json(inv)
    for group, body in marked.items():
        for path, value in _strings(body.get("vars", {})):
            assert path[-1] == UNSAFE_JSON_KEY, (group, path, value)
    yaml_text = to_ansible_yaml(as_yaml_inventory(inv))
    assert "corral_apt_mirror: !unsafe http://mirror.sf1.internal\n" in yaml_text


def test_the_cli_prints_the_unsafe_marks(tmp_path):
    listed = subprocess.run(
        [sys.executable, "-m", "corral", "inventory", "jaguar", "--list", "--clusters", str(EXAMPLES)],
        capture_output=True, text=True, check=True,
    )
    site = json.loads(listed.stdout)["site_sf1"]["vars"]
    assert site["corral_apt_mirror"] == {UNSAFE_JSON_KEY: "http://mirror.sf1.internal"}
    plain = subprocess.run(
        [sys.executable, "-m", "corral", "inventory", "jaguar", "--clusters", str(EXAMPLES)],
        capture_output=True, text=True, check=True,
    )
    assert "corral_site: !unsafe sf1\n" in plain.stdout


PROBE_PLAYBOOK = """\
- name: Probe
  hosts: gpu-001.sf1.internal
  gather_facts: false
  tasks:
    - name: Template the mirror in a message
      ansible.builtin.debug:
        msg: "mirror={{ corral_apt_mirror }}"
    - name: Write it to a file
      ansible.builtin.copy:
        content: "{{ corral_apt_mirror }}"
        dest: "{{ probe_out }}"
        mode: "0600"
"""


@pytest.mark.parametrize("form", ["runner-json", "yaml", "dynamic", "control-without-marks"])
def test_a_template_that_reached_the_variables_is_never_evaluated(jaguar, tmp_path, form):
    """A real ansible-playbook run (connection local): the value stays text, nothing runs.

    The model refuses such a value; the cluster is edited behind its back to
    prove the inventory's own protection. The control run without the marks
    shows the probe does detect evaluation.
    """
    marker = tmp_path / "evaluated"
    cluster = jaguar.model_copy(deep=True)
    hostile = f"{{{{ lookup('pipe', 'touch {marker}') }}}}"
    cluster.sites[0].apt_mirror = hostile  # no validation on assignment: "somehow"
    data = as_yaml_inventory(build(cluster))
    if form == "runner-json":  # what corral join hands ansible-runner (written as hosts.json)
        source = tmp_path / "hosts.json"
        source.write_text(json.dumps(to_ansible_json(data)))
    elif form == "yaml":
        source = tmp_path / "inventory.yaml"
        source.write_text(to_ansible_yaml(data))
    elif form == "dynamic":
        listing = tmp_path / "list.json"
        listing.write_text(json.dumps(to_ansible_json(build(cluster))))
        source = tmp_path / "dynamic"
        source.write_text(f"#!/bin/sh\n[ \"$1\" = --list ] && exec cat {listing}\necho '{{}}'\n")
        source.chmod(0o755)
    else:
        source = tmp_path / "hosts.json"
        source.write_text(json.dumps(data))
    playbook = tmp_path / "probe.yml"
    playbook.write_text(PROBE_PLAYBOOK)
    out = tmp_path / "out.txt"
    result = subprocess.run(
        ["ansible-playbook", "-i", str(source), str(playbook),
         "-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}",
         # The site's login (jaguar: corral) becomes root through sudo on a real host; here, on this
         # machine as whoever runs the tests, no privilege is needed and out.txt must stay ours.
         "-e", "ansible_become=false", "-e", f"probe_out={out}"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "0"},
    )
    if form == "control-without-marks":
        assert marker.exists(), "the probe did not detect evaluation: the test proves nothing"
        return
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not marker.exists(), "Ansible evaluated an inventory value"
    assert out.read_text() == hostile
    assert f"mirror={hostile}" in result.stdout

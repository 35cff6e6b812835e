"""Round-trip editing of cluster files: only the lines an edit must touch change."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from corral.model import ValidationFailed
from corral.model.edit import (
    EditError,
    add_pool,
    detect_style,
    new_cluster_text,
    pool_document,
    remove_pool,
    reserve_pool,
    update_pool,
    validate_edit,
)
from corral.model.loader import load_fleet

EXAMPLES = Path(__file__).resolve().parents[2] / "clusters"

# One new pool per example cluster, valid there.
NEW_POOLS = {
    "jaguar": pool_document(
        "onprem", "gpu-h200-sf1", site="sf1", hosts=["gpu-[101:116].sf1.internal"],
        gpu={"model": "H200", "count": 8, "driver": "570.86.15", "fabric_manager": True},
        roce={"interfaces": ["ens1f0np0", "ens1f1np1"], "mtu": 9000}, labels={"corral.dev/rack": "r20"},
    ),
    "heron": pool_document(
        "aws", "gpu-a10", machine_type="g5.12xlarge", zones=["us-west-2a"], min_size=0, max_size=20,
        spot=True, labels={"corral.dev/tier": "batch"}, taints=["corral.dev/spot=true:NoSchedule"],
    ),
    "ibis": pool_document(
        "gcp", "gpu-h100", machine_type="a3-highgpu-8g", zones=["us-central1-a"],
        gpu={"model": "H100", "count": 8}, max_size=8, disk_size_gib=500,
    ),
}


def example(name: str) -> str:
    return (EXAMPLES / f"{name}.yaml").read_text()


def changed_lines(old: str, new: str) -> tuple[list[str], list[str]]:
    """(removed lines, added lines) of a line diff."""
    removed, added = [], []
    for line in difflib.ndiff(old.splitlines(), new.splitlines()):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    return removed, added


@pytest.mark.parametrize("name", sorted(NEW_POOLS))
def test_add_keeps_every_other_byte(name, fleet_dir):
    old = example(name)
    new = add_pool(old, NEW_POOLS[name])
    # Pure insertion: the old text is a prefix-and-suffix split of the new one.
    removed, _ = changed_lines(old, new)
    assert removed == []
    assert new.startswith(old.rstrip("\n")) or old in new
    # Every original line is still there, in order, byte for byte.
    matcher = difflib.SequenceMatcher(a=old.splitlines(keepends=True), b=new.splitlines(keepends=True), autojunk=False)
    kept = sum(block.size for block in matcher.get_matching_blocks())
    assert kept == len(old.splitlines())
    # The result validates with the fleet.
    validate_edit(fleet_dir / f"{name}.yaml", new)


@pytest.mark.parametrize("name", sorted(NEW_POOLS))
def test_add_then_remove_gives_the_original(name):
    old = example(name)
    assert remove_pool(add_pool(old, NEW_POOLS[name]), NEW_POOLS[name]["name"]) == old


def test_new_pool_follows_the_file_style():
    new = add_pool(example("jaguar"), NEW_POOLS["jaguar"])
    tail = new[len(example("jaguar")):]
    # A blank line between pools, same indentation, flow maps as the siblings,
    # the driver quoted like the other pools' drivers, host patterns quoted.
    assert tail == (
        "\n"
        "  - name: gpu-h200-sf1\n"
        "    provider: onprem\n"
        "    site: sf1\n"
        '    hosts: ["gpu-[101:116].sf1.internal"]\n'
        '    gpu: {model: H200, count: 8, driver: "570.86.15", fabricManager: true}\n'
        "    roce: {interfaces: [ens1f0np0, ens1f1np1], mtu: 9000}\n"
        "    labels: {corral.dev/rack: r20}\n"
    )


def test_key_order_follows_sibling_pools():
    new = add_pool(example("ibis"), NEW_POOLS["ibis"])
    keys = [line.strip().split(":")[0].lstrip("- ") for line in new[len(example("ibis")):].strip().splitlines()]
    # ibis writes name, provider, machineType, zones, gpu, minSize, maxSize (diskSizeGiB slotted after).
    assert keys == ["name", "provider", "machineType", "zones", "gpu", "maxSize", "diskSizeGiB"]


BLOCK_STYLE = """\
# A block-style file, four-space indentation, list dashes at the key's column.
apiVersion: corral.dev/v1
kind: Cluster
name: kite
kubernetes:
    version: '1.31.4'
    podCIDR: 10.140.0.0/14
    serviceCIDR: 10.99.0.0/16
controlPlane:
    cloud: aws
    region: us-east-1
    zones:
    - us-east-1a
    - us-east-1b
    networkCIDR: 10.203.0.0/20
    apiServers:
        machineType: m7i.2xlarge
    etcd:
        members: 3
        machineType: r7i.xlarge
scheduling:
    teams:
    -   name: ml
        namespaces:
        - ml
health:
    burnIn:
        ncclMinBusGBps:
            L4: 0
nodePools:
-   name: cpu
    provider: aws
    machineType: m7i.8xlarge
    zones:
    - us-east-1a
    maxSize: 10
    labels:
        corral.dev/tier: cpu
    # trailing comment of the cpu pool
-   name: gpu
    provider: aws
    machineType: p5.48xlarge
    gpu:
        model: H100
        count: 8
    maxSize: 4
"""


def test_block_style_file(tmp_path):
    pool = pool_document("aws", "gpu-l4", machine_type="g6.12xlarge", zones=["us-east-1b"],
                         gpu={"model": "L4", "count": 4}, max_size=6, labels={"corral.dev/tier": "l4"})
    new = add_pool(BLOCK_STYLE, pool, reserved_for="ml")
    assert new.endswith(
        "-   name: gpu-l4\n"
        "    provider: aws\n"
        "    machineType: g6.12xlarge\n"
        "    zones:\n"
        "    - us-east-1b\n"
        "    gpu:\n"
        "        model: L4\n"
        "        count: 4\n"
        "    maxSize: 6\n"
        "    labels:\n"
        "        corral.dev/tier: l4\n"
    )
    assert "        namespaces:\n        - ml\n        reservedPools:\n        - gpu-l4\n" in new
    path = tmp_path / "kite.yaml"
    validate_edit(path, new)
    # Removing the middle pool keeps the neighbours and the comments around them intact.
    removed = remove_pool(BLOCK_STYLE, "cpu")
    assert "-   name: cpu" not in removed and "trailing comment of the cpu pool" not in removed
    assert removed.startswith(BLOCK_STYLE.split("nodePools:\n")[0] + "nodePools:\n-   name: gpu\n")


def test_empty_flow_pool_list_becomes_a_block_list():
    text = new_cluster_text("kite", "aws", "us-east-1", {})
    assert "nodePools: []" in text
    new = add_pool(text, pool_document("aws", "cpu", machine_type="m7i.8xlarge", max_size=3))
    assert "nodePools:\n  - name: cpu\n" in new
    assert remove_pool(new, "cpu").endswith("nodePools: []\n")


def test_flow_pool_list_gets_a_flow_item():
    text = BLOCK_STYLE.split("nodePools:")[0] + "nodePools: [{name: cpu, provider: aws, machineType: m7i.8xlarge, maxSize: 1}]\n"
    new = add_pool(text, pool_document("aws", "more", machine_type="m7i.4xlarge", max_size=2))
    assert new.endswith("maxSize: 1}, {name: more, provider: aws, machineType: m7i.4xlarge, maxSize: 2}]\n")
    assert remove_pool(new, "more") == text


def test_file_without_final_newline_round_trips():
    text = example("heron").rstrip("\n")
    new = add_pool(text, NEW_POOLS["heron"])
    assert remove_pool(new, "gpu-a10") == text


def test_remove_first_and_middle_pool_of_example():
    old = example("jaguar")
    first = remove_pool(old, "gpu-h100-sf1")
    assert "nodePools:\n  # Eight machines the robotics team" in first
    removed, added = changed_lines(old, first)
    assert added == [] and all(("sf1" in l or "r12" in l or l.strip() in ("", "taints: []") or "onprem" in l
                                or "H100" in l or "interfaces" in l or l.strip().startswith("#")) for l in removed)
    middle = remove_pool(example("heron"), "gpu-a10g")
    assert "gpu-a10g\n" not in middle and "  - name: gpu-a10g-inference" in middle
    assert "maxSize: 300\n\n  - name: gpu-a10g-inference" in middle


def test_remove_refused_while_a_team_reserves_it():
    with pytest.raises(EditError, match="reserved by team robotics"):
        remove_pool(example("jaguar"), "gpu-h100-robotics")


def test_reserve_appends_to_flow_list():
    new = reserve_pool(add_pool(example("jaguar"), NEW_POOLS["jaguar"]), "robotics", "gpu-h200-sf1")
    assert "reservedPools: [gpu-h100-robotics, gpu-h200-sf1]}" in new
    with pytest.raises(EditError, match="no team 'nobody'.*teams: robotics"):
        reserve_pool(example("jaguar"), "nobody", "gpu-h100-sf1")


def test_reserve_adds_the_key_when_missing():
    text = example("jaguar").replace(", reservedPools: [gpu-h100-robotics]", "")
    new = reserve_pool(text, "robotics", "cpu-d64")
    assert "- {name: robotics, namespaces: [robotics], reservedPools: [cpu-d64]}" in new


def test_update_keeps_styles():
    new = update_pool(example("jaguar"), "gpu-h100-sf1", {"hosts": ["gpu-[001:060].sf1.internal", "gpu-099.sf1.internal"]})
    removed, added = changed_lines(example("jaguar"), new)
    assert removed == ['    hosts: ["gpu-[001:064].sf1.internal"]']
    assert added == ['    hosts: ["gpu-[001:060].sf1.internal", "gpu-099.sf1.internal"]']
    new = update_pool(example("heron"), "cpu-m7i", {"minSize": 2, "maxSize": 500})
    assert changed_lines(example("heron"), new) == (["    minSize: 0", "    maxSize: 300"], ["    minSize: 2", "    maxSize: 500"])
    # A key the pool does not have is added after its canonical predecessor.
    new = update_pool(example("ibis"), "gpu-l4", {"spot": True})
    assert changed_lines(example("ibis"), new) == ([], ["    spot: true"])


def test_validation_reports_the_edited_file(fleet_dir):
    bad = add_pool(example("heron"), pool_document("aws", "oops", machine_type="Standard_D4s_v5", max_size=1))
    with pytest.raises(ValidationFailed) as failed:
        validate_edit(fleet_dir / "heron.yaml", bad)
    [problem] = failed.value.problems
    assert problem.file.endswith("heron.yaml (after the edit)")
    assert problem.field_path == "nodePools[3].machineType"
    assert bad.splitlines()[problem.line - 1].strip().startswith("machineType: Standard_D4s_v5")


def test_fleet_rules_apply_to_the_edit(fleet_dir):
    # A host that another cluster owns: the fleet rule blames the edit.
    other = fleet_dir / "kite.yaml"
    text = example("jaguar").replace("name: jaguar", "name: kite", 1).replace("sf1", "sf2")
    text = text.replace("gpu-[001:064].sf2.internal", "gpu-[001:002].sf1.internal")
    text = text.replace('\n    racks: ["sf2-r[01:08]"]', "")  # 8 racks do not divide 2 hosts
    for old, new in (("10.128.0.0/14", "10.140.0.0/14"), ("10.96.0.0/16", "10.99.0.0/16"),
                     ("10.200.0.0/20", "10.203.0.0/20"), ("10.50.0.0/16", "10.51.0.0/16")):
        text = text.replace(old, new)
    with pytest.raises(ValidationFailed, match="also in cluster"):
        validate_edit(other, text)


def test_new_cluster_is_valid_and_avoids_the_fleet(fleet_dir):
    fleet = load_fleet([fleet_dir]).clusters
    for cloud, region in (("azure", "westus3"), ("aws", "eu-west-1"), ("gcp", "europe-west4")):
        text = new_cluster_text("kite", cloud, region, fleet)
        cluster = validate_edit(fleet_dir / "kite.yaml", text)
        assert cluster.control_plane.cloud == cloud
        assert cluster.control_plane.network_cidr == "10.203.0.0/20"
        assert cluster.kubernetes.pod_cidr == "10.140.0.0/14"
        assert cluster.kubernetes.service_cidr == "10.99.0.0/16"
    with pytest.raises(EditError, match="overlaps cluster jaguar"):
        new_cluster_text("kite", "aws", "eu-west-1", fleet, network_cidr="10.200.0.0/22")


def test_style_detection():
    style = detect_style(BLOCK_STYLE)
    assert (style.map_indent, style.seq_offset, style.item_key_gap, style.quote) == (4, 0, 4, "'")
    assert not style.leaf_map_flow and not style.leaf_seq_flow
    style = detect_style(example("jaguar"))
    assert (style.map_indent, style.seq_offset, style.item_key_gap, style.quote) == (2, 2, 2, '"')
    assert style.leaf_map_flow and style.leaf_seq_flow and style.blank_between_items

"""Every validation rule of the cluster model, one or more cases each.

Each case edits one example file and checks the exact report line: the file,
the line a reviewer must change, the field path and the message.
"""

from __future__ import annotations

import pytest

from .helpers import example, line_of, problems, variant


def test_example_fleet_is_valid(tmp_path):
    files = {f"{n}.yaml": example(n) for n in ("heron", "ibis", "jaguar")}
    assert problems(tmp_path, files) == []


def only(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


# --- YAML and schema --------------------------------------------------------


def test_yaml_syntax_error_names_line(tmp_path):
    found = only(variant(tmp_path, "jaguar", "  region: eastus2\n", "  region: [eastus2\n"))
    assert found.startswith("jaguar.yaml:")
    assert "YAML syntax error" in found


def test_unknown_key_suggests_the_right_one(tmp_path):
    found = only(variant(tmp_path, "jaguar", "    members: 5", "    memebrs: 5"))
    line = line_of("jaguar", "members: 5")
    assert found.startswith(f"jaguar.yaml:{line}:5: controlPlane.etcd.memebrs: unknown key 'memebrs'")
    assert "did you mean 'members'?" in found


def test_unknown_key_in_a_pool_suggests_within_that_pool_kind(tmp_path):
    found = variant(tmp_path, "heron", "    machineType: m7i.16xlarge", "    machinetype: m7i.16xlarge")
    assert any("nodePools[0].machinetype: unknown key" in f and "did you mean 'machineType'" in f for f in found)


def test_duplicate_key(tmp_path):
    found = only(variant(tmp_path, "heron", "name: heron\n", "name: heron\nname: heron\n"))
    assert "duplicate key" in found.lower()


def test_wrong_type_names_field_and_line(tmp_path):
    found = only(variant(tmp_path, "heron", "    members: 3", "    members: three"))
    line = line_of("heron", "members: 3")
    assert found.startswith(f"heron.yaml:{line}:5: controlPlane.etcd.members: ")
    assert "integer" in found


def test_unquoted_version_hints_at_quotes(tmp_path):
    found = only(variant(tmp_path, "heron", 'version: "1.35.9"', "version: 1.35"))
    assert "kubernetes.version: must be a string: put the value in quotes" in found


def test_missing_required_field(tmp_path):
    found = only(variant(tmp_path, "ibis", "  region: us-central1\n", ""))
    assert "controlPlane.region: required field is missing" in found
    assert found.startswith(f"ibis.yaml:{line_of('ibis', 'controlPlane:')}:")


def test_unknown_provider(tmp_path):
    found = only(variant(tmp_path, "heron", "    provider: aws\n    machineType: m7i.16xlarge",
                         "    provider: ec2\n    machineType: m7i.16xlarge"))
    assert "nodePools[0]" in found and "provider must be one of onprem, azure, aws, gcp" in found


def test_not_a_mapping(tmp_path):
    assert only(problems(tmp_path, {"x.yaml": "- just\n- a list\n"})).endswith("a cluster file must be a YAML mapping")


# --- names -------------------------------------------------------------------


def test_file_name_must_match_name(tmp_path):
    found = only(problems(tmp_path, {"kestrel.yaml": example("heron")}))
    assert found.startswith(f"kestrel.yaml:{line_of('heron', 'name: heron')}:1: name: ")
    assert "differs from the file name" in found


def test_two_clusters_with_one_name(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "heron.yaml").write_text(example("heron"))
    (tmp_path / "b" / "heron.yaml").write_text(example("heron"))
    from corral.model import ValidationFailed, load_fleet

    with pytest.raises(ValidationFailed) as failed:
        load_fleet([tmp_path / "a", tmp_path / "b"])
    assert any("also defined in" in str(p) for p in failed.value.problems)


# --- etcd ---------------------------------------------------------------------


@pytest.mark.parametrize("members", [2, 4, 1, 9])
def test_etcd_members_odd_3_to_7(tmp_path, members):
    found = only(variant(tmp_path, "jaguar", "members: 5 ", f"members: {members} "))
    assert "controlPlane.etcd.members: etcd needs an odd number of members from 3 to 7" in found


def test_disk_type_of_another_cloud(tmp_path):
    found = only(variant(tmp_path, "heron", "type: io2", "type: PremiumV2_LRS"))
    assert "controlPlane.etcd.disk.type: 'PremiumV2_LRS' is not a provisioned-IOPS disk type on aws" in found
    assert "io2" in found


def test_iops_above_the_type_range(tmp_path):
    found = only(variant(tmp_path, "jaguar", "iops: 20000", "iops: 90000"))
    assert "controlPlane.etcd.disk.iops: PremiumV2_LRS takes 3,000 to 80,000 IOPS, not 90,000" in found


def test_iops_per_gib(tmp_path):
    found = only(variant(tmp_path, "heron", "sizeGiB: 256, iops: 12000", "sizeGiB: 10, iops: 12000"))
    assert "at most 1000 IOPS per GiB" in found


def test_throughput_on_a_type_that_takes_none(tmp_path):
    found = only(variant(tmp_path, "heron", "iops: 12000}", "iops: 12000, throughputMBps: 500}"))
    assert "controlPlane.etcd.disk.throughputMBps: io2 takes no throughput setting" in found


def test_throughput_out_of_range(tmp_path):
    found = only(variant(tmp_path, "ibis", "throughputMBps: 400", "throughputMBps: 5000"))
    assert "hyperdisk-balanced takes 140 to 2,400 MB/s" in found


def test_iops_floor_for_a_large_cluster(tmp_path):
    text = example("jaguar").replace("iops: 20000", "iops: 4000").replace(
        "throughputMBps: 600", "throughputMBps: 500").replace("gpu-[001:064]", "gpu-[0001:3000]").replace(
        "podCIDR: 10.128.0.0/14", "podCIDR: 10.128.0.0/12")
    found = only(problems(tmp_path, {"jaguar.yaml": text}))
    assert "4,000 IOPS is too few for etcd in a cluster of up to 3,208 nodes; provision at least 10,000" in found


def test_defaults_fill_disk_from_type(tmp_path):
    from corral.model import load_cluster

    text = example("heron").replace("disk: {type: io2, sizeGiB: 256, iops: 12000}", "disk: {type: gp3}")
    (tmp_path / "heron.yaml").write_text(text)
    disk = load_cluster(tmp_path / "heron.yaml").control_plane.etcd.disk
    assert (disk.iops, disk.throughput_mbps) == (3000, 125)


# --- networks -----------------------------------------------------------------


def test_pod_and_service_cidrs_overlap(tmp_path):
    found = only(variant(tmp_path, "heron", "serviceCIDR: 10.97.0.0/16", "serviceCIDR: 10.133.0.0/16"))
    assert "kubernetes.serviceCIDR: 10.133.0.0/16 overlaps the pod network 10.132.0.0/14" in found


def test_site_overlaps_control_plane_network(tmp_path):
    found = only(variant(tmp_path, "jaguar", "cidrs: [10.50.0.0/16]", "cidrs: [10.200.8.0/22]"))
    assert "sites[0].cidrs[0]: 10.200.8.0/22 overlaps the control plane's network" in found


def test_not_a_cidr(tmp_path):
    found = only(variant(tmp_path, "jaguar", "cidrs: [10.50.0.0/16]", "cidrs: [10.50.0.1/16]"))
    assert "sites[0].cidrs[0]:" in found and "not a network in CIDR form" in found


def test_control_plane_network_too_small(tmp_path):
    found = only(variant(tmp_path, "ibis", "networkCIDR: 10.202.0.0/20", "networkCIDR: 10.202.0.0/24"))
    assert "controlPlane.networkCIDR: 10.202.0.0/24 is too small" in found


# --- pools ----------------------------------------------------------------------


def test_duplicate_pool_names(tmp_path):
    found = only(variant(tmp_path, "ibis", "name: gpu-l4", "name: cpu-n2"))
    assert "nodePools[2].name: pool 'cpu-n2' is defined twice" in found


def test_pool_on_another_cloud(tmp_path):
    found = only(variant(tmp_path, "jaguar", "provider: azure", "provider: aws"))
    assert "nodePools[2].provider: pool on aws, but the control plane is on azure" in found


def test_onprem_pool_unknown_site(tmp_path):
    found = only(variant(tmp_path, "jaguar", "site: sf1\n    hosts: [\"gpu-[001", "site: sf2\n    hosts: [\"gpu-[001"))
    assert "nodePools[0].site: unknown site 'sf2' (sites: sf1)" in found


def test_onprem_pool_site_without_vpn(tmp_path):
    found = variant(tmp_path, "jaguar", "    vpn: {peerAddress: 203.0.113.10, bgpASN: 65010}\n", "")
    assert len(found) == 2 and all("site 'sf1' has no vpn" in f for f in found)


def test_same_host_in_two_pools(tmp_path):
    found = only(variant(tmp_path, "jaguar", "gpu-[065:072]", "gpu-[064:072]"))
    assert "nodePools[1].hosts[0]: host 'gpu-064.sf1.internal' is already in pool 'gpu-h100-sf1'" in found


def test_same_host_in_two_clusters(tmp_path):
    other = example("jaguar").replace("name: jaguar", "name: kestrel")
    found = problems(tmp_path, {"jaguar.yaml": example("jaguar"), "kestrel.yaml": other})
    assert any("kestrel.yaml" in f and "is also in cluster 'jaguar'" in f for f in found)


def test_min_above_max(tmp_path):
    found = only(variant(tmp_path, "heron", "minSize: 2\n    maxSize: 40", "minSize: 50\n    maxSize: 40"))
    assert "nodePools[2].minSize: minSize 50 is larger than maxSize 40" in found


@pytest.mark.parametrize(
    "name, old, new, message",
    [
        ("jaguar", 'zones: ["1", "2", "3"]\n  networkCIDR', 'zones: ["1", "4"]\n  networkCIDR',
         "'4' is not a zone of eastus2; its zones are 1, 2, 3"),
        ("heron", "zones: [us-west-2a, us-west-2b]", "zones: [us-east-1a, us-west-2b]",
         "'us-east-1a' is not a zone of us-west-2 (it is a zone of us-east-1)"),
        ("ibis", "zones: [us-central1-a, us-central1-c]", "zones: [us-central1a]",
         "'us-central1a' is not a zone of us-central1; its zones are us-central1-a"),
    ],
)
def test_zones_valid_for_the_cloud(tmp_path, name, old, new, message):
    assert any(message in f for f in variant(tmp_path, name, old, new))


def test_bad_host_range(tmp_path):
    found = only(variant(tmp_path, "jaguar", "gpu-[001:064]", "gpu-[064:001]"))
    assert "nodePools[0].hosts[0]: range '[064:001]'" in found and "runs backwards" in found


def test_hosts_expand():
    from corral.model.hosts import expand

    assert expand("gpu-[001:003].sf1") == ["gpu-001.sf1", "gpu-002.sf1", "gpu-003.sf1"]
    assert expand("r[1:2]-n[8:9]") == ["r1-n8", "r1-n9", "r2-n8", "r2-n9"]


# --- labels, taints, GPUs, RoCE, network ---------------------------------------


def test_label_key_kubernetes_rejects(tmp_path):
    found = only(variant(tmp_path, "jaguar", "labels: {corral.dev/fabric: sf1-roce}", "labels: {Corral.dev/fabric: sf1-roce}"))
    assert "nodePools[0].labels.Corral.dev/fabric" in found and "DNS subdomain" in found


def test_label_value_kubernetes_rejects(tmp_path):
    found = only(variant(tmp_path, "jaguar", "labels: {corral.dev/fabric: sf1-roce}", "labels: {corral.dev/fabric: 'sf1 roce'}"))
    assert "nodePools[0].labels.corral.dev/fabric" in found and "label value 'sf1 roce'" in found


def test_taint_effect(tmp_path):
    found = only(variant(tmp_path, "ibis", "preemptible=true:NoSchedule", "preemptible=true:Never"))
    assert "nodePools[1].taints[0].effect" in found and "NoSchedule" in found


def test_taint_without_effect(tmp_path):
    found = only(variant(tmp_path, "ibis", "corral.dev/preemptible=true:NoSchedule", "corral.dev/preemptible"))
    assert "nodePools[1].taints[0]" in found and "key=value:Effect" in found


@pytest.mark.parametrize("count", [0, 17])
def test_gpu_count(tmp_path, count):
    found = only(variant(tmp_path, "heron", "gpu: {model: A10G, count: 4}", f"gpu: {{model: A10G, count: {count}}}"))
    assert "nodePools[1].gpu.count" in found


def test_pfc_priority(tmp_path):
    found = only(variant(tmp_path, "jaguar", "pfcPriority: 3", "pfcPriority: 8"))
    assert "nodePools[0].roce.pfcPriority: must be less than or equal to 7" in found


def test_dscp(tmp_path):
    found = only(variant(tmp_path, "jaguar", "dscp: 26", "dscp: 64"))
    assert "nodePools[0].roce.dscp: must be less than or equal to 63" in found


def jaguar_with_arp_cache(thresholds: str) -> str:
    """jaguar with an explicit network.arpCache (the example leaves it to corral)."""
    flannel = "  flannel: {backend: vxlan, directRouting: true, mtu: 1350}\n"
    return example("jaguar").replace(flannel, f"{flannel}  arpCache: {{{thresholds}}}\n")


def test_arp_thresholds_ascend(tmp_path):
    text = jaguar_with_arp_cache("gcThresh1: 700, gcThresh2: 500, gcThresh3: 100000")
    found = only(problems(tmp_path, {"jaguar.yaml": text}))
    assert "network.arpCache.gcThresh2: ARP thresholds must ascend" in found


def test_direct_routing_needs_vxlan(tmp_path):
    # (host-gw has its own rule: tests/model/test_flannel_backend.py)
    # WireGuard's 80 bytes need a smaller MTU than VXLAN's 50 (tests/model/test_mtu.py).
    text = example("jaguar").replace("backend: vxlan", "backend: wireguard").replace("mtu: 1350", "mtu: 1320")
    found = only(problems(tmp_path, {"jaguar.yaml": text}))
    assert "network.flannel.directRouting: directRouting is a vxlan option; backend is wireguard" in found


def test_arp_defaults_from_cluster_size(tmp_path):
    from corral.model import load_cluster

    text = example("jaguar")
    assert "arpCache" not in text.split("scheduling:")[0].replace("# ", "")  # sized by corral
    (tmp_path / "jaguar.yaml").write_text(text)
    small = load_cluster(tmp_path / "jaguar.yaml")
    (tmp_path / "jaguar.yaml").write_text(
        text.replace("gpu-[001:064]", "gpu-[0001:7000]").replace("podCIDR: 10.128.0.0/14", "podCIDR: 10.128.0.0/11"))
    large = load_cluster(tmp_path / "jaguar.yaml")
    arp = small.network.arp_cache
    assert arp.gc_thresh3 == 8192 and arp.gc_thresh1 < arp.gc_thresh2 < arp.gc_thresh3
    # gc_thresh1 is what the kernel never purges: the working set (every
    # node and a node's pods) rounded up to a power of two, not a fixed share
    # of the limit.
    assert small.node_capacity + 110 <= arp.gc_thresh1 < 2 * (small.node_capacity + 110)
    assert arp.gc_thresh1 & (arp.gc_thresh1 - 1) == 0
    big = large.network.arp_cache
    assert (big.gc_thresh2, big.gc_thresh3) == (90000, 100000)
    assert large.node_capacity + 110 <= big.gc_thresh1 < 80000
    # A pool resize within the same power of two leaves every node's sysctls alone.
    resized = load_cluster_text(tmp_path, text.replace("maxSize: 200", "maxSize: 240"))
    assert resized.node_capacity != small.node_capacity
    assert resized.network.arp_cache == arp


def load_cluster_text(tmp_path, text: str):
    """jaguar's text loaded from a folder of its own (the file is named after the cluster)."""
    from corral.model import load_cluster

    folder = tmp_path / f"variant-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / "jaguar.yaml").write_text(text)
    return load_cluster(folder / "jaguar.yaml")


def test_a_gc_thresh1_that_keeps_stale_entries_is_refused(tmp_path):
    text = jaguar_with_arp_cache("gcThresh1: 80000, gcThresh2: 90000, gcThresh3: 100000")
    found = only(problems(tmp_path, {"jaguar.yaml": text}))
    assert "network.arpCache.gcThresh1: gcThresh1 80,000 is the number of neighbour entries the kernel never purges" in found
    assert "use at most 764" in found
    ok = text.replace("gcThresh1: 80000", "gcThresh1: 700")
    assert problems(tmp_path, {"jaguar.yaml": ok}) == []


def test_team_reserving_unknown_pool(tmp_path):
    found = only(variant(tmp_path, "jaguar", "reservedPools: [gpu-h100-robotics]", "reservedPools: [gpu-h100-robot]"))
    assert "scheduling.teams[0].reservedPools[0]: no pool named 'gpu-h100-robot'" in found


def test_every_problem_in_one_run(tmp_path):
    text = (example("jaguar").replace("members: 5 ", "members: 4 ").replace("dscp: 26", "dscp: 99", 1)
            .replace("reservedPools: [gpu-h100-robotics]", "reservedPools: [nope]"))
    found = problems(tmp_path, {"jaguar.yaml": text, "heron.yaml": example("heron").replace("iops: 12000", "iops: 50")})
    # Schema errors stop a file before its rules run; the other file's rules still run.
    assert any("dscp" in f for f in found) and any("heron.yaml" in f and "iops" in f for f in found)


def test_gcp_disk_needs_a_machine_series_that_can_attach_it(tmp_path):
    found = only(variant(tmp_path, "ibis", "machineType: c3-highmem-8", "machineType: n2-highmem-8"))
    assert "controlPlane.etcd.machineType: n2-highmem-8 (N2 series) cannot attach hyperdisk-balanced" in found


def test_pool_zone_outside_the_control_plane_zones(tmp_path):
    text = example("heron").replace("zones: [us-west-2a, us-west-2b, us-west-2c]", "zones: [us-west-2a, us-west-2b]")
    found = only(problems(tmp_path, {"heron.yaml": text.replace("zones: [us-west-2a]\n", "zones: [us-west-2c]\n")}))
    assert "nodePools[1].zones[0]" not in found and "zone 'us-west-2c' is not one of the control plane's zones" in found


def test_pod_network_too_small_for_the_nodes(tmp_path):
    found = only(variant(tmp_path, "jaguar", "gpu-[001:064]", "gpu-[0001:2000]"))
    assert "kubernetes.podCIDR: 10.128.0.0/14 gives 1,024 nodes a /24 each" in found and "use a /12 or larger" in found


@pytest.mark.parametrize("pattern, message", [
    ("gpu-[1:99999999]", "expands to 99999999 hosts"),
    ("GPU-[1:3]", "'GPU-1' is not a valid host name"),
    ("gpu-[001:064.sf1", "unclosed '['"),
])
def test_bad_host_patterns_are_reported_not_raised(tmp_path, pattern, message):
    found = only(variant(tmp_path, "jaguar", "gpu-[001:064].sf1.internal", pattern))
    assert "nodePools[0].hosts[0]" in found and message in found


def test_absurd_etcd_member_count_is_refused_quickly(tmp_path):
    found = only(variant(tmp_path, "jaguar", "members: 5 ", "members: 99999999999999999999 "))
    assert "controlPlane.etcd.members" in found


def test_pools_cannot_set_labels_corral_derives(tmp_path):
    found = only(variant(tmp_path, "jaguar", "labels: {corral.dev/fabric: sf1-roce}", "labels: {corral.dev/pool: other}"))
    assert "nodePools[0].labels.corral.dev/pool: 'corral.dev/pool' is set by corral" in found


def test_resizing_never_adds_an_events_etcd_cluster(tmp_path):
    from corral.model import load_cluster

    (tmp_path / "jaguar.yaml").write_text(example("jaguar").replace("maxSize: 200", "maxSize: 900"))
    assert load_cluster(tmp_path / "jaguar.yaml").control_plane.etcd.dedicated_events_cluster is False

"""Model rules for what an etcd member's VM can do with its data disk.

- GCE disk types that attach only to large shapes of a series (vCPU or GPU
  floors of Hyperdisk Extreme and pd-extreme), read from the machine type's
  name, custom types included.
- Per-VM disk caps (corral/model/vm_disk_limits.py): IOPS or throughput
  provisioned above what the VM sustains is an error naming both figures.
"""

from __future__ import annotations

import pytest

from corral.model.disks import attach_floor_error, gce_gpus, gce_vcpus
from corral.model.vm_disk_limits import AWS, AZURE, GCP_PD_EXTREME, vm_disk_caps

from .helpers import example, line_of, problems, variant

IBIS_ETCD = ("machineType: c3-highmem-8      # hyperdisk needs a C3/N4-class machine\n"
             "    disk: {type: hyperdisk-balanced, sizeGiB: 256, iops: 12000, throughputMBps: 400}")


def ibis_etcd(machine: str, disk: str) -> str:
    text = example("ibis")
    assert IBIS_ETCD in text
    return text.replace(IBIS_ETCD, f"machineType: {machine}\n    disk: {disk}")


def only(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


# --- reading the size from a GCE machine type name ------------------------------


@pytest.mark.parametrize("machine, vcpus", [
    ("n2-highmem-8", 8), ("c3-standard-88-lssd", 88), ("c3-standard-176-metal", 176),
    ("c4a-highmem-64-lssd", 64), ("m1-megamem-96", 96),
    ("n2-custom-8-65536", 8), ("n2-custom-80-524288-ext", 80), ("custom-4-4096", 4),
    ("e2-medium", None), ("a3-highgpu-8g", None),
])
def test_vcpus_from_the_machine_type_name(machine, vcpus):
    assert gce_vcpus(machine) == vcpus


def test_gpus_from_an_accelerator_shape():
    assert (gce_gpus("a3-highgpu-8g"), gce_gpus("a3-highgpu-2g"), gce_gpus("c3-highmem-8")) == (8, 2, None)


@pytest.mark.parametrize("disk, machine, fits", [
    ("hyperdisk-extreme", "c3-standard-88", True),
    ("hyperdisk-extreme", "c3-highmem-44", False),
    ("hyperdisk-extreme", "c3d-standard-60", True),
    ("hyperdisk-extreme", "c3d-highmem-30", False),
    ("hyperdisk-extreme", "m1-ultramem-80", True),
    ("hyperdisk-extreme", "m1-ultramem-40", False),
    ("hyperdisk-extreme", "c4a-highmem-64", True),
    ("hyperdisk-extreme", "m3-ultramem-32", False),
    ("hyperdisk-extreme", "n2-highmem-80", True),
    ("hyperdisk-extreme", "n2-custom-64-524288", False),
    ("hyperdisk-extreme", "a3-highgpu-8g", True),
    ("hyperdisk-extreme", "a3-highgpu-2g", False),
    ("pd-extreme", "n2-standard-64", True),
    ("pd-extreme", "n2-highmem-32", False),
    ("pd-extreme", "n2-custom-64-262144", True),
    ("pd-extreme", "m2-ultramem-208", True),
    # A name corral cannot read a size from passes: the cloud decides.
    ("hyperdisk-extreme", "c3-something", True),
])
def test_attach_floors(disk, machine, fits):
    assert (attach_floor_error(disk, machine) is None) == fits


def test_hyperdisk_extreme_on_a_small_n2_is_an_error_at_the_machine_type(tmp_path):
    text = ibis_etcd("n2-highmem-8", "{type: hyperdisk-extreme, sizeGiB: 256, iops: 12000}")
    found = only(problems(tmp_path, {"ibis.yaml": text}))
    line = text.splitlines().index("    machineType: n2-highmem-8") + 1
    assert found.startswith(f"ibis.yaml:{line}:")
    assert ("controlPlane.etcd.machineType: n2-highmem-8 has 8 vCPUs; hyperdisk-extreme attaches to N2 "
            "machines with at least 80 vCPUs") in found


def test_hyperdisk_extreme_on_c3_needs_88_vcpus(tmp_path):
    small = ibis_etcd("c3-highmem-44", "{type: hyperdisk-extreme, sizeGiB: 256, iops: 12000}")
    assert "C3 machines with at least 88 vCPUs" in only(problems(tmp_path, {"ibis.yaml": small}))
    large = ibis_etcd("c3-highmem-88", "{type: hyperdisk-extreme, sizeGiB: 256, iops: 12000}")
    assert problems(tmp_path, {"ibis.yaml": large}) == []


def test_pd_extreme_on_a_custom_n2_counts_its_vcpus(tmp_path):
    text = ibis_etcd("n2-custom-32-262144", "{type: pd-extreme, sizeGiB: 1000, iops: 15000}")
    found = only(problems(tmp_path, {"ibis.yaml": text}))
    assert "n2-custom-32-262144 has 32 vCPUs; pd-extreme attaches to N2 machines with at least 64 vCPUs" in found


# --- per-VM caps -----------------------------------------------------------------


def test_azure_throughput_above_the_vms_uncached_cap(tmp_path):
    found = only(variant(tmp_path, "jaguar", "throughputMBps: 600", "throughputMBps: 800"))
    assert found.startswith(f"jaguar.yaml:{line_of('jaguar', 'throughputMBps: 600')}:")
    assert ("controlPlane.etcd.disk.throughputMBps: 800 MB/s is more than Standard_E16s_v5 can use: "
            "it sustains 600 MB/s across its disks (bursts to 1,200 for at most 30 minutes)") in found


def test_azure_iops_above_the_vms_cap_on_a_smaller_machine(tmp_path):
    # E8s_v5: 12,800 IOPS and 290 MB/s uncached; jaguar provisions 20,000 IOPS and 600 MB/s.
    text = example("jaguar").replace("machineType: Standard_E16s_v5", "machineType: Standard_E8s_v5")
    both = problems(tmp_path, {"jaguar.yaml": text})
    assert len(both) == 2, both
    assert any("disk.iops: 20,000 IOPS is more than Standard_E8s_v5 can use: it sustains 12,800" in p for p in both)
    assert any("disk.throughputMBps: 600 MB/s is more than Standard_E8s_v5 can use: it sustains 290" in p
               for p in both)


def test_aws_iops_above_the_ebs_baseline(tmp_path):
    found = only(variant(tmp_path, "heron", "iops: 12000}", "iops: 16000}"))
    assert found.startswith(f"heron.yaml:{line_of('heron', 'iops: 12000}')}:")
    assert ("controlPlane.etcd.disk.iops: 16,000 IOPS is more than r7i.2xlarge can use: it sustains 12,000 "
            "IOPS across its disks (bursts to 40,000 for at most 30 minutes); provision at most 12,000") in found
    # A larger instance sustains it.
    assert problems(tmp_path, {"heron.yaml": example("heron").replace("iops: 12000}", "iops: 16000}").replace(
        "machineType: r7i.2xlarge", "machineType: r7i.4xlarge")}) == []


def test_gp3_throughput_above_a_small_instances_baseline(tmp_path):
    text = (example("heron").replace("disk: {type: io2, sizeGiB: 256, iops: 12000}",
                                     "disk: {type: gp3, sizeGiB: 256, iops: 6000, throughputMBps: 500}")
            .replace("machineType: r7i.2xlarge", "machineType: r7i.xlarge"))
    found = problems(tmp_path, {"heron.yaml": text})
    assert any("disk.throughputMBps: 500 MB/s is more than r7i.xlarge can use: it sustains 156.25 MB/s" in p
               for p in found), found
    assert not any("disk.iops" in p for p in found), found  # r7i.xlarge sustains 6,000 IOPS


def test_gcp_pd_extreme_above_an_m2s_cap(tmp_path):
    text = ibis_etcd("m2-ultramem-208", "{type: pd-extreme, sizeGiB: 1000, iops: 50000}")
    found = only(problems(tmp_path, {"ibis.yaml": text}))
    assert "disk.iops: 50,000 IOPS is more than m2-ultramem-208 can use: it sustains 40,000" in found


def test_one_problem_per_field_when_the_disk_itself_is_out_of_range(tmp_path):
    # 90,000 IOPS is beyond Premium SSD v2 itself: that is the problem to fix first.
    found = only(variant(tmp_path, "jaguar", "iops: 20000", "iops: 90000"))
    assert "PremiumV2_LRS takes 3,000 to 80,000 IOPS" in found


def test_unknown_machine_types_are_not_checked(tmp_path):
    # Standard_E16s_v6 is not in the table: no cap known, no error.
    assert vm_disk_caps("azure", "PremiumV2_LRS", "Standard_E16s_v6") is None
    text = example("jaguar").replace("machineType: Standard_E16s_v5", "machineType: Standard_E16s_v6").replace(
        "throughputMBps: 600", "throughputMBps: 1200")
    assert problems(tmp_path, {"jaguar.yaml": text}) == []


def test_caps_tables_are_consistent():
    for table in (AZURE, AWS, GCP_PD_EXTREME):
        for machine, (iops, mbps, burst_iops, burst_mbps) in table.items():
            assert 0 < iops <= burst_iops and 0 < mbps <= burst_mbps, machine
    # Spot checks against the vendors' pages (see the module docstring).
    assert AZURE["Standard_E8s_v5"] == (12_800, 290, 20_000, 1_200)
    assert AWS["m7i.8xlarge"] == (40_000, 1_250, 40_000, 1_250)
    assert AWS["r6i.2xlarge"][:2] == (12_000, 312.5)

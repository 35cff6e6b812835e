"""Provisioned-IOPS disk types corral puts etcd on, per cloud, with their limits.

Figures from the vendors' documentation (see ../shared/REFERENCE.md):
- AWS EBS volume types: gp3 3,000-16,000 IOPS, 125-1,000 MiB/s, at most
  500 IOPS/GiB and 0.25 MiB/s per IOPS; io1 100-64,000 IOPS at most 50 IOPS/GiB;
  io2 (Block Express) 100-256,000 IOPS at most 1,000 IOPS/GiB. Only gp3 takes
  a throughput setting.
  https://docs.aws.amazon.com/ebs/latest/userguide/ebs-volume-types.html
- Azure managed disks: Premium SSD v2 3,000-80,000 IOPS (500 IOPS/GiB above
  6 GiB), 125-1,200 MB/s (at most 0.25 MB/s per IOPS); Ultra Disk 100-400,000
  IOPS (300 IOPS/GiB), 1-10,000 MB/s. Both are data disks on zonal VMs only,
  with host caching None.
  https://learn.microsoft.com/azure/virtual-machines/disks-types
- GCP: pd-extreme 10,000-120,000 IOPS (no throughput setting, min 500 GiB);
  hyperdisk-extreme 2,500-350,000 IOPS (no throughput setting, min 64 GiB);
  hyperdisk-balanced 3,000-160,000 IOPS (500 IOPS/GiB) and 140-2,400 MiB/s.
  https://cloud.google.com/compute/docs/disks/hyperdisks
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Cloud = Literal["azure", "aws", "gcp"]


@dataclass(frozen=True)
class DiskType:
    cloud: Cloud
    name: str
    iops: tuple[int, int]
    # None: the type takes no throughput setting (it follows from IOPS).
    throughput_mbps: tuple[int, int] | None
    size_gib: tuple[int, int]
    max_iops_per_gib: int | None = None
    max_mbps_per_iops: float | None = None
    # What the cloud gives when throughput is not set (its baseline).
    default_throughput_mbps: int | None = None
    # GCP: the machine series (`c3` of `c3-highmem-8`) that can attach this
    # type; None where any machine of the cloud can.
    attach_series: frozenset[str] | None = None

    @property
    def takes_throughput(self) -> bool:
        return self.throughput_mbps is not None


# Compute Engine docs, "Machine series support" of each disk type: Hyperdisk
# Balanced only on the newer (Titanium) series, not N1, N2, N2D, E2, T2D, A2
# or G2; Hyperdisk Extreme and pd-extreme on large shapes of their series only
# (the vCPU/GPU floors are ATTACH_FLOORS below).
HYPERDISK_BALANCED_SERIES = frozenset(
    {"a3", "a4", "a4x", "c3", "c3d", "c4", "c4a", "c4d", "g4", "h3", "h4d", "m1", "m3", "m4", "n4", "n4a", "n4d", "x4", "z3"}
)
HYPERDISK_EXTREME_SERIES = frozenset({"a3", "c3", "c3d", "c4", "c4a", "c4d", "g4", "m1", "m2", "m3", "m4", "n2", "x4", "z3"})
PD_EXTREME_SERIES = frozenset({"m1", "m2", "m3", "n2"})


def machine_series(machine_type: str) -> str:
    """`c3` of `c3-highmem-8`."""
    return machine_type.split("-", 1)[0].lower()


# GCE machine type names: `SERIES-KIND-VCPUS[-lssd|-metal|...]`
# (c3-highmem-8, c3-standard-88-lssd), custom types `SERIES-custom-VCPUS-MEMMB[-ext]`
# (n2-custom-8-65536) or `custom-VCPUS-MEMMB` (N1), and accelerator shapes
# named by their GPU count (a2-highgpu-8g, a3-megagpu-8g).
_GCE_PREDEFINED = re.compile(r"[a-z][a-z0-9]*-[a-z]+-(?P<vcpus>\d+)(?:-[a-z]+)*\Z")
_GCE_CUSTOM = re.compile(r"(?:[a-z][a-z0-9]*-)?custom-(?P<vcpus>\d+)-\d+(?:-ext)?\Z")
_GCE_GPUS = re.compile(r"[a-z][a-z0-9]*-[a-z]+-(?P<gpus>\d+)g\Z")


def gce_vcpus(machine_type: str) -> int | None:
    """vCPUs of a GCE machine type, from its name; None when the name does not say
    (shared-core types like e2-medium, GPU shapes named by GPU count)."""
    name = machine_type.lower()
    match = _GCE_CUSTOM.match(name) or _GCE_PREDEFINED.match(name)
    return int(match["vcpus"]) if match else None


def gce_gpus(machine_type: str) -> int | None:
    """GPUs of an accelerator-optimized GCE shape (`a3-highgpu-8g`: 8)."""
    match = _GCE_GPUS.match(machine_type.lower())
    return int(match["gpus"]) if match else None


# The least shape per series that can attach a disk type, where the docs give
# one; a series listed in the type's attach_series but not here has no floor.
# - Hyperdisk Extreme, "Restrictions for machine series support": A3 at least
#   4 GPUs; C3 88 vCPUs; C3D 60; C4 96; G4 96; M1 80; C4A, C4D and M3 64; M4 112.
#   https://cloud.google.com/compute/docs/disks/hd-types/hyperdisk-extreme
#   N2 80 vCPUs is from the older page (N2 is no longer listed there; kept so
#   the large N2 shapes Google documented stay accepted).
# - pd-extreme: N2 with 64 or more vCPUs, M1, M2, M3.
#   https://cloud.google.com/compute/docs/disks/extreme-persistent-disk#machine_shape_support
ATTACH_FLOORS: dict[str, dict[str, tuple[int, str]]] = {
    "hyperdisk-extreme": {
        "a3": (4, "GPUs"), "c3": (88, "vCPUs"), "c3d": (60, "vCPUs"), "c4": (96, "vCPUs"),
        "g4": (96, "vCPUs"), "m1": (80, "vCPUs"), "c4a": (64, "vCPUs"), "c4d": (64, "vCPUs"),
        "m3": (64, "vCPUs"), "m4": (112, "vCPUs"), "n2": (80, "vCPUs"),
    },
    "pd-extreme": {"n2": (64, "vCPUs")},
}


def attach_floor_error(disk_type: str, machine_type: str) -> str | None:
    """Why `machine_type` is too small to attach `disk_type`, or None.

    A name corral cannot read a size from passes (the cloud decides)."""
    floor = ATTACH_FLOORS.get(disk_type, {}).get(machine_series(machine_type))
    if floor is None:
        return None
    least, unit = floor
    have = gce_gpus(machine_type) if unit == "GPUs" else gce_vcpus(machine_type)
    if have is None or have >= least:
        return None
    return (
        f"{machine_type} has {have} {unit}; {disk_type} attaches to "
        f"{machine_series(machine_type).upper()} machines with at least {least} {unit}"
    )


DISK_TYPES: dict[str, DiskType] = {
    d.name: d
    for d in (
        DiskType("azure", "PremiumV2_LRS", (3_000, 80_000), (125, 1_200), (1, 65_536),
                 max_iops_per_gib=500, max_mbps_per_iops=0.25, default_throughput_mbps=125),
        DiskType("azure", "UltraSSD_LRS", (100, 400_000), (1, 10_000), (4, 65_536),
                 max_iops_per_gib=300, default_throughput_mbps=None),
        DiskType("aws", "gp3", (3_000, 16_000), (125, 1_000), (1, 16_384),
                 max_iops_per_gib=500, max_mbps_per_iops=0.25, default_throughput_mbps=125),
        DiskType("aws", "io1", (100, 64_000), None, (4, 16_384), max_iops_per_gib=50),
        DiskType("aws", "io2", (100, 256_000), None, (4, 65_536), max_iops_per_gib=1_000),
        DiskType("gcp", "pd-extreme", (10_000, 120_000), None, (500, 65_536),
                 attach_series=PD_EXTREME_SERIES),
        DiskType("gcp", "hyperdisk-extreme", (2_500, 350_000), None, (64, 65_536),
                 attach_series=HYPERDISK_EXTREME_SERIES),
        DiskType("gcp", "hyperdisk-balanced", (3_000, 160_000), (140, 2_400), (4, 65_536),
                 max_iops_per_gib=500, default_throughput_mbps=140,
                 attach_series=HYPERDISK_BALANCED_SERIES),
    )
}

# What a cluster gets when its file names no etcd disk type.
DEFAULT_DISK_TYPE: dict[str, str] = {
    "azure": "PremiumV2_LRS",
    "aws": "gp3",
    "gcp": "hyperdisk-balanced",
}


def disk_types_for(cloud: str) -> list[str]:
    return [d.name for d in DISK_TYPES.values() if d.cloud == cloud]


def default_throughput(disk: DiskType, iops: int) -> int | None:
    """Throughput to provision when the file leaves it out.

    The cloud's baseline where it has one; for Ultra Disk (no baseline) the
    throughput of 4 KiB writes at the provisioned IOPS, which is what etcd's
    small fsync'd WAL writes need.
    """
    if not disk.takes_throughput:
        return None
    if disk.default_throughput_mbps is not None:
        return disk.default_throughput_mbps
    low, high = disk.throughput_mbps
    return max(low, min(high, iops * 4 // 1000))


def etcd_iops_floor(node_capacity: int) -> int:
    """The least provisioned IOPS corral accepts for etcd at a cluster's size.

    etcd's hardware guide: ~500 sequential IOPS for heavily loaded clusters,
    and cloud figures are concurrent IOPS, often 10x the sequential figure.
    OpenAI ran 2,500 nodes on network SSD rated 5,000 IOPS (~2 ms writes).
    """
    if node_capacity >= 2_500:
        return 10_000
    if node_capacity >= 500:
        return 5_000
    return 3_000

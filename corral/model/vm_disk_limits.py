"""What each VM can do with the disks attached to it, per cloud, from the vendors' tables.

A provisioned-IOPS disk is billed for what it is provisioned with, but the VM
it is attached to caps the IOPS and throughput of all its disks together.
corral compares the etcd data disk with its member's SUSTAINED cap: etcd
writes all day, while the higher burst figures some shapes list last 30
minutes (a day on AWS, at a time on Azure). Figures are per VM for all
attached disks; corral checks the data disk alone (the boot disk carries
little I/O), so the check never flags a disk that would fit.

Each row: machine type -> (sustained IOPS, sustained MB/s, burst IOPS, burst MB/s).
A machine type missing here is not checked (no error): the tables cover the
machine types corral's examples and tests use and the common families around
them, not every shape each cloud sells.

Sources (read 2026-11; refresh from the same pages):

- Azure, "Remote storage" tab of each size series page, columns "Uncached
  Disk IOPS / Speed (MBps)" and "... Burst" (MBps = 10^6 bytes/s). The
  "special storage" columns (Premium SSD v2, Ultra Disk) are empty for these
  sizes, so the same caps apply to the disk types corral uses.
  https://learn.microsoft.com/azure/virtual-machines/sizes/memory-optimized/esv5-series
  https://learn.microsoft.com/azure/virtual-machines/sizes/memory-optimized/edsv5-series
  https://learn.microsoft.com/azure/virtual-machines/sizes/general-purpose/dsv5-series
  (source text: MicrosoftDocs/azure-docs articles/virtual-machines/sizes/...)
- AWS, "Amazon EBS specifications" of the EC2 instance type guide: baseline
  and maximum bandwidth, throughput (MB/s, 128 KiB I/O) and IOPS (16 KiB
  I/O) of EBS-optimized instances. Sizes with two figures burst to the
  maximum "for 30 minutes at least once every 24 hours". Figures read from
  the guide's 2024 edition ("Amazon EC2: Instance Types").
  https://docs.aws.amazon.com/ec2/latest/instancetypes/gp.html#gp_storage-ebs
  https://docs.aws.amazon.com/ec2/latest/instancetypes/mo.html#mo_storage-ebs
  https://docs.aws.amazon.com/ec2/latest/instancetypes/co.html#co_storage-ebs
  https://docs.aws.amazon.com/ebs/latest/userguide/ebs-optimized.html
- GCP pd-extreme, "Performance limits by machine type for Persistent Disk"
  (write figures, MiB/s), as Google's gcpdiag tool tabulates them
  (GoogleCloudPlatform/gcpdiag gcpdiag/runbook/gce/disk_performance_benchmark/).
  https://cloud.google.com/compute/docs/disks/performance#machine-type-disk-limits
  GCE Hyperdisk per-VM limits (https://cloud.google.com/compute/docs/disks/hyperdisk-perf-limits)
  are not tabled yet: hyperdisk-balanced and hyperdisk-extreme are checked for
  the machine series and vCPU floor only (disks.py), not for per-VM caps.
"""

from __future__ import annotations

# (sustained IOPS, sustained MB/s, burst IOPS, burst MB/s)
Caps = tuple[int, float, int, float]

AZURE: dict[str, Caps] = {
    # Esv5 (memory optimized, no temp disk)
    "Standard_E2s_v5": (3_750, 85, 10_000, 1_200),
    "Standard_E4s_v5": (6_400, 145, 20_000, 1_200),
    "Standard_E8s_v5": (12_800, 290, 20_000, 1_200),
    "Standard_E16s_v5": (25_600, 600, 40_000, 1_200),
    "Standard_E20s_v5": (32_000, 750, 64_000, 1_600),
    "Standard_E32s_v5": (51_200, 865, 80_000, 2_000),
    "Standard_E48s_v5": (76_800, 1_315, 80_000, 3_000),
    "Standard_E64s_v5": (80_000, 1_735, 80_000, 3_000),
    "Standard_E96s_v5": (80_000, 2_600, 80_000, 4_000),
    "Standard_E104is_v5": (120_000, 4_000, 120_000, 4_000),
    # Edsv5 (memory optimized, temp disk)
    "Standard_E2ds_v5": (3_750, 85, 10_000, 1_200),
    "Standard_E4ds_v5": (6_400, 145, 20_000, 1_200),
    "Standard_E8ds_v5": (12_800, 290, 20_000, 1_200),
    "Standard_E16ds_v5": (25_600, 600, 40_000, 1_200),
    "Standard_E20ds_v5": (32_000, 750, 64_000, 1_600),
    "Standard_E32ds_v5": (51_200, 865, 80_000, 2_000),
    "Standard_E48ds_v5": (76_800, 1_315, 80_000, 3_000),
    "Standard_E64ds_v5": (80_000, 1_735, 80_000, 3_000),
    "Standard_E96ds_v5": (80_000, 2_600, 80_000, 4_000),
    "Standard_E104ids_v5": (120_000, 4_000, 120_000, 4_000),
    # Dsv5 (general purpose, no temp disk)
    "Standard_D2s_v5": (3_750, 85, 10_000, 1_200),
    "Standard_D4s_v5": (6_400, 145, 20_000, 1_200),
    "Standard_D8s_v5": (12_800, 290, 20_000, 1_200),
    "Standard_D16s_v5": (25_600, 600, 40_000, 1_200),
    "Standard_D32s_v5": (51_200, 865, 80_000, 2_000),
    "Standard_D48s_v5": (76_800, 1_315, 80_000, 3_000),
    "Standard_D64s_v5": (80_000, 1_735, 80_000, 3_000),
    "Standard_D96s_v5": (80_000, 2_600, 80_000, 4_000),
}

AWS: dict[str, Caps] = {
    # m5
    "m5.large": (3_600, 81.25, 18_750, 593.75),
    "m5.xlarge": (6_000, 143.75, 18_750, 593.75),
    "m5.2xlarge": (12_000, 287.5, 18_750, 593.75),
    "m5.4xlarge": (18_750, 593.75, 18_750, 593.75),
    "m5.8xlarge": (30_000, 850, 30_000, 850),
    "m5.12xlarge": (40_000, 1187.5, 40_000, 1187.5),
    "m5.16xlarge": (60_000, 1_700, 60_000, 1_700),
    "m5.24xlarge": (80_000, 2_375, 80_000, 2_375),
    "m5.metal": (80_000, 2_375, 80_000, 2_375),
    # r5
    "r5.large": (3_600, 81.25, 18_750, 593.75),
    "r5.xlarge": (6_000, 143.75, 18_750, 593.75),
    "r5.2xlarge": (12_000, 287.5, 18_750, 593.75),
    "r5.4xlarge": (18_750, 593.75, 18_750, 593.75),
    "r5.8xlarge": (30_000, 850, 30_000, 850),
    "r5.12xlarge": (40_000, 1187.5, 40_000, 1187.5),
    "r5.16xlarge": (60_000, 1_700, 60_000, 1_700),
    "r5.24xlarge": (80_000, 2_375, 80_000, 2_375),
    "r5.metal": (80_000, 2_375, 80_000, 2_375),
    # c5
    "c5.large": (4_000, 81.25, 20_000, 593.75),
    "c5.xlarge": (6_000, 143.75, 20_000, 593.75),
    "c5.2xlarge": (10_000, 287.5, 20_000, 593.75),
    "c5.4xlarge": (20_000, 593.75, 20_000, 593.75),
    "c5.9xlarge": (40_000, 1187.5, 40_000, 1187.5),
    "c5.12xlarge": (40_000, 1187.5, 40_000, 1187.5),
    "c5.18xlarge": (80_000, 2_375, 80_000, 2_375),
    "c5.24xlarge": (80_000, 2_375, 80_000, 2_375),
    "c5.metal": (80_000, 2_375, 80_000, 2_375),
    # m6i
    "m6i.large": (3_600, 81.25, 40_000, 1_250),
    "m6i.xlarge": (6_000, 156.25, 40_000, 1_250),
    "m6i.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "m6i.4xlarge": (20_000, 625, 40_000, 1_250),
    "m6i.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "m6i.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "m6i.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "m6i.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "m6i.32xlarge": (160_000, 5_000, 160_000, 5_000),
    "m6i.metal": (160_000, 5_000, 160_000, 5_000),
    # r6i
    "r6i.large": (3_600, 81.25, 40_000, 1_250),
    "r6i.xlarge": (6_000, 156.25, 40_000, 1_250),
    "r6i.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "r6i.4xlarge": (20_000, 625, 40_000, 1_250),
    "r6i.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "r6i.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "r6i.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "r6i.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "r6i.32xlarge": (160_000, 5_000, 160_000, 5_000),
    "r6i.metal": (160_000, 5_000, 160_000, 5_000),
    # c6i
    "c6i.large": (3_600, 81.25, 40_000, 1_250),
    "c6i.xlarge": (6_000, 156.25, 40_000, 1_250),
    "c6i.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "c6i.4xlarge": (20_000, 625, 40_000, 1_250),
    "c6i.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "c6i.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "c6i.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "c6i.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "c6i.32xlarge": (160_000, 5_000, 160_000, 5_000),
    "c6i.metal": (160_000, 5_000, 160_000, 5_000),
    # m6a
    "m6a.large": (3_600, 81.25, 40_000, 1_250),
    "m6a.xlarge": (6_000, 156.25, 40_000, 1_250),
    "m6a.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "m6a.4xlarge": (20_000, 625, 40_000, 1_250),
    "m6a.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "m6a.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "m6a.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "m6a.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "m6a.32xlarge": (160_000, 5_000, 160_000, 5_000),
    "m6a.48xlarge": (240_000, 5_000, 240_000, 5_000),
    "m6a.metal": (240_000, 5_000, 240_000, 5_000),
    # r6a
    "r6a.large": (3_600, 81.25, 40_000, 1_250),
    "r6a.xlarge": (6_000, 156.25, 40_000, 1_250),
    "r6a.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "r6a.4xlarge": (20_000, 625, 40_000, 1_250),
    "r6a.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "r6a.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "r6a.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "r6a.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "r6a.32xlarge": (160_000, 5_000, 160_000, 5_000),
    "r6a.48xlarge": (240_000, 5_000, 240_000, 5_000),
    "r6a.metal": (240_000, 5_000, 240_000, 5_000),
    # c6a
    "c6a.large": (3_600, 81.25, 40_000, 1_250),
    "c6a.xlarge": (6_000, 156.25, 40_000, 1_250),
    "c6a.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "c6a.4xlarge": (20_000, 625, 40_000, 1_250),
    "c6a.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "c6a.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "c6a.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "c6a.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "c6a.32xlarge": (160_000, 5_000, 160_000, 5_000),
    "c6a.48xlarge": (240_000, 5_000, 240_000, 5_000),
    "c6a.metal": (240_000, 5_000, 240_000, 5_000),
    # m7i
    "m7i.large": (3_600, 81.25, 40_000, 1_250),
    "m7i.xlarge": (6_000, 156.25, 40_000, 1_250),
    "m7i.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "m7i.4xlarge": (20_000, 625, 40_000, 1_250),
    "m7i.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "m7i.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "m7i.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "m7i.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "m7i.48xlarge": (240_000, 5_000, 240_000, 5_000),
    "m7i.metal-24xl": (120_000, 3_750, 120_000, 3_750),
    "m7i.metal-48xl": (240_000, 5_000, 240_000, 5_000),
    # r7i
    "r7i.large": (3_600, 81.25, 40_000, 1_250),
    "r7i.xlarge": (6_000, 156.25, 40_000, 1_250),
    "r7i.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "r7i.4xlarge": (20_000, 625, 40_000, 1_250),
    "r7i.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "r7i.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "r7i.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "r7i.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "r7i.48xlarge": (240_000, 5_000, 240_000, 5_000),
    "r7i.metal-24xl": (120_000, 3_750, 120_000, 3_750),
    "r7i.metal-48xl": (240_000, 5_000, 240_000, 5_000),
    # c7i
    "c7i.large": (3_600, 81.25, 40_000, 1_250),
    "c7i.xlarge": (6_000, 156.25, 40_000, 1_250),
    "c7i.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "c7i.4xlarge": (20_000, 625, 40_000, 1_250),
    "c7i.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "c7i.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "c7i.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "c7i.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "c7i.48xlarge": (240_000, 5_000, 240_000, 5_000),
    "c7i.metal-24xl": (120_000, 3_750, 120_000, 3_750),
    "c7i.metal-48xl": (240_000, 5_000, 240_000, 5_000),
    # m7a
    "m7a.medium": (2_500, 40.62, 40_000, 1_250),
    "m7a.large": (3_600, 81.25, 40_000, 1_250),
    "m7a.xlarge": (6_000, 156.25, 40_000, 1_250),
    "m7a.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "m7a.4xlarge": (20_000, 625, 40_000, 1_250),
    "m7a.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "m7a.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "m7a.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "m7a.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "m7a.32xlarge": (160_000, 5_000, 160_000, 5_000),
    "m7a.48xlarge": (240_000, 5_000, 240_000, 5_000),
    "m7a.metal-48xl": (240_000, 5_000, 240_000, 5_000),
    # r7a
    "r7a.medium": (2_500, 40.62, 40_000, 1_250),
    "r7a.large": (3_600, 81.25, 40_000, 1_250),
    "r7a.xlarge": (6_000, 156.25, 40_000, 1_250),
    "r7a.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "r7a.4xlarge": (20_000, 625, 40_000, 1_250),
    "r7a.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "r7a.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "r7a.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "r7a.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "r7a.32xlarge": (160_000, 5_000, 160_000, 5_000),
    "r7a.48xlarge": (240_000, 5_000, 240_000, 5_000),
    "r7a.metal-48xl": (240_000, 5_000, 240_000, 5_000),
    # c7a
    "c7a.medium": (2_500, 40.62, 40_000, 1_250),
    "c7a.large": (3_600, 81.25, 40_000, 1_250),
    "c7a.xlarge": (6_000, 156.25, 40_000, 1_250),
    "c7a.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "c7a.4xlarge": (20_000, 625, 40_000, 1_250),
    "c7a.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "c7a.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "c7a.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "c7a.24xlarge": (120_000, 3_750, 120_000, 3_750),
    "c7a.32xlarge": (160_000, 5_000, 160_000, 5_000),
    "c7a.48xlarge": (240_000, 5_000, 240_000, 5_000),
    "c7a.metal-48xl": (240_000, 5_000, 240_000, 5_000),
    # m6g
    "m6g.medium": (2_500, 39.38, 20_000, 593.75),
    "m6g.large": (3_600, 78.75, 20_000, 593.75),
    "m6g.xlarge": (6_000, 148.5, 20_000, 593.75),
    "m6g.2xlarge": (12_000, 296.88, 20_000, 593.75),
    "m6g.4xlarge": (20_000, 593.75, 20_000, 593.75),
    "m6g.8xlarge": (40_000, 1187.5, 40_000, 1187.5),
    "m6g.12xlarge": (50_000, 1781.25, 50_000, 1781.25),
    "m6g.16xlarge": (80_000, 2_375, 80_000, 2_375),
    "m6g.metal": (80_000, 2_375, 80_000, 2_375),
    # r6g
    "r6g.medium": (2_500, 39.38, 20_000, 593.75),
    "r6g.large": (3_600, 78.75, 20_000, 593.75),
    "r6g.xlarge": (6_000, 148.5, 20_000, 593.75),
    "r6g.2xlarge": (12_000, 296.88, 20_000, 593.75),
    "r6g.4xlarge": (20_000, 593.75, 20_000, 593.75),
    "r6g.8xlarge": (40_000, 1187.5, 40_000, 1187.5),
    "r6g.12xlarge": (50_000, 1781.25, 50_000, 1781.25),
    "r6g.16xlarge": (80_000, 2_375, 80_000, 2_375),
    "r6g.metal": (80_000, 2_375, 80_000, 2_375),
    # c6g
    "c6g.medium": (2_500, 39.38, 20_000, 593.75),
    "c6g.large": (3_600, 78.75, 20_000, 593.75),
    "c6g.xlarge": (6_000, 148.5, 20_000, 593.75),
    "c6g.2xlarge": (12_000, 296.88, 20_000, 593.75),
    "c6g.4xlarge": (20_000, 593.75, 20_000, 593.75),
    "c6g.8xlarge": (40_000, 1187.5, 40_000, 1187.5),
    "c6g.12xlarge": (50_000, 1781.25, 50_000, 1781.25),
    "c6g.16xlarge": (80_000, 2_375, 80_000, 2_375),
    "c6g.metal": (80_000, 2_375, 80_000, 2_375),
    # m7g
    "m7g.medium": (2_500, 39.38, 40_000, 1_250),
    "m7g.large": (3_600, 78.75, 40_000, 1_250),
    "m7g.xlarge": (6_000, 156.25, 40_000, 1_250),
    "m7g.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "m7g.4xlarge": (20_000, 625, 40_000, 1_250),
    "m7g.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "m7g.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "m7g.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "m7g.metal": (80_000, 2_500, 80_000, 2_500),
    # r7g
    "r7g.medium": (2_500, 39.38, 40_000, 1_250),
    "r7g.large": (3_600, 78.75, 40_000, 1_250),
    "r7g.xlarge": (6_000, 156.25, 40_000, 1_250),
    "r7g.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "r7g.4xlarge": (20_000, 625, 40_000, 1_250),
    "r7g.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "r7g.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "r7g.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "r7g.metal": (80_000, 2_500, 80_000, 2_500),
    # c7g
    "c7g.medium": (2_500, 39.38, 40_000, 1_250),
    "c7g.large": (3_600, 78.75, 40_000, 1_250),
    "c7g.xlarge": (6_000, 156.25, 40_000, 1_250),
    "c7g.2xlarge": (12_000, 312.5, 40_000, 1_250),
    "c7g.4xlarge": (20_000, 625, 40_000, 1_250),
    "c7g.8xlarge": (40_000, 1_250, 40_000, 1_250),
    "c7g.12xlarge": (60_000, 1_875, 60_000, 1_875),
    "c7g.16xlarge": (80_000, 2_500, 80_000, 2_500),
    "c7g.metal": (80_000, 2_500, 80_000, 2_500),
}

GCP_PD_EXTREME: dict[str, Caps] = {
    # N2 with 64+ vCPUs (the only N2 shapes that take pd-extreme); no burst.
    **{f"n2-{kind}-{n}": (120_000, 3_000, 120_000, 3_000)
       for kind in ("standard", "highmem", "highcpu") for n in (64, 80, 96, 128)
       if not (kind == "highcpu" and n == 128)},
    "m1-megamem-96": (90_000, 2_200, 90_000, 2_200),
    "m2-megamem-416": (40_000, 1_200, 40_000, 1_200),
    "m2-ultramem-208": (40_000, 1_200, 40_000, 1_200),
    "m2-ultramem-416": (40_000, 1_200, 40_000, 1_200),
    "m2-hypermem-416": (40_000, 1_200, 40_000, 1_200),
    "m3-megamem-64": (40_000, 1_200, 40_000, 1_200),
    "m3-megamem-128": (80_000, 1_700, 80_000, 1_700),
    "m3-ultramem-32": (40_000, 1_200, 40_000, 1_200),
    "m3-ultramem-64": (40_000, 1_200, 40_000, 1_200),
    "m3-ultramem-128": (80_000, 1_700, 80_000, 1_700),
}


def vm_disk_caps(cloud: str, disk_type: str, machine_type: str) -> Caps | None:
    """The VM's caps for disks of `disk_type`, or None where corral has no figures."""
    if cloud == "azure":
        return AZURE.get(machine_type)
    if cloud == "aws":
        return AWS.get(machine_type)
    if cloud == "gcp" and disk_type == "pd-extreme":
        return GCP_PD_EXTREME.get(machine_type)
    return None

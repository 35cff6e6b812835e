"""GPU machine types of the clouds, and the GPU models a pool may name.

A cloud machine type comes with its GPUs: `p5.48xlarge` has eight H100s,
joined by NVSwitch, and 32 EFA interfaces; `g5.xlarge` has one A10G. The
catalog says so per machine type, so the rules can refuse a pool that
declares other GPUs than its machines have (`rules._cloud_gpu`) and the model
can fill a pool's `gpu` block from its machine type (`Cluster._resolve_defaults`,
`corral nodepool add`). docs/gpu-machines.md lists the rows and their sources.

Sources, per family (checked row by row; a row that could not be checked is
left out, and a machine type not listed here is trusted as declared):

- AWS: the EC2 API's DescribeInstanceTypes (GpuInfo name, count and memory in
  MiB; MaximumEfaInterfaces), as published in
  github.com/aws/karpenter-provider-aws website/content/en/docs/reference/
  instance-types.md (commit 1d927085, the `karpenter.k8s.aws/instance-gpu-*`
  labels and the `vpc.amazonaws.com/efa` resource); the G5 counts also on
  docs.aws.amazon.com/batch/latest/userguide/gpu-jobs.html. NVSwitch on
  P4d/P4de/P5/P5e/P5en: they are NVIDIA HGX 8-GPU baseboards (NVIDIA Fabric
  Manager user guide, docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide,
  "GPU Baseboard Topologies").
- GCP: machine type -> accelerator type and count in
  github.com/GoogleCloudPlatform/cluster-toolkit modules/internal/gpu-definition/
  main.tf (commit 147e356d) and pkg/config/machine_mappings.json (commit
  1047080, the a3-highgpu-1g/2g/4g and a4-highgpu-8g shorthands); the GPU
  NICs from the same repository's blueprints: examples/gke-a3-highgpu
  (GPUDirect-TCPX, network_count 4), examples/gke-a3-megagpu (GPUDirect-TCPXO,
  network_count 8), examples/gke-a3-ultragpu and examples/gke-a4 (RDMA
  subnetworks, count 8); GKE's GPUDirectStrategy RDMA "on A3 Ultra, and A4
  machine types" (cloud.google.com container v1beta1 API reference).
- Azure: learn.microsoft.com VM size pages, from github.com/MicrosoftDocs/
  azure-docs articles/virtual-machines/sizes/gpu-accelerated/ (ndasra100v4,
  ndma100v4, ndh100v5, nca100v4, ncadsh100v5: the "Accelerators" tables and
  series summaries, "its own dedicated ... InfiniBand connection" per GPU) and
  github.com/MicrosoftDocs/azure-compute-docs .../nd-h200-v5-series-specs.md
  and -summary.md (8 H200, 141 GB, 400 Gb/s InfiniBand per GPU).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Literal

Fabric = Literal["efa", "gpudirect-tcpx", "gpudirect-tcpxo", "gpudirect-rdma", "infiniband"]

# --- GPU models ----------------------------------------------------------------
#
# The names a pool's gpu.model may take. They become the corral.dev/gpu-model
# node label, and the GPU preflight (templates/health/gpu-preflight.py.j2)
# finds the name, case-insensitively and as a whole word, in what nvidia-smi reports ("NVIDIA
# A100-SXM4-80GB", "NVIDIA H100 NVL", "Tesla T4"). So one name per chip, as
# NVIDIA writes it, without form factor or memory size: the 40 GB and 80 GB
# A100 are both A100, the H100 NVL card is H100; a machine type's memory is in
# its catalog row. The clouds' models, the ones GCP attaches to N1 machines,
# and NVIDIA data-center GPUs that on-prem pools run.
GPU_MODELS: tuple[str, ...] = (
    "A10", "A10G", "A16", "A30", "A40", "A100",
    "B200", "B300", "GB200", "GH200",
    "H100", "H20", "H200",
    "L4", "L40", "L40S",
    "P4", "P100", "T4", "V100",
)


def _folded(name: str) -> str:
    """A name with the usual slips folded away: case, O for 0, I for 1, spaces, '_' for '-'."""
    return name.upper().replace("O", "0").replace("I", "1").replace(" ", "").replace("_", "-")


def closest(name: str, choices: tuple[str, ...] | list[str], cutoff: float = 0.6) -> str | None:
    """The choice `name` was most likely meant to be, or None."""
    folded = {_folded(c): c for c in choices}
    key = _folded(name)
    if key in folded:
        return folded[key]
    match = difflib.get_close_matches(key, list(folded), n=1, cutoff=cutoff)
    return folded[match[0]] if match else None


# --- Machine types ---------------------------------------------------------------


@dataclass(frozen=True)
class GpuMachine:
    cloud: str
    machine_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gib: float | None  # per GPU, as the row's source gives it; None: not documented there
    # True: the machine holds a whole NVIDIA HGX baseboard, whose GPUs reach
    # each other through NVSwitch, and NVIDIA's fabric manager must run in the
    # machine before CUDA can use them. False: PCIe cards, no NVSwitch.
    # None: a slice (1, 2 or 4 GPUs) of an NVSwitch host; whether the switches
    # are passed to the VM is not documented, so fabricManager stays the
    # pool's choice (default off).
    nvswitch: bool | None
    fabric: Fabric | None = None
    fabric_nics: int | None = None  # GPU fabric interfaces (EFA devices, GPU NICs, HCAs)

    def describe(self) -> str:
        """`8 H100 (80 GiB each, NVSwitch)` - what a message says the machine has."""
        parts = []
        if (memory := self.gpu_memory_gib) is not None:
            parts.append(f"{memory:g} GiB each")
        if self.nvswitch:
            parts.append("NVSwitch")
        return f"{self.gpu_count} {self.gpu_model}" + (f" ({', '.join(parts)})" if parts else "")


def _sizes(cloud: str, pattern: str, model: str, memory_gib: float | None, counts: dict[str, int],
           nvswitch: bool | None = False, efa: dict[str, int] | None = None) -> list[GpuMachine]:
    return [
        GpuMachine(cloud, pattern.format(size), model, count, memory_gib, nvswitch,
                   "efa" if efa and size in efa else None, (efa or {}).get(size))
        for size, count in counts.items()
    ]


# AWS G5, G6 and G6e share their sizes' GPU counts; EFA from 8xlarge up.
_G_COUNTS = {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "12xlarge": 4, "16xlarge": 1,
             "24xlarge": 4, "48xlarge": 8}
_G_EFA = {"8xlarge": 1, "12xlarge": 1, "16xlarge": 1, "24xlarge": 1, "48xlarge": 1}

# GPU memory per GPU, GiB: AWS rows from the EC2 API's MemoryInfo.SizeInMiB
# (A10G and L4 22888 MiB, L40S 45776, A100 40960 and 81920, H100 81920, H200
# 144384); GCP rows from the accelerator type names (nvidia-tesla-a100 is the
# "a100-40gb" shorthand, nvidia-a100-80gb, nvidia-h100-80gb,
# nvidia-h200-141gb; L4 and B200 names carry none); Azure rows from the size
# pages' accelerator memory (40, 80, 80, 141 and the H100 NVL's 94).
_MACHINES: list[GpuMachine] = [
    # AWS (EC2 DescribeInstanceTypes via karpenter-provider-aws instance-types.md)
    *_sizes("aws", "g5.{}", "A10G", 22.4, _G_COUNTS, efa=_G_EFA),
    *_sizes("aws", "g6.{}", "L4", 22.4, _G_COUNTS, efa=_G_EFA),
    *_sizes("aws", "g6e.{}", "L40S", 44.7, _G_COUNTS,
            efa={"8xlarge": 1, "12xlarge": 1, "16xlarge": 1, "24xlarge": 2, "48xlarge": 4}),
    GpuMachine("aws", "p4d.24xlarge", "A100", 8, 40, True, "efa", 4),
    GpuMachine("aws", "p4de.24xlarge", "A100", 8, 80, True, "efa", 4),
    GpuMachine("aws", "p5.4xlarge", "H100", 1, 80, None, "efa", 1),
    GpuMachine("aws", "p5.48xlarge", "H100", 8, 80, True, "efa", 32),
    GpuMachine("aws", "p5e.48xlarge", "H200", 8, 141, True, "efa", 32),
    GpuMachine("aws", "p5en.48xlarge", "H200", 8, 141, True, "efa", 16),
    # GCP (cluster-toolkit gpu-definition/main.tf, machine_mappings.json, blueprints)
    *_sizes("gcp", "a2-highgpu-{}", "A100", 40, {"1g": 1, "2g": 2, "4g": 4}, nvswitch=None),
    GpuMachine("gcp", "a2-highgpu-8g", "A100", 8, 40, True),
    GpuMachine("gcp", "a2-megagpu-16g", "A100", 16, 40, True),
    *_sizes("gcp", "a2-ultragpu-{}", "A100", 80, {"1g": 1, "2g": 2, "4g": 4}, nvswitch=None),
    GpuMachine("gcp", "a2-ultragpu-8g", "A100", 8, 80, True),
    *_sizes("gcp", "a3-highgpu-{}", "H100", 80, {"1g": 1, "2g": 2, "4g": 4}, nvswitch=None),
    GpuMachine("gcp", "a3-highgpu-8g", "H100", 8, 80, True, "gpudirect-tcpx", 4),
    GpuMachine("gcp", "a3-megagpu-8g", "H100", 8, 80, True, "gpudirect-tcpxo", 8),
    GpuMachine("gcp", "a3-ultragpu-8g", "H200", 8, 141, True, "gpudirect-rdma", 8),
    GpuMachine("gcp", "a4-highgpu-8g", "B200", 8, None, True, "gpudirect-rdma", 8),
    *_sizes("gcp", "g2-standard-{}", "L4", None,
            {"4": 1, "8": 1, "12": 1, "16": 1, "24": 2, "32": 1, "48": 4, "96": 8}),
    # Azure (learn.microsoft.com size pages, MicrosoftDocs/azure-docs and azure-compute-docs)
    GpuMachine("azure", "Standard_ND96asr_v4", "A100", 8, 40, True, "infiniband", 8),
    GpuMachine("azure", "Standard_ND96amsr_A100_v4", "A100", 8, 80, True, "infiniband", 8),
    GpuMachine("azure", "Standard_ND96isr_H100_v5", "H100", 8, 80, True, "infiniband", 8),
    GpuMachine("azure", "Standard_ND96isr_H200_v5", "H200", 8, 141, True, "infiniband", 8),
    GpuMachine("azure", "Standard_NC24ads_A100_v4", "A100", 1, 80, False),
    GpuMachine("azure", "Standard_NC48ads_A100_v4", "A100", 2, 80, False),
    GpuMachine("azure", "Standard_NC96ads_A100_v4", "A100", 4, 80, False),
    GpuMachine("azure", "Standard_NC40ads_H100_v5", "H100", 1, 94, False),  # H100 NVL
    GpuMachine("azure", "Standard_NC80adis_H100_v5", "H100", 2, 94, False),
]

CATALOG: dict[tuple[str, str], GpuMachine] = {(m.cloud, m.machine_type): m for m in _MACHINES}
assert len(CATALOG) == len(_MACHINES), "a machine type is listed twice"
assert all(m.gpu_model in GPU_MODELS for m in _MACHINES)


def gpu_machine(cloud: str, machine_type: str) -> GpuMachine | None:
    return CATALOG.get((cloud, machine_type))


def machine_types(cloud: str) -> list[str]:
    return [m.machine_type for m in _MACHINES if m.cloud == cloud]


# Machine types that look like GPU machines of their cloud: the AWS P and G
# families (p4d, p6-b200, g4dn, gr6...), GCP's accelerator-optimized series
# (A2, A3, A4, A4X, G2, G4) and Azure's N series (NC, ND, NG, NV). A GPU pool
# on any other type is refused; GCP's N1 takes attachable GPUs instead.
CLOUD_NAMES = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}
GPU_FAMILIES = {
    "aws": (re.compile(r"(p|g|gr)[0-9][a-z0-9-]*\.[a-z0-9]+\Z"), "the P and G families, like p5.48xlarge or g6.xlarge"),
    "gcp": (re.compile(r"(a[0-9]+x?|g[0-9])-[a-z0-9-]+\Z"),
            "the accelerator-optimized A and G series, like a3-highgpu-8g or g2-standard-8, or N1 with attached GPUs"),
    "azure": (re.compile(r"Standard_N[CDGV][0-9][A-Za-z0-9_]*\Z"),
              "the N series, like Standard_ND96isr_H100_v5 or Standard_NC24ads_A100_v4"),
}
# GPUs GCP attaches to N1 machine types (by accelerator type; the infra's
# ATTACHABLE_GPUS), the one way a GCP machine outside the A and G series has GPUs.
GCP_ATTACHABLE = ("T4", "V100", "P100", "P4")


def looks_like_gpu_machine(cloud: str, machine_type: str) -> bool:
    return bool(GPU_FAMILIES[cloud][0].match(machine_type))


def closest_machine_type(cloud: str, machine_type: str) -> str | None:
    match = difflib.get_close_matches(machine_type, machine_types(cloud), n=1, cutoff=0.8)
    return match[0] if match else None

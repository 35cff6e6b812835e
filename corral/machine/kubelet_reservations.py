"""The kubelet's reservations, eviction thresholds and NUMA alignment, sized on the machine itself.

kubeadm gives every node of a cluster ONE KubeletConfiguration (the
kube-system/kubelet-config ConfigMap, from kubeadm/_kubelet-configuration.yaml.j2),
but what a machine must keep for itself depends on its memory and CPUs, which
only the machine knows: cloud pools autoscale over machine types, on-prem hosts
differ. So a boot script (TEMPLATE, rendered to SCRIPT on cloud machines by
`part` and on on-prem hosts by the kubelet_join role, from `context`) reads
/proc/meminfo and the online CPUs and writes a kubeadm patch of the
KubeletConfiguration (PATCH_FILE, target `kubeletconfiguration`, JSON merge
patch) before `kubeadm init`/`join`, whose configuration names PATCHES_DIR;
`kubeadm upgrade node --patches PATCHES_DIR` re-applies it (kubelet_upgrade).

What the patch holds (docs/cloud-nodes.md, "Kubelet reservations and NUMA"):

* kubeReserved: GKE's published reservation tiers (memory: 25 % of the first
  4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of the next 112, 2 % above
  128 GiB, 255 MiB below 1 GiB; CPU: 6 % of the first core, 1 % of the next,
  0.5 % of the next 2, 0.25 % above 4).
* systemReserved, GPU pools only: the NVIDIA host side (fabric manager,
  persistenced, the driver's per-GPU kernel memory no cgroup is charged for)
  and one more CPU (the GPU_SYSTEM_* constants, corral's own estimate).
* evictionHard: memory.available at 1 % of the memory, at least the kubelet's
  default 100Mi; the kubelet's other default thresholds repeated (setting one
  signal sets the others to zero).
* GPU pools: cpuManagerPolicy static (its CPU reservation is the kube and
  system reserved CPU above, > 0), topologyManagerPolicy best-effort,
  topologyManagerScope pod; the topology manager only where the machine has
  at most MAX_NUMA_NODES NUMA nodes (the kubelet refuses more).
"""

from __future__ import annotations

import re

from corral.model.schema import CloudPool, OnPremPool

from .files import File, render
from .part import Part, Phase

TEMPLATE = "scripts/kubelet-reservations.sh.j2"
SCRIPT = "/usr/local/sbin/corral-kubelet-reservations"
# kubeadm's patches folder (the API servers' scheduler image patch lives here too).
PATCHES_DIR = "/etc/kubernetes/patches"
# target "kubeletconfiguration", patch type "merge" (RFC 7386: maps merge key by key).
PATCH_FILE = f"{PATCHES_DIR}/kubeletconfiguration+merge.yaml"

# The kubelet's default hard eviction thresholds (kubernetes pkg/kubelet/apis/
# config/v1beta1/defaults_linux.go, DefaultEvictionHard); memory.available is
# raised per machine, the rest are repeated because a configuration that sets
# any signal leaves the unset ones at zero (kubernetes.io node-pressure eviction).
EVICTION_MEMORY_FLOOR_MIB = 100
EVICTION_MEMORY_PERCENT = 1
EVICTION_DEFAULTS = {"nodefs.available": "10%", "nodefs.inodesFree": "5%", "imagefs.available": "15%"}

# GPU machines: memory for the NVIDIA host daemons (nv-fabricmanager,
# nvidia-persistenced) and, per GPU, for what the driver allocates in the kernel
# for each device (charged to no cgroup, so invisible to the pods' limit); one
# CPU more for them and the NIC/GPU interrupts. corral's estimate, not upstream.
GPU_SYSTEM_MEMORY_MIB = 1024
GPU_MEMORY_PER_GPU_MIB = 256
GPU_SYSTEM_CPU_MILLICORES = 1000

# NUMA alignment of GPU pools (docs/cloud-nodes.md says why these).
CPU_MANAGER_POLICY = "static"
TOPOLOGY_MANAGER_POLICY = "best-effort"
TOPOLOGY_MANAGER_SCOPE = "pod"
# "The maximum number of NUMA nodes that Topology Manager allows is 8"
# (kubernetes.io, Control Topology Management Policies on a node).
MAX_NUMA_NODES = 8

_WORD = re.compile(r"^[a-z-]+$")
_PATH = re.compile(r"^/[A-Za-z0-9_./+-]+$")


def context(pool: CloudPool | OnPremPool | None) -> dict:
    """The script's inputs for a node of `pool` (None: an API server, no GPUs).

    The same dict renders the cloud script and is the on-prem inventory's
    `corral_kubelet_reservations`, so both kinds of node size alike.
    """
    gpus = pool.gpu.count if pool is not None and pool.gpu is not None else 0
    numa = gpus > 0
    return {
        "patches_dir": PATCHES_DIR,
        "patch_path": PATCH_FILE,
        "gpu_count": gpus,
        "gpu_system_memory_mib": GPU_SYSTEM_MEMORY_MIB if gpus else 0,
        "gpu_memory_per_gpu_mib": GPU_MEMORY_PER_GPU_MIB if gpus else 0,
        "gpu_system_cpu_millicores": GPU_SYSTEM_CPU_MILLICORES if gpus else 0,
        "eviction_memory_floor_mib": EVICTION_MEMORY_FLOOR_MIB,
        "eviction_memory_percent": EVICTION_MEMORY_PERCENT,
        "eviction_defaults": dict(EVICTION_DEFAULTS),
        "numa_alignment": numa,
        "cpu_manager_policy": CPU_MANAGER_POLICY if numa else "none",
        "topology_manager_policy": TOPOLOGY_MANAGER_POLICY if numa else "none",
        "topology_manager_scope": TOPOLOGY_MANAGER_SCOPE if numa else "container",
        "max_numa_nodes": MAX_NUMA_NODES,
    }


def check(values: dict) -> None:
    """The template writes the strings into a shell script: only words and plain paths."""
    for key in ("cpu_manager_policy", "topology_manager_policy", "topology_manager_scope"):
        if not _WORD.match(values[key]):
            raise ValueError(f"kubelet reservations: {key} {values[key]!r} is not a policy name")
    for key in ("patches_dir", "patch_path"):
        if not _PATH.match(values[key]):
            raise ValueError(f"kubelet reservations: {key} {values[key]!r} is not a plain path")
    for signal, threshold in values["eviction_defaults"].items():
        if not re.match(r"^[a-z.A-Z]+$", signal) or not re.match(r"^[0-9]+(%|Mi|Gi)$", threshold):
            raise ValueError(f"kubelet reservations: eviction threshold {signal}={threshold!r}")


def render_script(values: dict) -> str:
    check(values)
    return render(TEMPLATE, reservations=values)


def part(pool: CloudPool | None = None) -> Part:
    """The script, run before the role's kubeadm (same phase, earlier part)."""
    return Part((File(SCRIPT, render_script(context(pool)), "0755"),), (SCRIPT,), Phase.SERVICE)

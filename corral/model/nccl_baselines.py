"""The one table of all-reduce baselines a burn-in holds a node to (issue 27, item 3;
docs/gpu-health.md, "Burn-in before readmission").

In the model layer so that loading a cluster file can say which GPU pool has no baseline (rules.py's
burn-in rule) before a node of it boots; corral/health/baselines.py re-exports it for the agent's config.

A baseline is the bus bandwidth (nccl-tests' busbw, GB/s) of a one-node all_reduce_perf at 1 GiB on
every GPU of the node, as a vendor or cloud published it for that GPU model and GPU count. busbw is
nccl-tests' own hardware-comparable figure: algbw * 2(n-1)/n for an all-reduce (NVIDIA/nccl-tests
doc/PERFORMANCE.md, "AllReduce"), so for one GPU there is nothing to measure.

Only published figures are here. A model or GPU count without one has no row: its burn-in then needs
an explicit `health.burnIn.ncclMinBusGBps` for the model, which the cluster file's validation asks for.
"""

from __future__ import annotations

from dataclasses import dataclass

# The size the baselines were read at, and the agent's all_reduce_perf runs at (addon.py):
# nccl-tests README, "Arguments": -b/--minbytes, -e/--maxbytes, -g/--ngpus (GPUs per thread).
MESSAGE_BYTES = "1G"


@dataclass(frozen=True)
class Baseline:
    gpu_model: str          # corral/model/gpu_catalog.py's name
    gpus: int               # GPUs in the one-node run
    bus_gbps: float         # busbw at 1 GiB, GB/s
    source: str             # where the figure is published
    conditions: str         # what it was measured on, so a reader can judge how far it carries


_AZURE = "Azure/AI-benchmarking-guide"
BASELINES: tuple[Baseline, ...] = (
    Baseline("H100", 8, 466.35, f"{_AZURE}, Azure Results/ND_H100_v5_results.md, NCCL Bandwidth, 1G row",
             "ND H100 v5: 8 x H100 80GB HBM3 SXM on NVSwitch, NCCL 2.18.5, NVLS algorithm, in-place"),
    Baseline("H200", 8, 467.58, f"{_AZURE}, Azure_Results/ND_H200_v5_results.md, NCCL Bandwidth, 1G row",
             "ND H200 v5: 8 x H200 141GB SXM on NVSwitch, NCCL 2.20.5, NVLS algorithm, in-place"),
    Baseline("A100", 8, 228.10, f"{_AZURE}, Azure_Results/ND_A100_v4_results.md, NCCL Bandwidth, 1G row",
             "ND A100 v4: 8 x A100-SXM4-80GB on NVSwitch, NCCL 2.18.5, in-place; applied to the 40 GB SXM4 "
             "part too, which the GPU catalog names the same (A100)"),
    Baseline("GB200", 4, 646.87, f"{_AZURE}, Azure_Results/ND_GB200_v6_results.md, NCCL Bandwidth, 1G row",
             "ND GB200 v6: the 4 GB200 GPUs of one tray, NCCL 2.25.1, Ring algorithm, in-place"),
)
# No published one-node nccl-tests figure was found for the catalog's other models (B200 was searched
# for; GH200 has one GPU a node; the others are PCIe cards whose bandwidth depends on the server's PCIe
# topology), nor for other GPU counts of the models above: no row, so an explicit minimum is needed.


def baseline(gpu_model: str, gpus: int) -> Baseline | None:
    """The published baseline for `gpus` GPUs of `gpu_model` in one node, or None."""
    return next((b for b in BASELINES if b.gpu_model == gpu_model and b.gpus == gpus), None)


def pool_baseline(pool) -> Baseline | None:
    """The baseline a GPU pool's nodes are held to, or None (then the cluster file names a floor).

    Every figure above was measured on GPUs joined by a switch fabric (the SXM parts on NVSwitch; the
    GB200 tray's NVLink). The GPU catalog names a chip once, so PCIe and NVL cards share the name (an
    H100 NVL is an H100, an A100 PCIe an A100) while their all-reduce runs over PCIe at a fraction of
    it. So a pool gets a baseline only where its GPUs are on that fabric: an on-prem pool that runs the
    fabric manager (gpu.fabricManager: an NVSwitch board), a cloud pool whose machine type is not known
    to be without NVSwitch (gpu_catalog: False are the PCIe cards; None, where the cloud does not say
    how the VM sees the switches, are SXM parts)."""
    from .gpu_catalog import gpu_machine

    gpu = pool.gpu
    if gpu is None:
        return None
    if pool.provider == "onprem":
        on_fabric = bool(gpu.fabric_manager)
    else:
        machine = gpu_machine(pool.provider, pool.machine_type)
        on_fabric = machine is not None and machine.nvswitch is not False
    return baseline(gpu.model, gpu.count) if on_fabric else None

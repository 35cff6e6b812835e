"""TEST FAKE: one simulated GPU host of the fault-injection lab, faked at its process and device boundary.

What the node agent (corral/health/agent.py) reads and runs on a GPU node, answered from this object's
state instead of hardware, in simulated time (tests/health/simclock.py):

- FAKE_kmsg_follower: stands in for the agent's KernelLogFollower, the thread blocked on /dev/kmsg. The
  lab writes kernel records into this host's ring buffer; the fake hands the fault lines to the agent as
  the real follower does (classify.fault_line), at once and in simulated time. Its first "read" after an
  agent (re)start returns the backlog, as /dev/kmsg's first read() does.
- FAKE_nvidia_smi: the agent's `run` for nvidia-smi: GPU count, ECC, row-remap, NVLink state, the
  processes holding a GPU (--query-compute-apps) and a GPU reset (`-r -i N`).
- FAKE_host_command: the agent's `run_on_host` (nsenter into the host): `dcgmi diag -r N -j`,
  nccl-tests' `all_reduce_perf`, and a reboot (`systemctl reboot` / `reboot`), which the lab carries
  out: the agent's pod goes away, the host boots again with a new boot id, its ring buffer empty, its
  GPUs healthy unless the case says the GPU is really broken (then the fault is back and burn-in fails).
- RoCE ports: files under a fake /sys/class/infiniband.

Nothing here decides anything the agent or the controller should decide: it only answers as the
hardware would.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ..detectlab import PCI, XID_TEXT, DetectionLab
from ..loadsim import H100
from ..nccl_output import all_reduce_perf

# The GPU a fault lands on (the lab's faults hit one GPU of eight).
FAULTY_GPU = 3
# How long the simulated host's operations take. DCGM's run levels as NVIDIA's dcgmi-diag reference
# gives them (docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-diag.html:
# level 1 "seconds", 2 "approximately two minutes", 3 "approximately 15 minutes", 4 "extended, longer";
# 1 and 4 are this lab's picks within those words). The rest are the lab's assumptions, not upstream
# figures (the benchmark reports the loop's own times around them): a bare-metal GPU server's reboot to a
# running kubelet and agent, `nvidia-smi -r`, one all_reduce_perf run.
REBOOT_SECONDS = 180.0
RESET_SECONDS = 5.0
DCGM_SECONDS = {1: 30.0, 2: 120.0, 3: 900.0, 4: 3600.0}
NCCL_SECONDS = 60.0
# What the fake all_reduce_perf reports, as a share of the pool's published baseline (the agent's config,
# corral/health/baselines.py): a healthy node a little under the published run, a broken one well under.
HEALTHY_SHARE, BROKEN_SHARE = 0.98, 0.6


def bus_id(gpu: int) -> str:
    """nvidia-smi's pci.bus_id of GPU `gpu`; the faulty GPU's is the kernel's Xid line's (detectlab.PCI)."""
    return f"00000000:{0x28 + gpu:02X}:00.0"

# Application Xids 13/31/43 and the fatal ones are detectlab's; Xid 46 for the burn-in case.
XID_TEXT = {**XID_TEXT, 46: "pid=4410, GPU stopped processing"}


@dataclass
class HostState:
    """The hardware's state (survives nothing but what real hardware survives)."""
    gpu_count: int = 8
    ecc_dbe: int = 0
    remap_failure: bool = False
    nvlink_inactive: bool = False
    roce_down: bool = False
    gpu_processes: list[int] = field(default_factory=list)   # GPUs a process holds


class SimulatedGpuHost:
    """One GPU host: its fake devices, its ring buffer, its boots."""

    def __init__(self, lab, name: str, folder: Path, *, rack: str | None) -> None:
        self.lab, self.name, self.folder, self.rack = lab, name, folder, rack
        folder.mkdir(parents=True, exist_ok=True)
        self.sysfs = folder / "FAKE_sys_class_infiniband"
        port = self.sysfs / "mlx5_0" / "ports" / "1"
        port.mkdir(parents=True, exist_ok=True)
        (self.sysfs / "mlx5_0" / "device" / "net" / "ens1f0np0").mkdir(parents=True, exist_ok=True)
        (port / "phys_state").write_text("5: LinkUp\n")
        self.state = HostState()
        self.ring: list[str] = []           # the kernel's ring buffer, this boot
        self.seq = 0
        self.boots = 0
        self.follower = None                # the running agent's FAKE_kmsg_follower
        # What the case says about the hardware:
        self.broken: str | None = None      # a fault kind that comes back after every repair
        self.burn_in_faults: list[str | None] = []   # per burn-in run: a fault that fires during it
        self.calls: list[tuple[float, str]] = []       # (sim time, argv) of what the agent ran here
        self.resets = 0
        self.reboots = 0
        self.boot()

    # -- boots -------------------------------------------------------------------------------

    @property
    def boot_id(self) -> str:
        return f"{self.name}-boot-{self.boots}"

    def boot(self) -> None:
        """A (re)boot: a new boot id, an empty ring buffer, the GPUs as the hardware really is, the
        preflight unit's verdict of this boot (it checks what a boot-time check sees: the GPU count)."""
        self.boots += 1
        self.ring = []
        self.state = HostState()
        self._write_port()
        if self.broken:
            self._apply(self.broken, at_boot=True)
        passed = self.state.gpu_count == 8
        (self.folder / "boot_id").write_text(self.boot_id + "\n")
        (self.folder / "preflight.json").write_text(json.dumps(
            {"passed": passed, "reason": "AllChecksPassed" if passed else "GPUCountMismatch",
             "message": f"{self.state.gpu_count} x H100", "boot_id": self.boot_id}))

    def _write_port(self) -> None:
        (self.sysfs / "mlx5_0" / "ports" / "1" / "state").write_text(
            "1: DOWN\n" if self.state.roce_down else "4: ACTIVE\n")

    # -- faults ------------------------------------------------------------------------------

    def kernel_record(self, message: str, prio: int = 3) -> None:
        """One record into the ring buffer, as the kernel formats it (Documentation/ABI/testing/dev-kmsg)."""
        self.seq += 1
        # Stamped as the kernel stamps them: the monotonic clock (the agent compares a GPU reset's
        # moment, read from the same clock, with the records' stamps).
        line = f"{prio},{self.seq},{time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000},-;{message}"
        self.ring.append(line)
        if self.follower is not None:
            self.follower.written(line)

    def inject(self, kind: str, *, broken: bool = False) -> None:
        """The fault `kind` now; `broken`: the hardware stays broken (it comes back after a repair)."""
        if broken:
            self.broken = kind
        self._apply(kind, at_boot=False)

    def heal(self, kind: str) -> None:
        """A transient device fault clears by itself (a flapping link comes back)."""
        if kind == "roce-port-down":
            self.state.roce_down = False
            self._write_port()
        elif kind == "nvlink-down":
            self.state.nvlink_inactive = False

    def _apply(self, kind: str, *, at_boot: bool) -> None:
        if kind.startswith("xid"):
            if not at_boot:      # a broken GPU's Xid comes back when it is used (burn-in), not at boot
                self.kernel_record(f"NVRM: Xid (PCI:{PCI}): {int(kind[3:])}, {XID_TEXT[int(kind[3:])]}")
        elif kind == "pcie-fatal":
            if not at_boot:
                self.kernel_record("pcieport 0000:16:02.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0")
        elif kind == "ecc-double-bit":
            self.state.ecc_dbe = 2
        elif kind == "row-remap-failure":
            self.state.remap_failure = True
        elif kind == "gpu-off-the-bus":
            self.state.gpu_count = 7
        elif kind == "nvlink-down":
            self.state.nvlink_inactive = True
        elif kind == "roce-port-down":
            self.state.roce_down = True
            self._write_port()
        else:
            raise ValueError(f"unknown fault kind {kind}")

    # -- the agent's process boundary ----------------------------------------------------------

    def FAKE_nvidia_smi(self, argv: list[str]) -> str | None:
        """The agent's `run(argv)`: stdout, or None for a failed or missing program."""
        if argv[:1] != ["nvidia-smi"]:
            return None
        self.calls.append((self.lab.clock.now(), shlex.join(argv)))
        state, gpus = self.state, range(self.state.gpu_count)
        if "-r" in argv or "--gpu-reset" in argv:
            return self._reset(argv)
        if "--query-compute-apps=pid,gpu_bus_id" in argv:
            return "".join(f"{4400 + i}, {bus_id(i)}\n" for i in state.gpu_processes if i in gpus)
        if "--query-gpu=index,pci.bus_id" in argv:
            return "".join(f"{i}, {bus_id(i)}\n" for i in gpus)
        # The GPUs' identity, memory and NVLink state: answered as detectlab's one-node fake answers them.
        return DetectionLab.FAKE_nvidia_smi(SimpleNamespace(gpu={
            "count": state.gpu_count, "ecc_dbe": state.ecc_dbe, "remap_failure": state.remap_failure,
            "nvlink_inactive": state.nvlink_inactive}), argv)

    def _reset(self, argv: list[str]) -> str | None:
        """`nvidia-smi -r [-i N]`: refused while a process holds the GPU (nvidia-smi's own rule); takes a
        few seconds; clears the GPU's volatile state unless the hardware is really broken."""
        gpu = int(argv[argv.index("-i") + 1]) if "-i" in argv else None
        if (gpu is None and self.state.gpu_processes) or gpu in self.state.gpu_processes:
            return None          # "GPU is in use": nvidia-smi refuses
        if self.state.gpu_count < 8 or (gpu is not None and gpu >= self.state.gpu_count):
            return None          # a GPU off the bus cannot be reset, only power-cycled
        self.lab.clock.sleep(RESET_SECONDS)
        self.resets += 1
        self.state = HostState(roce_down=self.state.roce_down)
        if self.broken and not self.broken.startswith("xid") and self.broken != "pcie-fatal":
            self._apply(self.broken, at_boot=True)
        return "GPU 00000000:2B:00.0 was successfully reset.\nAll done.\n"

    def FAKE_host_command(self, config: dict, argv: list[str], timeout: int) -> tuple[int, str] | None:
        """The agent's `run_on_host`: (exit status, stdout), None when the program is not installed."""
        self.calls.append((self.lab.clock.now(), shlex.join(argv)))
        if argv[:1] == ["nvidia-smi"]:
            out = self.FAKE_nvidia_smi(argv)
            self.calls.pop()          # recorded once, by FAKE_nvidia_smi
            return (0, out) if out is not None else (3, "")
        if argv[:1] in (["reboot"], ["/sbin/reboot"]) or argv[:2] == ["systemctl", "reboot"]:
            self.lab.reboot_later(self)
            return 0, ""
        if argv[:2] == ["dcgmi", "diag"]:
            level = int(argv[argv.index("-r") + 1]) if "-r" in argv else 1
            during = self.burn_in_faults.pop(0) if self.burn_in_faults else None
            self.lab.clock.sleep(DCGM_SECONDS.get(level, 600.0) / 2)
            if during:
                self._apply(during, at_boot=False)
            elif self.broken:
                self._apply(self.broken, at_boot=False)     # used again, the broken GPU fails again
            self.lab.clock.sleep(DCGM_SECONDS.get(level, 600.0) / 2)
            failing = bool(during or self.broken)
            results = [{"gpu_id": str(i), "status": "Fail" if failing and i == FAULTY_GPU else "Pass"}
                       for i in range(8)]
            report = {"DCGM GPU Diagnostic": {"test_categories": [
                {"category": "Hardware", "tests": [{"name": "Memory", "results": results}]}]}}
            return (226 if failing else 0), json.dumps(report)
        if argv[:1] == ["all_reduce_perf"] or (argv and argv[0].endswith("/all_reduce_perf")):
            self.lab.clock.sleep(NCCL_SECONDS)
            baseline = ((config["pools"].get(self.lab.pool_name) or {}).get("burn_in") or {}).get("baseline_gbps")
            if not baseline:
                return 1, "all_reduce_perf: the lab's pool has no published baseline to perform at\n"
            busbw = baseline * (BROKEN_SHARE if self.broken else HEALTHY_SHARE)
            return 0, all_reduce_perf(round(busbw, 3), device=H100)
        return None


class FAKE_kmsg_follower:
    """Stands in for agent.KernelLogFollower on a simulated host: the same constructor, the same
    delivery (fault lines only, as a list, at once), the backlog on start."""

    def __init__(self, host: SimulatedGpuHost, classify, deliver, stopped) -> None:
        self.host, self.classify, self.deliver, self.stopped = host, classify, deliver, stopped
        self.overruns = 0

    def start(self) -> None:
        self.host.follower = self
        backlog = [line for line in self.host.ring if self.classify.fault_line(line)]
        if backlog:
            self.deliver(backlog)

    def written(self, line: str) -> None:
        if not self.stopped() and self.classify.fault_line(line):
            self.deliver([line])

"""TEST FAKE: one GPU node, in real time, for the health agent's fault detection.

The real agent (corral/health/agent.py, loaded as its pod loads it) runs in
a thread of its own on the real clock (SystemClock) and talks HTTPS to the
recording fake API server (fake_apiserver.py). Its host is faked at the
process and file boundary:

- FAKE_kmsg: a FIFO standing in for /dev/kmsg. The lab writes kernel records
  into it ("prio,seq,usec,flags;message\\n", the kernel's
  Documentation/ABI/testing/dev-kmsg format); the agent's follower reads them
  as it would the device.
- FAKE_nvidia_smi: the agent's `run` for nvidia-smi, answering from this
  lab's GPU state (a GPU missing, ECC errors, a failed row remap, an inactive
  NVLink) instead of a program.
- FAKE sysfs: /sys/class/infiniband/<dev>/ports/1/state files for the RoCE port.

Used by tests/health/test_detection.py (does each fault taint, with which
effect) and benchmarks/bench_detection.py (how long from injection to the
taint's PATCH).
"""

from __future__ import annotations

import copy
import json
import os
import random
import threading
import time
from pathlib import Path

from corral.health import addon

from .fake_apiserver import FakeCluster
from .loadsim import H100, POOL, gpu_node, load_agent, serve

UNHEALTHY = "corral.dev/unhealthy"
PCI = "0000:2b:00"

# What the NVIDIA driver logs for each Xid (the text after the code is for people;
# the classifier reads the code). Messages as NVIDIA's Xid catalog names the events.
XID_TEXT = {
    13: "pid=4410, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)",
    31: "pid=4410, name=python, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS faulted @ 0x7f1a_00000000",
    43: "pid=4410, name=python, Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6",
    63: "pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "pid=1896, Row Remapper: Row remapping failed, reset gpu to retry.",
    74: "pid=2231, NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "pid=2213, GPU has fallen off the bus.",
    92: "pid=0, High single-bit ECC error rate",
    94: "pid=4410, Contained: SM (0x1). RST: No, D-RST: No",
    95: "pid=4410, Uncontained: FBHUB. RST: Yes, D-RST: No",
}

# Every fault the issue names, how it is injected, and what it must do to the node.
# (kind, where, the condition it sets, the taint effect with evictOnFatal: true)
FAULTS = [
    ("xid48", "kmsg", "GPUXidFault", "NoExecute"),
    ("xid63", "kmsg", "GPUXidFault", "NoSchedule"),
    ("xid64", "kmsg", "GPUXidFault", "NoExecute"),
    ("xid74", "kmsg", "GPUNVLinkFault", "NoExecute"),
    ("xid79", "kmsg", "GPUXidFault", "NoExecute"),
    ("xid92", "kmsg", "GPUXidFault", "NoSchedule"),
    ("xid94", "kmsg", "GPUXidFault", "NoSchedule"),
    ("xid95", "kmsg", "GPUXidFault", "NoExecute"),
    ("pcie-fatal", "kmsg", "GPUPCIeFault", "NoExecute"),
    ("ecc-double-bit", "nvidia-smi", "GPUMemoryFault", "NoSchedule"),
    ("row-remap-failure", "nvidia-smi", "GPUMemoryFault", "NoExecute"),
    ("gpu-off-the-bus", "nvidia-smi", "GPUMissing", "NoExecute"),
    ("nvlink-down", "nvidia-smi", "GPUNVLinkFault", "NoSchedule"),
    ("roce-port-down", "sysfs", "RoCELinkFault", "NoSchedule"),
]


class DetectionLab:
    """One node, its agent, and the faults to inject into its fake host."""

    def __init__(self, workdir: Path, *, interval_seconds: float, nvlink: bool = True, roce: bool = True) -> None:
        from corral.model.loader import load_cluster

        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        root = Path(__file__).resolve().parents[2]
        config = copy.deepcopy(addon.agent_config(load_cluster(root / "clusters" / "jaguar.yaml")))
        self.cluster = FakeCluster()
        self.server, self.sa_dir = serve(self.cluster, workdir)
        self.host = workdir / "host"
        self.host.mkdir(exist_ok=True)
        self.kmsg = self.host / "FAKE_kmsg"
        os.mkfifo(self.kmsg)
        # Read-write: opening does not wait for the agent, and records written
        # before it starts wait in the pipe: its backlog.
        self.kmsg_fd = os.open(self.kmsg, os.O_RDWR)
        self.sysfs = self.host / "FAKE_sys_class_infiniband"
        port = self.sysfs / "mlx5_0" / "ports" / "1"
        port.mkdir(parents=True)
        (self.sysfs / "mlx5_0" / "device" / "net" / "ens1f0np0").mkdir(parents=True)
        (port / "phys_state").write_text("5: LinkUp\n")
        pool = dict(config["pools"][POOL], nvlink=nvlink, roce_interfaces=["ens1f0np0"] if roce else [],
                    run_preflight=False, preflight_script=None)
        self.config = dict(config, pools={POOL: pool}, interval_seconds=interval_seconds,
                           active=dict(config["active"], enabled=False),
                           verdict_path=str(self.host / "preflight.json"), kernel_log=str(self.kmsg),
                           boot_id_path=str(self.host / "boot_id"), infiniband_sysfs=str(self.sysfs))
        self.seq = 0
        self.boots = 0
        self.gpu: dict = {}
        self.boot()
        self.cluster.put("nodes", gpu_node("gpu-001"))
        self.module = load_agent(addon.HERE, name=f"corral_health_agent_detect_{random.randrange(1 << 30)}")
        self.module.run = self.FAKE_nvidia_smi
        self.agent = None

    # -- the fake host ------------------------------------------------------------------

    def boot(self) -> None:
        """A (re)boot: healthy hardware, a new boot id, a passing verdict of it."""
        self.boots += 1
        boot_id = f"gpu-001-boot-{self.boots}"
        self.gpu = {"count": 8, "ecc_dbe": 0, "remap_failure": False, "nvlink_inactive": False}
        (self.sysfs / "mlx5_0" / "ports" / "1" / "state").write_text("4: ACTIVE\n")
        (self.host / "boot_id").write_text(boot_id + "\n")
        (self.host / "preflight.json").write_text(json.dumps(
            {"passed": True, "reason": "AllChecksPassed", "message": "8 x H100", "boot_id": boot_id}))

    def FAKE_nvidia_smi(self, argv: list[str]) -> str | None:  # noqa: N802  (named as the fake it is)
        if argv[:1] != ["nvidia-smi"]:
            return None
        gpus = range(self.gpu["count"])
        if "--query-gpu=index,name" in argv:
            return "".join(f"{i}, {H100}\n" for i in gpus)
        if any(a.startswith("--query-gpu=") for a in argv):
            return "".join(f"{i}, {self.gpu['ecc_dbe'] if i == 3 else 0}, No, "
                           f"{'Yes' if self.gpu['remap_failure'] and i == 3 else 'No'}, [N/A]\n" for i in gpus)
        if argv[1:3] == ["nvlink", "-s"]:
            return "".join(f"GPU {i}: {H100} (UUID: GPU-{i})\n\t Link 0: 26.562 GB/s\n\t Link 1: "
                           f"{'<inactive>' if self.gpu['nvlink_inactive'] and i == 5 else '26.562 GB/s'}\n"
                           for i in gpus)
        return ""

    def kernel_record(self, message: str, prio: int = 3) -> None:
        """One record into the fake /dev/kmsg, as the kernel formats it."""
        self.seq += 1
        usec = int(time.monotonic() * 1e6)
        os.write(self.kmsg_fd, f"{prio},{self.seq},{usec},-;{message}\n".encode())

    def xid(self, code: int) -> None:
        self.kernel_record(f"NVRM: Xid (PCI:{PCI}): {code}, {XID_TEXT[code]}")

    def inject(self, kind: str) -> None:
        if kind.startswith("xid"):
            self.xid(int(kind[3:]))
        elif kind == "pcie-fatal":
            self.kernel_record("pcieport 0000:16:02.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0")
        elif kind == "ecc-double-bit":
            self.gpu["ecc_dbe"] = 2
        elif kind == "row-remap-failure":
            self.gpu["remap_failure"] = True
        elif kind == "gpu-off-the-bus":
            self.gpu["count"] = 7
        elif kind == "nvlink-down":
            self.gpu["nvlink_inactive"] = True
        elif kind == "roce-port-down":
            (self.sysfs / "mlx5_0" / "ports" / "1" / "state").write_text("1: DOWN\n")
        else:
            raise ValueError(f"unknown fault kind {kind}")

    # -- the agent and what it wrote --------------------------------------------------------

    def start_agent(self) -> None:
        api = self.module.Api(base=self.server.url, sa_dir=str(self.sa_dir), user_agent="corral-gpu-health/gpu-001")
        self.agent = self.module.Agent(api, self.config, "gpu-001", clock=self.module.SystemClock,
                                       rng=random.Random(1))
        threading.Thread(target=self.agent.run, name="agent", daemon=True).start()

    def node(self) -> dict:
        return self.cluster.get("nodes", "gpu-001")

    def taint(self) -> dict | None:
        return next((t for t in self.node()["spec"].get("taints") or [] if t["key"] == UNHEALTHY), None)

    def condition(self, ctype: str) -> dict | None:
        return next((c for c in self.node()["status"].get("conditions") or [] if c["type"] == ctype), None)

    def wait(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.005)
        return predicate()

    def taint_patches_since(self, start: float) -> list[dict]:
        with self.cluster.lock:
            return [r for r in self.cluster.requests if r["t"] >= start and (r["verb"], r["resource"]) == (
                "patch", "nodes")]

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        os.close(self.kmsg_fd)          # the follower's read ends (no writer left)
        self.server.stop()

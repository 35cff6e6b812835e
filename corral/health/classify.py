"""Passive GPU health: kernel-log lines and nvidia-smi/rdma outputs -> faults -> taint.

Standard library only: the health agent runs this file as it is, from its
ConfigMap, in a stock Python image (docs/gpu-health.md). Everything here is
a pure function of text, so tests feed it recorded outputs.

A fault has a node condition (type), a reason and message for it, and a
severity: `fatal` (the GPU, its memory or its links are gone: running jobs
are already lost, pods are evicted when the cluster file says so) or
`degraded` (needs a GPU reset or reboot soon, or a link is down: no new
work). Xid classes come from the cluster file (`health.xid`), defaulting
to NVIDIA's Xid catalog as XID_CATALOG below classifies it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

FATAL, DEGRADED = "fatal", "degraded"

# Node conditions, True while the fault stands (node-problem-detector's
# convention: a condition names a problem).
XID_CONDITION = "GPUXidFault"
MEMORY_CONDITION = "GPUMemoryFault"
NVLINK_CONDITION = "GPUNVLinkFault"
PCIE_CONDITION = "GPUPCIeFault"
ROCE_CONDITION = "RoCELinkFault"
GPU_MISSING_CONDITION = "GPUMissing"
ACTIVE_CONDITION = "GPUActiveCheckFault"
FAULT_CONDITIONS = (XID_CONDITION, MEMORY_CONDITION, NVLINK_CONDITION, PCIE_CONDITION, ROCE_CONDITION,
                    GPU_MISSING_CONDITION, ACTIVE_CONDITION)
PREFLIGHT_CONDITION = "GPUPreflightPassed"

# "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: ..." (R470 and later)
# "NVRM: Xid (0000:01:00): 13, Graphics SM Warp Exception ..." (older drivers)
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+),\s*(?P<text>.*)")
# PCIe Advanced Error Reporting, as the kernel's aer driver logs it:
# "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0"
AER_LINE = re.compile(r"(?P<dev>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]):? AER: "
                      r"(?P<kind>Uncorrected \((?:Fatal|Non-Fatal)\)|Corrected) error")
# Xids that are about NVLink rather than the GPU's own state.
NVLINK_XIDS = frozenset({74})

# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
# "Resolution Bucket (Immediate Action)" and "(Investigatory Action)"; read in
# the copy leptonai/gpud generates from the catalog's spreadsheet,
# components/accelerator/nvidia/xid/catalog_generated.go, 2025-10-29).
# code: (description, immediate action, investigatory action)
XID_CATALOG: dict[int, tuple[str, str, str]] = {
    13: ("Graphics Engine Exception", "RESTART_APP", "WORKFLOW_XID_13"),
    31: ("GPU memory page fault", "RESTART_APP", "WORKFLOW_XID_31"),
    43: ("GPU stopped processing", "IGNORE", "CONTACT_SUPPORT"),
    45: ("Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45", "IGNORE (follow other Xid)"),
    46: ("GPU stopped processing", "RESET_GPU", "CONTACT_SUPPORT"),
    48: ("Double Bit ECC Error", "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
    54: ("Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS", "CONTACT_SUPPORT"),
    61: ("Unused (Ampere and later)", "CONTACT_SUPPORT", ""),
    62: ("Internal micro-controller halt", "RESET_GPU", "CONTACT_SUPPORT"),
    63: ("GPU memory remapping event", "IGNORE", "IGNORE"),
    64: ("GPU memory remapping failure", "RESET_GPU", "CONTACT_SUPPORT"),
    74: ("NVLINK Error", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
    79: ("GPU has fallen off the bus", "RESTART_BM", "CONTACT_SUPPORT"),
    92: ("High single-bit ECC error rate", "IGNORE", "CONTACT_SUPPORT"),
    94: ("Contained memory error", "RESTART_APP", "IGNORE (sympathetic)"),
    95: ("Uncontained memory error", "RESET_GPU", "IGNORE (sympathetic)"),
    109: ("Context Switch Timeout Error", "RESET_GPU", "CONTACT_SUPPORT"),
    110: ("Security Fault Error", "RESET_GPU", "INVESTIGATE_SW"),
    119: ("GSP RPC Timeout", "RESET_GPU", "INVESTIGATE_SW"),
    120: ("GSP Error", "RESET_GPU", "INVESTIGATE_SW"),
    136: ("Link Training Failed", "RESET_GPU", "INVESTIGATE_LINK_SI"),
    140: ("ECC Unrecovered Error", "RESET_GPU", "CONTACT_SUPPORT"),
    143: ("GPU Initialization Error", "RESET_GPU", "CONTACT_SUPPORT"),
    154: ("GPU Recovery Action Changed", "XID_154", "N/A Informational only regarding another Xid"),
    155: ("NVLINK: SW Defined Error", "RESET_GPU", "INVESTIGATE_SW_USER"),
    156: ("Resource Retirement Event", "RESET_GPU", "IGNORE"),
    158: ("GPU Fatal Timeout", "RESET_GPU", "CONTACT_SUPPORT"),
}
# What each immediate action means for the node. RESTART_BM: the GPU is gone
# from the bus, only a power cycle brings it back. RESET_GPU and the workflows
# of Xid 48 (solo: reset; with 63/64: drain and reset) and 74 (reset or
# reboot): "Terminate all GPU processes, reset the GPU" (NVIDIA's A100 memory
# error management, "Error Recovery and Response Flags"). Either way the jobs
# on the GPU are lost: corral's fatal severity.
NODE_RESTART_ACTIONS = frozenset({"RESTART_BM"})
GPU_RESET_ACTIONS = frozenset({"RESET_GPU", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR"})
# CHECK_MECHANICALS (Xid 54, the board's auxiliary power: its mnemonic SILENT_RUNNING_PWR_REDUCED_CLOCKING,
# the GPU runs throttled): a person at the machine. No new work, and neither a reset nor a reboot
# reconnects a cable, so none is attempted: the node waits for hands (corral's "hardware" class).
HARDWARE_ACTIONS = frozenset({"CHECK_MECHANICALS"})
# Xid 154 (R555 and later) reports the recovery the driver now asks of a GPU, in its text: "GPU recovery
# action changed from 0x0 (None) to 0x2 (Node Reboot Required)". The number is NVML's
# nvmlDeviceGpuRecoveryAction_t (nvml.h: NONE 0, GPU_RESET 1, NODE_REBOOT 2, DRAIN_P2P 3,
# DRAIN_AND_RESET 4, GPU_RESET_BUS 5); the words differ between drivers ("OS Reboot"), the number does
# not. The catalog's resolution is "XID_154": follow it. So 154's severity is read from its text
# (recovery_action_severity); corral carries out every action but "none" by reboot (a reboot clears
# each of them, and corral does not drain P2P traffic itself).
RECOVERY_ACTION_XID = 154
RECOVERY_ACTION = re.compile(r"recovery action changed from 0x[0-9a-fA-F]+(?: \([^)]*\))? to 0x(?P<action>[0-9a-fA-F]+)")
# Drain actions leave the GPU's unaffected work running ("reduced capacity"): no new work, no eviction.
DRAIN_RECOVERY_ACTIONS = frozenset({3, 4})
# Where corral is stricter than the immediate action, and why (docs/gpu-health.md):
# the running job may go on, but no new work until a reset (a remediation reboot).
HELD_FOR_RESET_XIDS = {
    61: "CONTACT_SUPPORT (the catalog lists it unused from Ampere on: older GPUs only)",
    63: "a remapped row is activated only by the next GPU reset (remapped_rows.pending)",
    92: "investigatory CONTACT_SUPPORT: the memory is failing",
    94: "a contained error leaves its row remap pending the next GPU reset",
}
# Where corral is more lenient: Xid 109 is raised by a job's own context-switch
# timeout (NVIDIA k8s-device-plugin v0.17.1 stopped marking GPUs unhealthy on
# it; docs/addons.md), so it is the job's fault, not the node's.
APPLICATION_OVERRIDES = frozenset({109})


def xid_class(code: int) -> str:
    """`node-restart`, `gpu-reset`, `recovery-action` (Xid 154: what its text asks), `held` (no new work
    until a reset), `hardware` (no new work until a person fixes the machine) or `application` (the
    job's own fault: not acted on)."""
    immediate = XID_CATALOG.get(code, ("", "", ""))[1]
    if code in APPLICATION_OVERRIDES:
        return "application"
    if code == RECOVERY_ACTION_XID:
        return "recovery-action"
    if immediate in HARDWARE_ACTIONS:
        return "hardware"
    if immediate in NODE_RESTART_ACTIONS:
        return "node-restart"
    if immediate in GPU_RESET_ACTIONS:
        return "gpu-reset"
    if code in HELD_FOR_RESET_XIDS:
        return "held"
    return "application"


def catalog_xid_classes() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(fatal, degraded) Xids by the catalog: the cluster file's defaults
    (corral.model.schema.DEFAULT_FATAL_XIDS / DEFAULT_DEGRADED_XIDS must equal them)."""
    classes = {code: xid_class(code) for code in XID_CATALOG}
    fatal = tuple(sorted(c for c, k in classes.items() if k in ("node-restart", "gpu-reset", "recovery-action")))
    degraded = tuple(sorted(c for c, k in classes.items() if k in ("held", "hardware")))
    return fatal, degraded


@dataclass(frozen=True)
class Fault:
    condition: str
    reason: str
    message: str
    severity: str


@dataclass(frozen=True)
class XidEvent:
    pci: str
    code: int
    text: str
    usec: int | None = None   # the /dev/kmsg record's time since boot; None in saved logs without the prefix


# A /dev/kmsg record's prefix, "prio,seq,usec,flags;" (the kernel's
# Documentation/ABI/testing/dev-kmsg). prio is facility << 3 | level, and
# "it is not possible to inject messages from userspace with the facility
# number LOG_KERN (0)": a record of another facility was written by a process
# (a pod that can write the host's /dev/kmsg), not by the driver.
KMSG_PREFIX = re.compile(r"^(?P<prio>\d+),\d+,(?P<usec>\d+),[^;]*;")


def from_userspace(line: str) -> bool:
    """A /dev/kmsg record a process wrote (not the kernel's facility): never a GPU's fault."""
    match = KMSG_PREFIX.match(line)
    return bool(match) and int(match["prio"]) >> 3 != 0


def kernel_lines(lines) -> list[str]:
    """The lines the kernel itself logged (saved logs without the record prefix count as such)."""
    return [line for line in lines if not from_userspace(line)]


def fault_line(line: str) -> bool:
    """Whether a kernel-log line may be a fault (an Xid or an uncorrected PCIe
    error, logged by the kernel): the kernel-log follower wakes the agent only for these."""
    return not from_userspace(line) and bool(XID_LINE.search(line) or (AER_LINE.search(line) and "Uncorrected" in line))


def xid_events(lines) -> list[XidEvent]:
    """Xid reports in kernel-log lines (dmesg, /dev/kmsg records, journal lines)."""
    events = []
    for line in lines:
        match = XID_LINE.search(line)
        if match:
            prefix = KMSG_PREFIX.match(line)
            events.append(XidEvent(match["pci"].lower(), int(match["code"]), match["text"].strip(),
                                   int(prefix["usec"]) if prefix else None))
    return events


def pci_key(address: str) -> str:
    """bus:device of a PCI address, however it is written: the kernel's Xid line says
    "0000:2b:00" or "PCI:0000:2b:00", nvidia-smi's pci.bus_id "00000000:2B:00.0"."""
    parts = address.lower().removeprefix("pci:").split(":")
    return ":".join(p.split(".")[0] for p in parts[-2:]) if len(parts) >= 2 else address.lower()


def since_reset(events: list[XidEvent], resets: dict[str, int]) -> list[XidEvent]:
    """The events that are not older than their GPU's last reset (`resets`: pci_key -> the kernel
    log's time since boot, usec, at the reset). A reset GPU starts a new epoch: what it reported
    before is gone with its state. A line without a time (a saved log) on a reset GPU cannot be
    placed after the reset and counts as before it."""
    return [e for e in events
            if pci_key(e.pci) not in resets or (e.usec is not None and e.usec > resets[pci_key(e.pci)])]


def reset_refusal(codes) -> str | None:
    """Why a GPU reset would not clear these Xids, or None when it would. By the catalog's immediate
    action (XID_CATALOG above): RESTART_BM (Xid 79, the GPU is off the bus) needs a power cycle, not a
    reset; RESET_GPU and the Xid 48 and NVLink workflows are cleared by one; the held Xids wait for one
    (HELD_FOR_RESET_XIDS). Xids outside the catalog: not known to be cleared by a reset."""
    refused = []
    for code in sorted(set(codes)):
        kind = xid_class(code) if code in XID_CATALOG else "unknown"
        if kind == "node-restart":
            refused.append(f"Xid {code} ({XID_CATALOG[code][0]}) needs a reboot: NVIDIA's catalog says "
                           f"{XID_CATALOG[code][1]}")
        elif kind == "recovery-action":
            refused.append(f"Xid {code} ({XID_CATALOG[code][0]}): the driver's recovery action is carried out "
                           "by a reboot")
        elif kind == "hardware":
            refused.append(f"Xid {code} ({XID_CATALOG[code][0]}) needs a person at the machine: NVIDIA's catalog "
                           f"says {XID_CATALOG[code][1]}; no reset or reboot reconnects it")
        elif kind == "unknown":
            refused.append(f"Xid {code} is not in NVIDIA's catalog: a reset is not known to clear it")
    return "; ".join(refused) or None


def xid_faults(events: list[XidEvent], fatal: set[int], degraded: set[int]) -> list[Fault]:
    """One fault per Xid class seen, worst first; Xids in neither class are not faults."""
    faults = []
    # Xid 154 says what recovery the GPU now needs; a change back to "none" is the recovery done.
    events = [e for e in events if e.code != RECOVERY_ACTION_XID or recovery_action(e.text) != 0]
    for code in sorted({e.code for e in events}):
        if code not in fatal and code not in degraded:
            continue
        where = sorted({e.pci for e in events if e.code == code})
        sample = next(e.text for e in events if e.code == code)
        condition = NVLINK_CONDITION if code in NVLINK_XIDS else XID_CONDITION
        severity = FATAL if code in fatal else DEGRADED
        if code == RECOVERY_ACTION_XID and code in fatal:
            severity = recovery_action_severity([e.text for e in events if e.code == code])
        faults.append(Fault(condition, f"Xid{code}", f"Xid {code} on {', '.join(where)}: {sample[:160]}", severity))
    return sorted(faults, key=lambda f: f.severity != FATAL)


def recovery_action(text: str) -> int | None:
    """The NVML recovery action an Xid 154 line changes to, or None when the text does not say."""
    match = RECOVERY_ACTION.search(text)
    return int(match["action"], 16) if match else None


def recovery_action_severity(texts: list[str]) -> str:
    """Xid 154's severity, by the worst action its lines ask for: a drain leaves unaffected work
    running (degraded); a reset, a reboot or an action not known or not read loses the GPU's work (fatal)."""
    actions = {recovery_action(text) for text in texts}
    return DEGRADED if actions and actions <= DRAIN_RECOVERY_ACTIONS else FATAL


def pcie_faults(lines) -> list[Fault]:
    """Uncorrected AER errors: fatal ones lose the device, non-fatal ones degrade it; corrected ones are noise."""
    worst: dict[str, str] = {}
    for line in lines:
        match = AER_LINE.search(line)
        if not match or match["kind"] == "Corrected":
            continue
        severity = FATAL if "(Fatal)" in match["kind"] else DEGRADED
        if worst.get(match["dev"]) != FATAL:
            worst[match["dev"]] = severity
    if not worst:
        return []
    severity = FATAL if FATAL in worst.values() else DEGRADED
    devices = ", ".join(f"{dev} ({sev})" for dev, sev in sorted(worst.items()))
    return [Fault(PCIE_CONDITION, "PCIeUncorrectedError", f"uncorrected PCIe errors: {devices}", severity)]


MEMORY_FIELDS = ("index", "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending",
                 "remapped_rows.failure", "retired_pages.pending")
NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")


def _rows(text: str, fields) -> list[dict]:
    rows = []
    for line in text.splitlines():
        if line.strip():
            values = [v.strip() for v in line.split(",")]
            if len(values) == len(fields):
                rows.append({f: (None if v in NOT_AVAILABLE else v) for f, v in zip(fields, values)})
    return rows


def memory_faults(smi_csv: str) -> list[Fault]:
    """`nvidia-smi --query-gpu=<MEMORY_FIELDS> --format=csv,noheader,nounits` -> memory faults."""
    failed, pending = [], []
    for row in _rows(smi_csv, MEMORY_FIELDS):
        gpu = f"GPU {row['index']}"
        if (row["remapped_rows.failure"] or "").lower() == "yes":
            failed.append(f"{gpu}: row remapping failed")
        errors = row["ecc.errors.uncorrected.volatile.total"]
        if errors and errors.isdigit() and int(errors) > 0:
            pending.append(f"{gpu}: {errors} uncorrectable ECC errors")
        if (row["remapped_rows.pending"] or "").lower() == "yes":
            pending.append(f"{gpu}: remapped row pending reset")
        if (row["retired_pages.pending"] or "").lower() == "yes":
            pending.append(f"{gpu}: retired page pending reset")
    if failed:
        return [Fault(MEMORY_CONDITION, "RowRemapFailed", "; ".join(failed + pending), FATAL)]
    if pending:
        return [Fault(MEMORY_CONDITION, "MemoryResetPending", "; ".join(pending), DEGRADED)]
    return []


def gpu_count_faults(identity_csv: str | None, expected: int) -> list[Fault]:
    """Fewer GPUs than the pool declares (or nvidia-smi failing): the GPU fell off the bus."""
    if identity_csv is None:
        return [Fault(GPU_MISSING_CONDITION, "NvidiaSmiFailed", "nvidia-smi does not answer", FATAL)]
    seen = len([line for line in identity_csv.splitlines() if line.strip()])
    if seen < expected:
        return [Fault(GPU_MISSING_CONDITION, "GPUsMissing", f"{seen} of {expected} GPUs visible", FATAL)]
    return []


def nvlink_faults(nvlink_status: str | None) -> list[Fault]:
    """`nvidia-smi nvlink -s`: any `<inactive>` link on an NVSwitch/NVLink system."""
    if not nvlink_status:
        return []
    gpu, down = None, []
    for line in nvlink_status.splitlines():
        stripped = line.strip()
        if stripped.startswith("GPU "):
            gpu = stripped.split(":")[0]
        elif stripped.startswith("Link ") and "inactive" in stripped.lower():
            down.append(f"{gpu} {stripped.split(':')[0]}")
    if down:
        return [Fault(NVLINK_CONDITION, "NVLinkInactive", f"inactive NVLinks: {', '.join(down[:16])}", DEGRADED)]
    return []


def roce_faults(rdma_links: list[dict] | None, interfaces: list[str]) -> list[Fault]:
    """`rdma -j link`: every RoCE interface of the pool must have an ACTIVE port."""
    if not interfaces:
        return []
    if rdma_links is None:
        return [Fault(ROCE_CONDITION, "RdmaUnavailable", "`rdma -j link` did not answer", DEGRADED)]
    by_netdev = {link.get("netdev"): link for link in rdma_links}
    down = []
    for iface in interfaces:
        link = by_netdev.get(iface)
        if link is None:
            down.append(f"{iface}: no RDMA port")
        elif link.get("state") != "ACTIVE":
            down.append(f"{iface}: {link.get('state')}/{link.get('physical_state')}")
    if down:
        return [Fault(ROCE_CONDITION, "RoCELinkDown", "; ".join(down), DEGRADED)]
    return []


# --- active checks on idle nodes ------------------------------------------------

GPU_RESOURCE = "nvidia.com/gpu"
# The message size the agent's all_reduce_perf runs at (-b 1G -e 1G, corral/model/nccl_baselines.py
# MESSAGE_BYTES; nccl-tests reads G as 1024^3, src/common.cu parsesize).
NCCL_MESSAGE_BYTES = 1 << 30


def nccl_in_place_busbw(output: str, size: int = NCCL_MESSAGE_BYTES) -> float | None:
    """The in-place busbw (GB/s) of the row for `size` bytes in all_reduce_perf's result table, or None.

    nccl-tests prints a header naming the columns ("size count type redop root", then "time algbw
    busbw #wrong" out of place, the same in place; -R adds per-iteration columns to each half) and
    one row per size (NVIDIA/nccl-tests src/util.cu, writeResultHeader and the row writers). Its
    summary "# Avg bus bandwidth" is no use here: it averages busbw over every size and over BOTH
    placements (src/common.cu adds each run's busBw), while the published baselines are in-place
    busbw at 1 GiB (corral/model/nccl_baselines.py)."""
    columns: list[str] | None = None
    for line in output.splitlines():
        if line.startswith("#"):
            words = line.lstrip("#").split()
            if words[:1] == ["size"] and words.count("busbw") == 2:
                columns = words
            continue
        values = line.split()
        if columns is None or not values or values[0] != str(size):
            continue
        in_place = len(columns) - 1 - columns[::-1].index("busbw")
        try:
            return float(values[in_place])
        except (IndexError, ValueError):
            return None
    return None


def gpu_pods(pods: list[dict]) -> list[str]:
    """namespace/name of the pods that hold GPUs: not finished, a container asking for nvidia.com/gpu."""
    holding = []
    for pod in pods:
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        spec = pod.get("spec", {})
        for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            resources = container.get("resources") or {}
            wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
            if str(wanted.get(GPU_RESOURCE, "0")) not in ("0", ""):
                meta = pod.get("metadata", {})
                holding.append(f"{meta.get('namespace', '?')}/{meta.get('name', '?')}")
                break
    return sorted(holding)


def dcgm_diag_failures(output: str) -> list[str]:
    """Failed tests in `dcgmi diag -r N -j` output: "TEST on GPU N"."""
    report = json.loads(output)
    return [f"{test.get('name', '?')} on GPU {res.get('gpu_id', '?')}"
            for category in report.get("DCGM GPU Diagnostic", {}).get("test_categories", [])
            for test in category.get("tests", [])
            for res in test.get("results", []) if str(res.get("status", "")).lower() == "fail"]


def active_faults(diag: tuple[int, str] | None, nccl: tuple[int, str] | None,
                  min_bus_gbps: float | None) -> list[Fault]:
    """The active check's verdict: (exit status, stdout) of `dcgmi diag` and of nccl-tests'
    all_reduce_perf, None where the tool is not installed. A failure is degraded: no new
    work until a reboot (remediation) and a passing preflight."""
    problems = []
    if diag is not None:
        try:
            failed = dcgm_diag_failures(diag[1])
        except ValueError:
            failed = [] if diag[0] == 0 else [f"dcgmi diag exit {diag[0]}"]
        problems += [f"dcgmi diag: {f}" for f in failed]
    if nccl is not None:
        bus = nccl_in_place_busbw(nccl[1])
        if nccl[0] != 0 or bus is None:
            problems.append(f"all_reduce_perf exit {nccl[0]} without a bus bandwidth")
        elif min_bus_gbps and bus < min_bus_gbps:
            problems.append(f"all_reduce_perf bus bandwidth {bus:g} GB/s, expected at least {min_bus_gbps:g}")
    if not problems:
        return []
    return [Fault(ACTIVE_CONDITION, "ActiveCheckFailed", "; ".join(problems)[:1000], DEGRADED)]


def taint_effect(faults: list[Fault], evict_on_fatal: bool) -> str | None:
    """The corral.dev/unhealthy taint's effect for these faults, or None for a healthy node."""
    if not faults:
        return None
    if evict_on_fatal and any(f.severity == FATAL for f in faults):
        return "NoExecute"
    return "NoSchedule"


def conditions(faults: list[Fault]) -> dict[str, tuple[str, str, str]]:
    """Every fault condition type -> (status, reason, message); healthy ones False."""
    out = {c: ("False", "NoFault", "no fault seen") for c in FAULT_CONDITIONS}
    for condition in FAULT_CONDITIONS:
        mine = [f for f in faults if f.condition == condition]
        if mine:
            mine.sort(key=lambda f: f.severity != FATAL)
            out[condition] = ("True", mine[0].reason, "; ".join(f.message for f in mine)[:1000])
    return out


# --- burn-in before readmission ---------------------------------------------------

# nccl-tests' summary line (NVIDIA/nccl-tests src/util.cu): "# Out of bounds values : 0 OK". A run is
# read only when it is there and says 0 (a wrong result is no result) and the 1 GiB row has an
# in-place busbw (nccl_in_place_busbw).
NCCL_WRONG_LINE = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<wrong>\d+)", re.M)
TIMED_OUT = 124   # run_on_host's exit status for a program it stopped at its timeout (timeout(1)'s)


def dcgm_verdict(diag: tuple[int, str] | None, level: int) -> str:
    """`dcgmi diag -r level -j` as "pass" or "fail: why": anything short of a clean pass is a fail."""
    if diag is None:
        return "fail: dcgmi is not installed on the host"
    status, output = diag
    if status == TIMED_OUT:
        return f"fail: dcgmi diag -r {level} did not finish in time"
    try:
        failed = dcgm_diag_failures(output)
    except ValueError:
        return f"fail: dcgmi diag -r {level} exit {status} without a JSON report"
    if failed:
        return "fail: " + "; ".join(failed)[:400]
    if status != 0:
        return f"fail: dcgmi diag -r {level} exit {status}"
    return "pass"


def nccl_bus_bandwidth(nccl: tuple[int, str] | None) -> tuple[float | None, str]:
    """(busbw GB/s, "") of a clean all_reduce_perf run, else (None, why not)."""
    if nccl is None:
        return None, "all_reduce_perf is not installed on the host"
    status, output = nccl
    if status == TIMED_OUT:
        return None, "all_reduce_perf did not finish in time"
    if status != 0:
        return None, f"all_reduce_perf exit {status}"
    wrong, bus = NCCL_WRONG_LINE.search(output), nccl_in_place_busbw(output)
    if wrong is None:
        return None, "all_reduce_perf printed no result summary"
    if int(wrong["wrong"]):
        return None, f"all_reduce_perf computed {wrong['wrong']} wrong values"
    if bus is None:
        return None, f"all_reduce_perf printed no in-place bus bandwidth for {NCCL_MESSAGE_BYTES} bytes"
    return bus, ""


def burn_in_verdict(diag: tuple[int, str] | None, nccl: tuple[int, str] | None, pool: dict,
                    dcgm_level: int, min_percent: float) -> dict:
    """The burn-in's result: passed only when DCGM passed AND the bus bandwidth is at least
    `min_percent` of the pool's baseline (or the cluster file's explicit minimum). Any doubt
    (a tool missing, a timeout, output that does not read) is a failure: zero false readmissions.

    `pool`: the agent config's pool (gpu_model, gpu_count, burn_in: baseline_gbps, min_bus_gbps).
    """
    settings = pool.get("burn_in") or {}
    model, gpus = pool.get("gpu_model", "GPU"), int(pool.get("gpu_count", 0))
    baseline, explicit = settings.get("baseline_gbps"), settings.get("min_bus_gbps")
    dcgm = dcgm_verdict(diag, dcgm_level)
    bus, percent, nccl_ok = None, None, False
    if gpus < 2:
        # busbw = algbw * 2(n-1)/n: an all-reduce on one GPU moves nothing over a bus.
        nccl_ok, nccl_detail = True, "one GPU: no all-reduce"
    else:
        bus, why = nccl_bus_bandwidth(nccl)
        # An explicit minimum wins, 0 included (the cluster file's "no floor: only a clean run").
        explicit = None if explicit is None else float(explicit)
        required = explicit if explicit is not None else (baseline * min_percent / 100 if baseline else None)
        if baseline:
            percent = round(bus / baseline * 100, 1) if bus is not None else None
        if required is None:
            nccl_detail = (f"no published all-reduce baseline for {gpus} x {model}: set "
                           f"health.burnIn.ncclMinBusGBps.{model} in the cluster file")
        elif bus is None:
            nccl_detail = why
        else:
            # One comparison decides, in the units the rule is written in (no rounding in it).
            nccl_ok = bus >= explicit if explicit is not None else bus * 100 >= min_percent * baseline
            if explicit == 0:
                nccl_detail = f"{bus:g} GB/s, completed (ncclMinBusGBps 0: no bandwidth floor)"
            elif explicit is not None:
                nccl_detail = f"{bus:g} GB/s, needs {explicit:g} GB/s (ncclMinBusGBps)"
            else:
                nccl_detail = (f"{bus:g} GB/s, {bus / baseline * 100:.1f}% of the {model} baseline {baseline:g} "
                               f"GB/s, needs {min_percent:g}%")
    passed = dcgm == "pass" and nccl_ok
    detail = nccl_detail if dcgm == "pass" else f"dcgmi diag -r {dcgm_level}: {dcgm[len('fail: '):]}; {nccl_detail}"
    return {"result": "passed" if passed else "failed", "dcgmLevel": dcgm_level, "dcgm": dcgm,
            "busBwGBps": bus, "baselineGBps": baseline, "percent": percent, "detail": detail[:1000]}

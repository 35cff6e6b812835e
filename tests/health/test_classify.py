"""Passive health classification over recorded kernel-log lines and tool outputs."""

from __future__ import annotations

import pytest

from corral.health import classify as c
from corral.model.schema import DEFAULT_DEGRADED_XIDS, DEFAULT_FATAL_XIDS

FATAL, DEGRADED = set(DEFAULT_FATAL_XIDS), set(DEFAULT_DEGRADED_XIDS)

KERNEL_LOG = [
    # dmesg -T, /dev/kmsg record and journal forms; new and old driver formats.
    "[Tue Nov 24 03:12:01 2026] NVRM: Xid (PCI:0000:2b:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.",
    "6,10512,88231902,-;NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
    "reset gpu to activate.",
    "Nov 24 03:12:05 gpu-001 kernel: NVRM: Xid (0000:01:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0)",
    "Nov 24 03:12:06 gpu-001 kernel: NVRM: Xid (PCI:0000:9a:00): 74, pid=2231, NVLink: fatal error detected on link 4",
    "Nov 24 03:12:07 gpu-001 kernel: NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
    "Nov 24 03:12:08 gpu-001 kernel: eth0: link up",
]


def test_xid_lines_are_parsed_in_every_format():
    events = c.xid_events(KERNEL_LOG)
    assert [(e.pci, e.code) for e in events] == [
        ("0000:2b:00", 79), ("0000:10:1c", 63), ("0000:01:00", 13), ("0000:9a:00", 74)]
    assert events[0].text.endswith("GPU has fallen off the bus.")


def test_xids_classified_by_the_cluster_file_classes():
    faults = c.xid_faults(c.xid_events(KERNEL_LOG), FATAL, DEGRADED)
    by_reason = {f.reason: f for f in faults}
    assert set(by_reason) == {"Xid79", "Xid74", "Xid63"}  # 13 is an application fault: not acted on
    assert by_reason["Xid79"].severity == c.FATAL and by_reason["Xid79"].condition == c.XID_CONDITION
    assert by_reason["Xid74"].severity == c.FATAL and by_reason["Xid74"].condition == c.NVLINK_CONDITION
    assert by_reason["Xid63"].severity == c.DEGRADED
    assert "0000:10:1c" in by_reason["Xid63"].message
    assert [f.severity for f in faults] == [c.FATAL, c.FATAL, c.DEGRADED]  # worst first
    # A site that considers Xid 13 worth a look says so in the cluster file.
    assert {f.reason for f in c.xid_faults(c.xid_events(KERNEL_LOG), FATAL, DEGRADED | {13})} >= {"Xid13"}


def test_taint_effect_follows_severity_and_policy():
    degraded_only = c.xid_faults(c.xid_events(KERNEL_LOG[1:2]), FATAL, DEGRADED)
    everything = c.xid_faults(c.xid_events(KERNEL_LOG), FATAL, DEGRADED)
    assert c.taint_effect([], evict_on_fatal=True) is None
    assert c.taint_effect(degraded_only, evict_on_fatal=True) == "NoSchedule"
    assert c.taint_effect(everything, evict_on_fatal=True) == "NoExecute"
    assert c.taint_effect(everything, evict_on_fatal=False) == "NoSchedule"


def test_pcie_aer():
    lines = [
        "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
        "pcieport 0000:16:02.0: AER: Uncorrected (Non-Fatal) error received: 0000:18:00.0",
    ]
    (fault,) = c.pcie_faults(lines)
    assert fault.condition == c.PCIE_CONDITION and fault.severity == c.DEGRADED
    (fatal,) = c.pcie_faults(lines + ["pcieport 0000:16:02.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0"])
    assert fatal.severity == c.FATAL
    assert c.pcie_faults(lines[:1]) == []


def test_memory_from_nvidia_smi():
    healthy = "0, 0, No, No, [N/A]\n1, 0, No, No, [N/A]\n"
    assert c.memory_faults(healthy) == []
    (pending,) = c.memory_faults("0, 0, No, No, [N/A]\n1, 3, Yes, No, [N/A]\n")
    assert pending.severity == c.DEGRADED and "GPU 1: 3 uncorrectable" in pending.message
    (failed,) = c.memory_faults("0, 0, No, Yes, [N/A]\n")
    assert failed.severity == c.FATAL and failed.reason == "RowRemapFailed"
    (volta,) = c.memory_faults("0, 0, [N/A], [N/A], Yes\n")  # page retirement, pre-Ampere
    assert "retired page pending" in volta.message


def test_missing_gpus():
    assert c.gpu_count_faults("0, H100\n1, H100\n", 2) == []
    (missing,) = c.gpu_count_faults("0, H100\n", 2)
    assert missing.severity == c.FATAL and "1 of 2" in missing.message
    assert c.gpu_count_faults(None, 8)[0].reason == "NvidiaSmiFailed"


def test_nvlink_status():
    status = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n"
              "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n\t Link 0: 26.562 GB/s\n")
    (fault,) = c.nvlink_faults(status)
    assert fault.message == "inactive NVLinks: GPU 0 Link 1"
    assert c.nvlink_faults(status.replace("<inactive>", "26.562 GB/s")) == []


def test_roce_links():
    links = [{"ifname": "mlx5_0", "port": 1, "state": "ACTIVE", "physical_state": "LINK_UP", "netdev": "ens1f0np0"},
             {"ifname": "mlx5_1", "port": 1, "state": "DOWN", "physical_state": "DISABLED", "netdev": "ens1f1np1"}]
    assert c.roce_faults(links, ["ens1f0np0"]) == []
    (down,) = c.roce_faults(links, ["ens1f0np0", "ens1f1np1", "ens2f0"])
    assert down.message == "ens1f1np1: DOWN/DISABLED; ens2f0: no RDMA port"
    assert c.roce_faults(None, ["ens1f0np0"])[0].reason == "RdmaUnavailable"
    assert c.roce_faults(None, []) == []


def test_conditions_cover_every_type():
    faults = c.xid_faults(c.xid_events(KERNEL_LOG), FATAL, DEGRADED)
    conds = c.conditions(faults)
    assert set(conds) == set(c.FAULT_CONDITIONS)
    assert conds[c.XID_CONDITION][:2] == ("True", "Xid79")
    assert conds[c.NVLINK_CONDITION][:2] == ("True", "Xid74")
    assert conds[c.MEMORY_CONDITION][0] == "False"


# --- NVIDIA's Xid catalog ---------------------------------------------------------


def test_the_cluster_files_default_xid_classes_are_the_catalogs():
    # The model may not import the health package, so the defaults are a copy: held equal here.
    assert c.catalog_xid_classes() == (DEFAULT_FATAL_XIDS, DEFAULT_DEGRADED_XIDS)


def test_xid_classes_follow_the_catalogs_immediate_action():
    assert c.xid_class(79) == "node-restart"                       # RESTART_BM: fallen off the bus
    for code in (48, 64, 95, 62, 46, 140):                         # RESET_GPU and WORKFLOW_XID_48
        assert c.xid_class(code) == "gpu-reset", code
    assert c.xid_class(74) == "gpu-reset"                          # WORKFLOW_NVLINK_ERR: reset or reboot
    # Xid 62 (micro-controller halt) was degraded before; the catalog says RESET_GPU.
    assert 62 in DEFAULT_FATAL_XIDS and 62 not in DEFAULT_DEGRADED_XIDS
    for code in (63, 92, 94):                                      # no new work until a reset
        assert c.xid_class(code) == "held" and code in DEFAULT_DEGRADED_XIDS
    for code in (13, 31, 43, 45, 109, 8, 999):                     # the job's own faults, and unknown codes
        assert c.xid_class(code) == "application", code
        assert code not in DEFAULT_FATAL_XIDS and code not in DEFAULT_DEGRADED_XIDS


def test_application_xids_are_not_faults():
    lines = ["6,2001,91231,-;NVRM: Xid (PCI:0000:2b:00): 13, pid=4410, name=python, Graphics SM Warp Exception",
             "6,2002,91232,-;NVRM: Xid (PCI:0000:2b:00): 31, pid=4410, name=python, Ch 00000008, intr 10000000. "
             "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1a_00000000",
             "6,2003,91233,-;NVRM: Xid (PCI:0000:2b:00): 43, pid=4410, name=python, Ch 00000008"]
    assert c.xid_faults(c.xid_events(lines), FATAL, DEGRADED) == []
    assert c.taint_effect(c.xid_faults(c.xid_events(lines), FATAL, DEGRADED), evict_on_fatal=True) is None


def test_fault_lines_are_told_from_the_rest_of_the_kernel_log():
    assert c.fault_line("4,1234,5678,-;NVRM: Xid (PCI:0000:2b:00): 79, pid=2213, GPU has fallen off the bus.")
    assert c.fault_line("3,88,99,-;pcieport 0000:16:02.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0")
    assert not c.fault_line("4,90,99,-;pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0")
    assert not c.fault_line("6,91,99,-;eth0: link up")


def test_a_record_a_process_wrote_into_the_kernel_log_is_not_a_fault():
    # dev-kmsg: userspace cannot log with the kernel's facility (0); prio = facility << 3 | level.
    forged = "12,77,900,-;NVRM: Xid (PCI:0000:2b:00): 79, pid=2213, GPU has fallen off the bus."   # LOG_USER
    real = "4,78,901,-;NVRM: Xid (PCI:0000:2b:00): 79, pid=2213, GPU has fallen off the bus."       # LOG_KERN
    assert c.from_userspace(forged) and not c.from_userspace(real)
    assert not c.fault_line(forged) and c.fault_line(real)
    assert c.kernel_lines([forged, real, "NVRM: Xid (0000:01:00): 48, saved dmesg line"]) == [
        real, "NVRM: Xid (0000:01:00): 48, saved dmesg line"]


# --- Xid 54 (a person at the machine) and Xid 154 (the driver's recovery action) -----------


def test_xid_54_holds_the_node_for_a_person_and_refuses_reset_and_reboot_alike():
    line = "6,3001,99231,-;NVRM: Xid (PCI:0000:2b:00): 54, Auxiliary power is not connected to the GPU board"
    faults = c.xid_faults(c.xid_events([line]), FATAL, DEGRADED)
    assert [(f.reason, f.severity) for f in faults] == [("Xid54", c.DEGRADED)]     # no new work; jobs go on
    assert c.xid_class(54) == "hardware" and 54 in DEFAULT_DEGRADED_XIDS
    refusal = c.reset_refusal({54})
    assert refusal and "CHECK_MECHANICALS" in refusal and "person" in refusal


@pytest.mark.parametrize(("action", "severity"), [
    ("0x1 (GPU Reset Required)", c.FATAL),
    ("0x2 (Node Reboot Required)", c.FATAL),
    ("0x2 (OS Reboot)", c.FATAL),                   # another driver's words for the same number
    ("0x3 (Drain P2P)", c.DEGRADED),
    ("0x4 (Drain and Reset)", c.DEGRADED),
    ("0x5 (GPU Reset Bus)", c.FATAL),
    ("0x9 (Something New)", c.FATAL),              # a number NVML did not have: the worst case
])
def test_xid_154_is_as_severe_as_the_recovery_it_asks_for(action, severity):
    line = f"6,3002,99232,-;NVRM: Xid (PCI:0000:2b:00): 154, GPU recovery action changed from 0x0 (None) to {action}"
    faults = c.xid_faults(c.xid_events([line]), FATAL, DEGRADED)
    assert [(f.reason, f.severity) for f in faults] == [("Xid154", severity)]
    assert "reboot" in c.reset_refusal({154})      # carried out by a reboot, whatever the action


def test_xid_154_back_to_none_is_the_recovery_done_not_a_fault():
    line = "6,3003,99233,-;NVRM: Xid (PCI:0000:2b:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    assert c.xid_faults(c.xid_events([line]), FATAL, DEGRADED) == []
    assert c.xid_class(154) == "recovery-action" and 154 in DEFAULT_FATAL_XIDS
